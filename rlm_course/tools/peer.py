"""The course's loop side by side with the libraries learners use: Hugging Face ``transformers``'
``generate`` and TRL's ``GRPOTrainer``, on the same tiny configuration (``bench peer``).

Both sides get the same architecture (a GPT-2-style decoder: 4 layers, width 128, 4 heads, exact
GELU, learned positions, the course's 24-token character vocabulary), the same prompts, the same
number of samples and new tokens, no reference model, one optimizer step per batch and the same
thread count; the peer models are built locally (nothing is downloaded). The peer libraries are an
optional extra: ``pip install -e ".[peer]"``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from contextlib import contextmanager

from rlm_course.lm.model import ModelConfig
from rlm_course.lm.tokenizer import CharTokenizer

PEER_PACKAGES = ("transformers", "trl", "datasets")


def require_peer() -> None:
    """Raise ``ValueError`` naming the install command unless the peer libraries import."""
    missing = []
    for name in PEER_PACKAGES:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ValueError(f"bench peer compares with {', '.join(missing)}, which are not installed; "
                         "install the optional extra into the course's environment with "
                         "`.venv/bin/pip install -e \".[peer]\"` (or `pip install -e \".[peer]\"` "
                         "in the environment you run the course from) and run it again.")


@contextmanager
def quiet_peer():
    """Silence, for the span of the bench, what the peer libraries print about their own
    internals: transformers' deprecation notices for names TRL still uses
    (``is_gradient_checkpointing``), and its advice to pass an ``attention_mask``, which it gives
    when an untrained model samples the pad token inside TRL's ``generate`` (the mask is there;
    its heuristic looks at the token ids). Errors and exceptions are not silenced."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def hf_tokenizer(tok: CharTokenizer):
    """A ``PreTrainedTokenizerFast`` with the course's vocabulary: one token per character, the
    same ids, ``<pad>``/``<bos>``/``<eos>`` as specials, left padding (for generation)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({s: i for i, s in enumerate(tok.itos)}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", padding_side="left")


def hf_model(config: ModelConfig):
    """A ``GPT2LMHeadModel`` of the same sizes as ``TinyGPT(config)`` (exact GELU, untied head is
    the one difference GPT-2 does not allow: its head is tied to the token embedding, which saves
    ``vocab x d_model`` parameters and changes no FLOP count that matters here)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = CharTokenizer()
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.max_seq_len, n_embd=config.d_model,
        n_layer=config.n_layer, n_head=config.n_head, n_inner=config.mlp_ratio * config.d_model,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)).eval()


def hf_generate(model, prompt_tokens, prompt_mask, new_tokens: int, seed: int):
    """Sample exactly ``new_tokens`` tokens per prompt with the KV cache (``generate`` with
    ``min_new_tokens = max_new_tokens``), as the course's side does with an end token that never
    matches."""
    import torch

    torch.manual_seed(seed)
    return model.generate(input_ids=prompt_tokens, attention_mask=prompt_mask.long(),
                          do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          use_cache=True, pad_token_id=CharTokenizer().pad_id, top_k=0, top_p=1.0,
                          temperature=1.0)


class TRLSteps:
    """TRL's ``GRPOTrainer`` on a task, timed step by step.

    ``run(steps, between)`` trains ``steps`` GRPO steps and returns each step's seconds (from the
    trainer's ``on_step_begin`` to ``on_step_end``); ``between()`` runs after each step, outside
    the timed span (the bench runs the course's steps there, so that the two alternate).
    """

    def __init__(self, task, config: ModelConfig, prompts_per_step: int, group_size: int,
                 lr: float, seed: int = 0) -> None:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        tok = CharTokenizer()
        self.task, self.tok = task, tok
        problems = task.problems(4096, seed=seed)
        self.by_prompt = {p.prompt: p for p in problems}
        self.dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems]})
        self.model = hf_model(config)
        # TRL's defaults are bf16 autocast and activation checkpointing; the course trains in fp32
        # without recomputation, so compare like with like (transformers 5 renamed the option)
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        checkpointing = ("activation_checkpointing" if "activation_checkpointing" in names
                         else "gradient_checkpointing")
        self.args = dict(per_device_train_batch_size=prompts_per_step * group_size,
                         num_generations=group_size,
                         max_completion_length=task.max_response_len, beta=0.0, num_iterations=1,
                         learning_rate=lr, logging_steps=10**6, report_to=[], save_strategy="no",
                         disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, seed=seed,
                         temperature=1.0, output_dir=os.path.join("runs", "peer-trl"),
                         bf16=False, **{checkpointing: False})
        self.GRPOConfig, self.GRPOTrainer = GRPOConfig, GRPOTrainer

    def reward(self, prompts, completions, **kwargs) -> list[float]:
        return [self.task.verify(self.by_prompt[p], c).reward for p, c in zip(prompts, completions)]

    def run(self, steps: int, between=None) -> list[float]:
        from transformers import PrinterCallback, TrainerCallback

        times: list[float] = []

        class Timer(TrainerCallback):
            def on_step_begin(self, *args, **kwargs):
                self.start = time.perf_counter()

            def on_step_end(self, *args, **kwargs):
                times.append(time.perf_counter() - self.start)
                if between is not None:
                    between()

        trainer = self.GRPOTrainer(model=self.model, reward_funcs=self.reward,
                                   args=self.GRPOConfig(max_steps=steps, **self.args),
                                   train_dataset=self.dataset, processing_class=hf_tokenizer(self.tok),
                                   callbacks=[Timer()])
        trainer.remove_callback(PrinterCallback)  # its end-of-training dict is not this bench's
        trainer.train()
        return times
