"""``gpu-check``: a clear exit without CUDA, and its checks' code paths on the CPU (the device
they compare with the CPU passed explicitly: the same device must agree exactly)."""

import json

import pytest
import torch

from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.runs import default_sft_checkpoint, load_sft_policy
from rlm_course.tasks import get_task
from rlm_course.tools import gpu_check

TASK = get_task("addition")


@pytest.fixture(scope="module")
def policy():
    return load_sft_policy(TASK, CharTokenizer(), default_sft_checkpoint(TASK), progress=False,
                           log=lambda *a: None)[0]


def test_without_cuda_it_says_why_and_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main() == 2
    out, err = capsys.readouterr()
    last = json.loads(out.strip().splitlines()[-1])
    assert last["cuda"] is False and last["passed"] is False
    assert "torch.cuda.is_available() is False" in err and "CUDA build of torch" in err


def test_the_forward_backward_check_compares_log_probs_and_gradients(policy):
    result = gpu_check.check_forward_backward(policy, TASK, CharTokenizer(), device="cpu")
    # the same device twice: the same numbers, and a tolerance of fp32 rounding over the sums
    assert result["passed"] and result["log_prob_error"] == 0.0 and result["grad_error"] == 0.0
    assert 1e-6 < result["tolerance"] < 1e-2


def test_the_step_check_compares_one_float64_update(policy):
    result = gpu_check.check_grpo_step(policy, TASK, CharTokenizer(), device="cpu")
    assert result["passed"] and result["param_error"] == 0.0 and 0 < result["tolerance"] < 1e-6
    assert result["grad_error"] == 0.0 and result["worst_parameter_grad_difference"] == 0.0
    assert result["worst_parameter"] in dict(policy.named_parameters())


def test_the_strategies_check_says_what_it_skips_with_one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "1 GPU visible" in gpu_check.check_strategies()["skipped"]


def test_the_catalog_device_of_a_cuda_name():
    from rlm_course.cost.hardware import catalog_device_for

    assert catalog_device_for("NVIDIA H200").name == "H200-SXM-141GB"
    assert catalog_device_for("NVIDIA A100-SXM4-80GB").name == "A100-SXM-80GB"
    assert catalog_device_for("NVIDIA H20").name == "H20-96GB"          # not the H200
    assert catalog_device_for("NVIDIA GB200").name == "GB200-NVL72-186GB"  # not the B200
    assert catalog_device_for("NVIDIA GeForce RTX 4090") is None


@pytest.mark.cuda
def test_gpu_check_passes_on_this_gpu():
    assert gpu_check.main() == 0
