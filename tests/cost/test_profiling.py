"""Measured per-stage FLOPs of real tiny steps against the predictor, and the roofline points."""

import sys
from contextlib import nullcontext

import pytest
import torch

from rlm_course.cost.accounting import predict_iteration_flops, predict_passes
from rlm_course.cost.profiling import (
    attention_by_key_length,
    measure_step,
    roofline_points,
)
from rlm_course.lm.model import TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import preset
from rlm_course.rl.runs import load_sft_policy
from rlm_course.rl.sft import default_model_config
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

TASK, TOK = get_task("addition", digits=3), CharTokenizer()


@pytest.mark.parametrize("variant", ["grpo", "ppo", "rloo"])
def test_predicted_stage_flops_match_the_flop_counter(variant):
    policy, _ = load_sft_policy(TASK, TOK, progress=False)
    prompts = 8 if preset(variant).group_size > 1 else 32
    trainer = RLTrainer(policy, TASK, TOK, preset(variant, prompts_per_step=prompts,
                                                  eval_every=1000), load_eval_set(TASK)[:10])
    row = measure_step(trainer)
    for stage in ("generation", "scoring"):  # forward passes: exact
        assert row["measured_flops"][stage] == row["predicted_flops"][stage], stage
    # training: a backward is 2x its forward to within 0.5%
    assert row["measured_flops"]["training"] == pytest.approx(row["predicted_flops"]["training"],
                                                              rel=0.005)
    assert trainer.timer.current is None and trainer.step_count == 1


def test_roofline_points_decode_is_less_intense_than_prefill():
    policy, _ = load_sft_policy(TASK, TOK, progress=False)
    points = roofline_points(policy, batches=(1, 8, 64), repeats=2)
    by = {(p["kind"], p["batch"]): p for p in points}
    for batch in (1, 8, 64):
        assert by[("decode", batch)]["intensity"] < by[("prefill", batch)]["intensity"]
        assert by[("decode", batch)]["flops_per_s"] > 0
    intensities = [by[("decode", b)]["intensity"] for b in (1, 8, 64)]
    assert intensities == sorted(intensities)  # weights are shared by the batch


def test_attention_by_key_length_times_each_length_and_refuses_bad_input():
    rows = attention_by_key_length([14, 16], batch=4, repeats=1)
    assert [r["length"] for r in rows] == [14, 16]
    assert all(r["sdpa_seconds"] > 0 and r["padded_seconds"] > 0 for r in rows)
    for bad, name in (({"lengths": []}, "lengths"), ({"lengths": [0, 4]}, "length=0"),
                      ({"lengths": [8.5]}, "length=8.5"), ({"lengths": [True]}, "length=True"),
                      ({"lengths": 8}, "lengths=8"), ({"lengths": ["8"]}, "length='8'"),
                      ({"batch": 0}, "batch=0"), ({"n_head": 2.0}, "n_head=2.0"),
                      ({"d_head": -1}, "d_head=-1"), ({"repeats": 0}, "repeats=0")):
        with pytest.raises(ValueError, match=f"attention_by_key_length: {name}"):
            attention_by_key_length(**{"lengths": [8], **bad})


def test_padded_keys_add_exactly_the_padding_to_the_prediction():
    """9 prompt + 5 response columns: the CPU kernel scores 16 keys per query instead of 14."""
    config = preset("grpo")
    model_config = default_model_config(TOK, TASK)
    kw = {"generated": 64, "trained": 64, "prompt_len": 9, "response_len": 5}
    plain = predict_iteration_flops(model_config, config, **kw)
    padded = predict_iteration_flops(model_config, config, padded_keys=True, **kw)
    assert padded["generation"] == plain["generation"]  # the decode path is not padded
    one_forward = 64 * 4 * model_config.n_layer * model_config.d_model * 14 * (16 - 14)
    passes = predict_passes(config)
    forwards = sum(p["forward"] for p in passes["scoring"].values())
    assert padded["scoring"] - plain["scoring"] == forwards * one_forward


def test_bench_peer_without_the_extra_says_how_to_install(monkeypatch):
    from rlm_course.tools.peer import require_peer

    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError
    message = r"trl(, datasets)?, which are not installed.*\.venv/bin/pip install -e \"\.\[peer\]\""
    with pytest.raises(ValueError, match=message):
        require_peer()


def test_peer_model_has_the_course_model_sizes():
    """GPT-2 ties its head to the token embedding: one vocab x d_model matrix fewer."""
    pytest.importorskip("transformers")
    from rlm_course.tools.peer import hf_model

    config = default_model_config(TOK, TASK)
    ours = TinyGPT(config).num_parameters()
    theirs = sum(p.numel() for p in hf_model(config).parameters())
    assert theirs == ours - config.vocab_size * config.d_model


def test_bench_peer_gives_both_ratios_per_thread_count_and_restores_the_threads(monkeypatch):
    from rlm_course.tools import bench, peer

    seen = []

    def fake(repeats, new_tokens):  # one run at the thread count bench_peer set
        n = torch.get_num_threads()
        seen.append(n)
        return {"threads": n, "generation_speedup_vs_transformers": 1.5 * n,
                "grpo_step_speedup_vs_trl": 0.5 + n}

    monkeypatch.setattr(peer, "require_peer", lambda: None)  # runs without the peer extra
    monkeypatch.setattr(peer, "quiet_peer", nullcontext)
    monkeypatch.setattr(bench, "_bench_peer", fake)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    before = torch.get_num_threads()
    result = bench.bench_peer(repeats=5)
    assert seen == [1, 2] and torch.get_num_threads() == before
    assert result["threads"] == [1, 2] and result["repeats"] == 5
    assert result["generation_ratio"] == {"1": 1.5, "2": 3.0}
    assert result["grpo_step_ratio"] == {"1": 1.5, "2": 2.5}
    assert result["by_threads"]["2"]["threads"] == 2
    monkeypatch.setattr("os.cpu_count", lambda: 1)  # a one-core machine compares at 1 thread
    assert bench.bench_peer()["threads"] == [1] and seen[-1] == 1
