"""The device plumbing of the RL programs, tested on the CPU through the code paths a GPU takes.

Every tensor a step makes must be made on the model's device. Here the device is the CPU, passed
explicitly, while torch's *default* device is ``meta`` (tensors without data): a tensor made
without ``device=`` lands on ``meta``, and the first operation that mixes it with the model's
tensors fails, as a CPU tensor would fail next to CUDA weights.
"""

from contextlib import contextmanager

import pytest
import torch

from rlm_course.algorithms import preset
from rlm_course.devices import (DEVICE_CHOICES, generator_on, module_device,
                                peak_device_memory_bytes, resolve_device)
from rlm_course.lm.checkpoint import load_checkpoint, save_checkpoint
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.runs import default_sft_checkpoint, run_rl
from rlm_course.rl.sft import SFTConfig, run_sft
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

TASK = get_task("addition", digits=3)


@contextmanager
def default_device_meta():
    """Make ``meta`` torch's default device; AdamW's own step counter (``torch.tensor(0.0)`` in
    torch's code, not ours) is made on the CPU."""
    step = torch.optim.AdamW.step

    def cpu_step(self, *args, **kwargs):
        with torch.device("cpu"):
            return step(self, *args, **kwargs)

    torch.optim.AdamW.step = cpu_step
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.optim.AdamW.step = step


def test_the_guard_catches_a_tensor_made_without_a_device():
    weights = torch.ones(3)
    with default_device_meta(), pytest.raises(RuntimeError, match="meta"):
        weights + torch.zeros(3)  # what a forgotten device= does next to the model's tensors


def _policy():
    return load_checkpoint(default_sft_checkpoint(TASK))["model"]


@pytest.mark.parametrize("variant,options", [
    ("grpo", {}),                                             # reference + KL loss
    ("ppo", {}),                                              # critic, GAE, KL in the reward
    ("dapo", {"max_sampling_rounds": 2}),                     # dynamic sampling, overlong penalty
    ("reinforce_pp", {}),                                     # per-token rewards
    ("grpo", {"rollout_precision": "bf16", "correction": "tis"}),  # rounded engine, correction
])
def test_a_training_step_makes_every_tensor_on_the_models_device(variant, options):
    policy = _policy()
    config = preset(variant, prompts_per_step=4, group_size=4, steps=2, eval_every=2,
                    minibatches=2, **options)
    problems = load_eval_set(TASK)[:8]
    with default_device_meta():
        trainer = RLTrainer(policy, TASK, CharTokenizer(), config, problems)
        assert trainer.device == torch.device("cpu")
        rows = [trainer.step(), trainer.step()]
    assert rows[1]["step"] == 2 and "accuracy_eval" in rows[1]
    assert all(p.device.type == "cpu" for p in trainer.policy.parameters())


def test_sft_and_evaluation_make_their_tensors_on_the_device():
    config = SFTConfig(max_steps=2, eval_every=1, batch_size=8, n_validation=8)
    with default_device_meta():
        model, info = run_sft(TASK, CharTokenizer(), config, progress=False, device="cpu")
        result = evaluate(model, TASK, load_eval_set(TASK)[:8], CharTokenizer())
    assert info["sft_steps"] == 2 and module_device(model) == torch.device("cpu")
    assert len(result.responses) == 8


def test_a_whole_run_on_an_explicit_device_records_it(tmp_path):
    config = preset("grpo", prompts_per_step=4, group_size=4, steps=2, eval_every=2)
    with default_device_meta():
        summary = run_rl(TASK, config, name="dev", out_dir=tmp_path, progress=False,
                         log=lambda *a: None, device="cpu")
    assert summary["device"] == "cpu"
    state = load_checkpoint(tmp_path / "dev" / "checkpoint.pt")
    assert state["device"] == "cpu"
    assert "peak_device_memory" not in summary["cost"]["memory_bytes"]


