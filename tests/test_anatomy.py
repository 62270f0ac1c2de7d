"""Per-stage FLOPs, bytes, memory and roofline time of an iteration at any scale."""

import pytest

from rlm_course.cost.accounting import predict_iteration_flops
from rlm_course.cost.anatomy import (
    StageCost,
    Workload,
    activation_bytes,
    decode_intensity,
    memory,
    prefill_intensity,
    stage_costs,
    stage_seconds,
)
from rlm_course.cost.architectures import from_model_config, get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import preset
from rlm_course.rl.sft import default_model_config

TINY_CONFIG = default_model_config(CharTokenizer())
TINY = from_model_config(TINY_CONFIG)
LLAMA = get_spec("llama-3-8b")
H100 = get_device("H100-SXM-80GB")


@pytest.mark.parametrize("variant", ["grpo", "ppo", "rloo", "dr_grpo"])
def test_tiny_stage_flops_equal_the_tiny_model_predictor(variant):
    # the tiny predictor is itself checked against torch.utils.flop_counter (test_algorithms)
    config = preset(variant)
    work = Workload(config.prompts_per_step, config.group_size, 9, 5)
    costs = stage_costs(TINY, config, work)
    expected = predict_iteration_flops(TINY_CONFIG, config, generated=work.responses,
                                       trained=work.responses, prompt_len=9, response_len=5)
    assert costs["prefill"].flops + costs["decode"].flops == expected["generation"]
    assert costs["scoring"].flops == expected["scoring"]
    updates = sum(c.flops for s, c in costs.items() if s.endswith("update"))
    assert updates == expected["training"]
    assert ("critic update" in costs) == config.use_critic


def test_decode_is_memory_bound_and_its_intensity_grows_with_the_batch():
    # weights (2 bytes each) are read once per step for the whole batch: about 1 FLOP/B per
    # sequence (2N FLOPs per token against 2P bytes), far below the H100 ridge (~295)
    for batch in (1, 8, 64):
        intensity = decode_intensity(LLAMA, batch, context=1)
        assert 0.85 * batch < intensity < batch
    curve = [decode_intensity(LLAMA, b, 4096) for b in (1, 16, 256, 4096)]
    assert curve == sorted(curve) and curve[-1] < H100.ridge_point
    assert prefill_intensity(LLAMA, 8, 512) > H100.ridge_point  # prefill is compute-bound


def test_roofline_seconds_hand_example_and_replicas():
    cost = StageCost(flops=1.5e15, bytes=6.7e12, replica_bytes=3.35e12)
    assert cost.seconds(H100) == pytest.approx(2.0)  # 6.7 TB at 3.35 TB/s beats 1.5 PF at 0.99 PF/s
    # 8 devices as 8 replicas read the weights 8 times: 6.7 + 7 x 3.35 TB over 8 x 3.35 TB/s
    assert cost.seconds(H100, 8, tp=1) == pytest.approx((6.7e12 + 7 * 3.35e12) / (8 * 3.35e12))
    assert cost.seconds(H100, 8, tp=8) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="tp=3"):
        cost.seconds(H100, 8, tp=3)
    with pytest.raises(ValueError, match="devices=0"):
        cost.seconds(H100, 0)


def test_generation_takes_a_larger_share_of_time_than_of_flops_for_an_8b_policy():
    config = preset("grpo", group_size=16, prompts_per_step=512, minibatches=16)
    costs = stage_costs(LLAMA, config, Workload(512, 16, 512, 4096))
    flops = sum(c.flops for s, c in costs.items() if s in ("prefill", "decode"))
    seconds = stage_seconds(costs, H100, devices=64)
    gen_time = seconds["prefill"] + seconds["decode"]
    assert gen_time / sum(seconds.values()) > 2 * flops / sum(c.flops for c in costs.values())


def test_memory_breakdown():
    work = Workload(512, 1, 512, 4096, micro_batch=4)
    ppo = memory(LLAMA, preset("ppo"), work)
    assert ppo["policy states"] == ppo["critic states"] == 16 * LLAMA.params()
    assert ppo["reference weights"] == 2 * LLAMA.params()
    assert ppo["kv cache"] == 512 * 4608 * 128 * 1024
    assert "critic states" not in memory(LLAMA, preset("dapo"), work)
    assert "reference weights" not in memory(LLAMA, preset("dapo"), work)
    # full recomputation keeps only each layer's input: 2 s b h bytes per layer
    assert activation_bytes(LLAMA, 4, 4608, True) == 32 * 2 * 4608 * 4 * 4096
    assert activation_bytes(LLAMA, 4, 4608, False) == 17 * activation_bytes(LLAMA, 4, 4608, True)
    with_scores = activation_bytes(LLAMA, 4, 4608, False, flash_attention=False)
    assert with_scores - activation_bytes(LLAMA, 4, 4608, False) == 32 * 5 * 32 * 4608**2 * 4


@pytest.mark.parametrize("kw,match", [(dict(prompts=0), "prompts=0"),
                                      (dict(response_len=-5), "response_len=-5"),
                                      (dict(micro_batch=0), "micro_batch=0")])
def test_bad_workload(kw, match):
    base = dict(prompts=8, group_size=4, prompt_len=16, response_len=32)
    with pytest.raises(ValueError, match=match):
        Workload(**{**base, **kw})
