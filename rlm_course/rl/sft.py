"""Supervised warm start (SFT): teach the format and a little skill from demonstrations.

RL with verifiable rewards needs a policy that sometimes succeeds: a group whose G responses all
score 0 has zero advantage and teaches nothing. DeepSeek-R1 starts RL from a "cold-start" SFT
model for the same reason (arXiv:2501.12948, section 2.3.1). Here SFT stops as soon as greedy
accuracy on a *validation* set (not the held-out evaluation set) reaches ``target_accuracy``,
leaving a policy that is weak but not hopeless.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.evaluate import evaluate
from rlm_course.tasks.base import Task
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.utils import derived_seed, seed_everything

VALIDATION_SEED = 4321


@dataclass
class SFTConfig:
    seed: int = 0
    batch_size: int = 128
    lr: float = 1e-3
    max_steps: int = 4000
    target_accuracy: float = 0.2   # stop once validation accuracy reaches this
    eval_every: int = 25
    n_validation: int = 200

    def __post_init__(self) -> None:
        if self.max_steps <= 0 or self.batch_size <= 0 or self.eval_every <= 0:
            raise ValueError(f"SFTConfig: max_steps={self.max_steps}, batch_size={self.batch_size}, "
                             f"eval_every={self.eval_every} must be positive.")
        if not 0.0 < self.target_accuracy <= 1.0:
            raise ValueError(f"SFTConfig: target_accuracy={self.target_accuracy} must be in (0, 1].")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**63):  # as RLConfig's seed
            raise ValueError(f"SFTConfig: seed={self.seed} (--seed) must be a whole number in "
                             "[0, 2**63), e.g. 0.")


def default_model_config(tokenizer: CharTokenizer, task: Task | None = None) -> ModelConfig:
    """The course's tiny model: 4 layers, width 128, 4 heads, 32 positions (about 0.8M params),
    with the changes ``task`` needs (:meth:`rlm_course.tasks.base.Task.model_overrides`, e.g. more
    positions for the long traces of the scratchpad task); the tasks that fit 32 positions keep
    exactly this model, and their checkpoints."""
    sizes = dict(n_layer=4, n_head=4, d_model=128, max_seq_len=32)
    if task is not None:
        sizes.update(task.model_overrides())
    return ModelConfig(vocab_size=tokenizer.vocab_size, **sizes)


def demonstration_batch(task: Task, tokenizer: CharTokenizer, problems,
                        device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """``(tokens, attention_mask, loss_mask)``, each ``(batch, seq)`` on ``device``:
    ``<bos> prompt answer <eos>`` right-padded; ``loss_mask`` marks the positions whose *next*
    token is part of the answer."""
    rows, prompt_lens = [], []
    for p in problems:
        prompt = tokenizer.encode(p.prompt, bos=True)
        rows.append(prompt + tokenizer.encode(task.demonstration(p), eos=True))
        prompt_lens.append(len(prompt))
    width = max(len(r) for r in rows)
    padded = [r + [tokenizer.pad_id] * (width - len(r)) for r in rows]
    answer = [[pl - 1 <= j < len(r) - 1 for j in range(width)] for r, pl in zip(rows, prompt_lens)]
    tokens = torch.tensor(padded, dtype=torch.long, device=device)
    loss_mask = torch.tensor(answer, dtype=torch.bool, device=device)
    return tokens, tokens != tokenizer.pad_id, loss_mask


def sft_loss(model: TinyGPT, tokens, attention_mask, loss_mask) -> torch.Tensor:
    """Mean next-token cross-entropy over answer tokens (prompt tokens are not trained on)."""
    logits = model(tokens, attention_mask)[:, :-1]
    targets = tokens[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    mask = loss_mask[:, :-1].reshape(-1).float()
    return (ce * mask).sum() / mask.sum()


def run_sft(task: Task, tokenizer: CharTokenizer, config: SFTConfig | None = None,
            model_config: ModelConfig | None = None, progress: bool = True,
            device: torch.device | str = "cpu") -> tuple[TinyGPT, dict]:
    """Train a fresh :class:`TinyGPT` on demonstrations, on ``device``, until validation accuracy
    reaches the target. The weights are initialised on the CPU (the same initial model on every
    device), then moved.

    Returns:
        ``(model, info)`` with ``info``: steps taken, validation accuracy, the config.
    """
    config = config or SFTConfig()
    seed_everything(config.seed)
    with torch.device("cpu"):
        model = TinyGPT(model_config or default_model_config(tokenizer, task))
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    held_out = {p.prompt for p in load_eval_set(task)}
    validation = task.problems(config.n_validation, VALIDATION_SEED, exclude=held_out)
    exclude = held_out | {p.prompt for p in validation}
    accuracy, step = 0.0, 0
    bar = tqdm(range(1, config.max_steps + 1), desc=f"SFT {task.key}", disable=not progress)
    for step in bar:
        problems = task.problems(config.batch_size, derived_seed(config.seed, step), exclude)
        loss = sft_loss(model, *demonstration_batch(task, tokenizer, problems, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % config.eval_every == 0:
            accuracy = evaluate(model, task, validation, tokenizer).accuracy
            bar.set_postfix(loss=f"{loss.item():.3f}", val_acc=f"{accuracy:.2f}")
            if accuracy >= config.target_accuracy:
                break
    bar.close()
    model.eval()
    return model, {"sft_steps": step, "validation_accuracy": accuracy, "sft_config": asdict(config)}
