"""Greedy held-out accuracy of a policy on a task."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlm_course.devices import module_device
from rlm_course.lm.model import TinyGPT
from rlm_course.lm.sampling import generate
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.tasks.base import Problem, Task


@dataclass
class EvalResult:
    accuracy: float      # share of problems answered correctly
    format_rate: float   # share of responses with a valid format
    mean_reward: float
    responses: list[str]


@torch.no_grad()
def evaluate(model: TinyGPT, task: Task, problems: list[Problem], tokenizer: CharTokenizer,
             batch_size: int = 256) -> EvalResult:
    """Greedy-decode every problem (on the model's device) and verify it. Deterministic (no
    sampling)."""
    device = module_device(model)
    responses, correct, formatted, rewards = [], 0, 0, 0.0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        tokens, mask = tokenizer.encode_prompts([p.prompt for p in chunk], device)
        rollout = generate(model, tokens, mask, task.max_response_len, tokenizer.eos_id,
                           tokenizer.pad_id, greedy=True)
        for p, row in zip(chunk, rollout.responses):
            text = tokenizer.decode_response(row)
            verdict = task.verify(p, text)
            responses.append(text)
            correct += verdict.correct
            formatted += verdict.format_ok
            rewards += verdict.reward
    n = max(len(problems), 1)
    return EvalResult(correct / n, formatted / n, rewards / n, responses)