def test_resuming_on_another_device_says_the_numbers_will_differ(tmp_path):
    config = preset("grpo", prompts_per_step=4, group_size=4, steps=1, eval_every=1)
    run_rl(TASK, config, name="dev", out_dir=tmp_path, progress=False, log=lambda *a: None,
           device="cpu")
    path = tmp_path / "dev" / "checkpoint.pt"
    state = load_checkpoint(path)
    state["device"] = "cuda"  # as a GPU run writes it
    extra = {k: v for k, v in state.items() if k not in ("format", "model_config", "state_dict",
                                                         "model")}
    save_checkpoint(path, state["model"], **extra)
    messages = []
    summary = run_rl(TASK, preset("grpo", prompts_per_step=4, group_size=4, steps=2, eval_every=1),
                     name="dev", out_dir=tmp_path, resume=True, progress=False,
                     log=messages.append, device="cpu")
    assert summary["steps"] == 2
    assert any("ran on cuda, this process on cpu" in m and "--device cuda" in m for m in messages)


def test_device_names_are_checked():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="--device 'tpu': choose one of auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA GPU here"):
            resolve_device("cuda")
    assert peak_device_memory_bytes("cpu") is None
    with pytest.raises(ValueError, match="has no parameters"):
        module_device(torch.nn.ReLU())


def test_the_command_line_offers_the_devices_of_the_package():
    from rlm_course.cli import build_parser

    parser = build_parser()
    for command in (["grpo", "--task", "addition"], ["ppo", "--task", "addition"],
                    ["sft", "--task", "addition"], ["eval", "--task", "addition",
                                                    "--checkpoint", "x"]):
        assert parser.parse_args(command).device == "auto"
        with pytest.raises(SystemExit):
            parser.parse_args(command + ["--device", "tpu"])
    assert parser.parse_args(["grpo", "--task", "addition", "--device", "cpu"]).device == "cpu"
    assert DEVICE_CHOICES == ("auto", "cpu", "cuda")


def test_generators_are_made_on_the_device_and_seeded():
    a, b = generator_on("cpu", 7), torch.Generator().manual_seed(7)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
    assert a.device == torch.device("cpu")


@pytest.mark.cuda
def test_a_step_on_the_gpu_matches_the_cpu_step_within_tolerance():
    """On a GPU machine: the same scoring pass on CUDA and on the CPU agree within fp32 rounding
    (different kernels add in another order), and a step runs there."""
    policy = _policy()
    config = preset("grpo", prompts_per_step=4, group_size=4, steps=1, eval_every=1)
    trainer = RLTrainer(policy.to("cuda"), TASK, CharTokenizer(), config, load_eval_set(TASK)[:8])
    row = trainer.step()
    assert row["step"] == 1 and trainer.device.type == "cuda"


def test_a_partial_rollout_and_its_batch_are_made_on_the_device():
    from rlm_course.systems.async_rl import PartialRollout

    policy = _policy()
    config = preset("grpo", prompts_per_step=4, group_size=4, steps=1)
    with default_device_meta():
        trainer = RLTrainer(policy, TASK, CharTokenizer(), config, [])
        partial = PartialRollout(trainer, 1)
        while not partial.done:
            partial.advance(policy, 0, 3)  # interrupted every 3 tokens, re-prefilled each time
        batch = partial.batch()
        row = trainer.step(batch)
    assert batch.rollout.tokens.device.type == "cpu" and batch.versions.max() == 0
    assert row["step"] == 1


def test_a_batch_moves_to_a_device_whole():
    policy = _policy()
    trainer = RLTrainer(policy, TASK, CharTokenizer(),
                        preset("grpo", prompts_per_step=2, group_size=4), [])
    batch = trainer.collect(1)
    moved = batch.to("cpu")
    for name in ("tokens", "attention_mask", "response_mask", "log_probs"):
        assert torch.equal(getattr(moved.rollout, name), getattr(batch.rollout, name))
    assert torch.equal(moved.rewards, batch.rewards) and moved.verdicts == batch.verdicts
    assert moved.versions is None and moved.rollout.prompt_len == batch.rollout.prompt_len
