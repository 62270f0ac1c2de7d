"""Architectures as numbers, checked against published figures (data/published/figures.json)
and against the course's own model."""

import json

import pytest

from rlm_course.cost.architectures import SPECS, TransformerSpec, from_model_config, get_spec
from rlm_course.cost.layouts import Layout
from rlm_course.lm.model import ModelConfig, TinyGPT, forward_flops, matmul_parameters
from rlm_course.utils import data_dir

FIGURES = json.loads((data_dir() / "published" / "figures.json").read_text())["figures"]


def _value(figure):
    model = figure["model"]
    if figure["what"] == "parameters":
        return get_spec(model).params()
    if figure["what"] == "active_parameters":
        return get_spec(model).params(active=True)
    if figure["what"] == "kv_cache_bytes_per_token_bf16":
        return get_spec(model).kv_cache_bytes_per_token(2)
    if figure["what"] == "training_flops_per_token_over_params":
        spec = get_spec(model)
        return 3 * spec.forward_flops_per_token(context=128) / spec.matmul_params()
    if figure["what"].startswith("zero_stage"):
        from rlm_course.cost.anatomy import zero_model_state_bytes

        return zero_model_state_bytes(int(7.5e9), dp=64, stage=int(figure["what"][10]))
    if figure["what"] == "adam_mixed_precision_bytes_per_param":
        return 2 + 2 + 3 * 4  # bf16 weights and gradients, fp32 master weights and two moments
    raise AssertionError(f"no check for {figure['what']}")


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f"{f['what']}-{f['model']}")
def test_published_figures_are_reproduced(figure):
    assert figure["source"]
    assert _value(figure) == pytest.approx(figure["value"], rel=figure.get("rel", 0))


@pytest.mark.parametrize("kw", [dict(n_layer=2, d_model=64, n_head=4), dict(n_layer=3, d_model=48,
                                                                           n_head=6, max_seq_len=20)])
def test_tiny_model_spec_counts_its_parameters_and_flops_exactly(kw):
    config = ModelConfig(vocab_size=24, **kw)
    spec = from_model_config(config)
    assert spec.params() == TinyGPT(config).num_parameters()
    assert spec.matmul_params() == matmul_parameters(config)
    # one decoding token at context c costs what the model's own formula says
    assert spec.forward_flops_per_token(7) == forward_flops(config, 1, context_len=7)


def test_gqa_and_mqa_shrink_only_the_kv_cache_and_kv_projections():
    mha = TransformerSpec("mha", n_layer=2, d_model=64, n_head=8, d_ff=128, vocab_size=10)
    gqa = TransformerSpec("gqa", n_layer=2, d_model=64, n_head=8, n_kv_head=2, d_ff=128,
                          vocab_size=10)
    mqa = TransformerSpec("mqa", n_layer=2, d_model=64, n_head=8, n_kv_head=1, d_ff=128,
                          vocab_size=10)
    assert [s.kv_cache_bytes_per_token() for s in (mha, gqa, mqa)] == [512, 128, 64]  # 2 x 2 layers x heads x 8 x 2 bytes
    # k and v projections: 2 x 64 x (heads_kv x 8) per layer
    assert mha.params() - gqa.params() == 2 * 2 * 64 * (64 - 16)
    assert gqa.forward_flops_per_token(10) - mqa.forward_flops_per_token(10) == 2 * 2 * 2 * 64 * 8


@pytest.mark.parametrize("kw,match", [
    (dict(n_head=7), "n_head=7 does not divide d_model=64"),
    (dict(n_kv_head=3), "n_kv_head=3 must divide n_head=8"),
    (dict(n_experts=4, experts_per_token=5), "experts_per_token=5 exceeds n_experts=4"),
    (dict(n_layer=0), "n_layer=0"),
    (dict(max_context=0), "max_context=0"),
    (dict(n_layer=True), r"n_layer=True must be a positive integer"),
    (dict(n_shared_experts=1.5), r"n_shared_experts=1.5 must be an integer >= 0"),
    (dict(learned_positions=-1), r"learned_positions=-1 must be an integer >= 0"),
    (dict(norm_params_per_layer=float("nan")), r"norm_params_per_layer=nan must be an integer"),
])
def test_inconsistent_specs_raise(kw, match):
    base = dict(name="x", n_layer=2, d_model=64, n_head=8, d_ff=128, vocab_size=10)
    with pytest.raises(ValueError, match=match):
        TransformerSpec(**{**base, **kw})
    with pytest.raises(ValueError, match="unknown architecture"):
        get_spec("gpt-5")
    assert all(s.source for s in SPECS.values())
    # Hugging Face's spelling of a name is the catalog's architecture
    assert get_spec("Qwen2.5-7B") is get_spec("qwen2.5-7b")
    assert get_spec("DeepSeek-V3") is SPECS["deepseek-v3"]


def test_a_budget_past_the_context_window_is_refused_with_the_room_left():
    llama3, llama31 = get_spec("llama-3-70b"), get_spec("llama-3.1-70b")
    # the same architecture: Llama 3.1 only reads further (config.json max_position_embeddings)
    assert llama3.params() == llama31.params() and llama3.flop_terms == llama31.flop_terms
    assert (llama3.max_context, llama31.max_context) == (8192, 131072)
    llama3.check_context(512, 8192 - 512)  # exactly the window: fine
    with pytest.raises(ValueError, match=r"llama-3-70b reads at most 8,192 tokens .* 512 plus a "
                                         r"response budget of 16,384 is 16,896: lower the "
                                         r"response budget to at most 7,680 tokens, or choose .*"
                                         r"llama-3.1-70b, 131,072 tokens"):
        llama3.check_context(512, 16384)
    with pytest.raises(ValueError, match=r"shorten --prompt-len to leave room for the "
                                         r"responses within 8,192 tokens"):
        llama3.check_context(9000, 100, lambda key: "--" + key.replace("_", "-"))
    # a longer-window model is suggested only within 4x of the parameters: none for a 7.6B model
    # past 131,072 tokens (deepseek-v3 reads further, 90x larger)
    with pytest.raises(ValueError, match=r"at most 130,816 tokens\.$"):
        get_spec("qwen2.5-7b").check_context(256, 130_817)
    for bad in ((512, -5), (-5, 8000), (512, 1.5), (512, True), (512, "8")):
        with pytest.raises(ValueError, match="must be a whole number of tokens >= 0"):
            llama3.check_context(*bad)
    # no catalog model reads 200k tokens: only the budget to lower
    with pytest.raises(ValueError, match=r"at most 163,328 tokens\.$"):
        get_spec("deepseek-v3").check_context(512, 200_000)
    # a spec without a window (a custom one) is not limited
    TransformerSpec("x", n_layer=2, d_model=64, n_head=8, d_ff=128,
                    vocab_size=10).check_context(10**6, 10**6)


def test_the_iteration_report_refuses_a_budget_past_the_window():
    from rlm_course.algorithms import preset
    from rlm_course.cost.anatomy import Workload, iteration_report
    from rlm_course.cost.hardware import get_device

    h100 = get_device("H100-SXM-80GB")
    with pytest.raises(ValueError, match=r"llama-3-8b reads at most 8,192 tokens .* 16,896"):
        iteration_report(get_spec("llama-3-8b"), preset("grpo"), Workload(8, 4, 512, 16384), h100)
    # within the window it reports, and Llama 3.1 differs from Llama 3 only by its window
    fits = Workload(8, 4, 512, 8192 - 512)
    report = iteration_report(get_spec("llama-3-8b"), preset("grpo"), fits, h100)
    assert report["stages"] == iteration_report(get_spec("llama-3.1-8b"), preset("grpo"), fits,
                                                h100)["stages"]
    assert report["stages"]["decode"]["seconds"] > 0 and report["seconds"] > 0


def test_the_iteration_report_names_an_argument_of_the_wrong_kind():
    from rlm_course.algorithms import preset
    from rlm_course.cost.anatomy import Workload, iteration_report
    from rlm_course.cost.hardware import get_device

    spec, grpo, w = get_spec("llama-3-8b"), preset("grpo"), Workload(8, 4, 512, 1024)
    h100 = get_device("H100-SXM-80GB")
    with pytest.raises(ValueError, match=r"iteration_report: spec='llama-3-8b' must be a "
                                         r"TransformerSpec; pass e\.g\. .*get_spec"):
        iteration_report("llama-3-8b", grpo, w, h100)
    with pytest.raises(ValueError, match=r"device='H100-SXM-80GB' must be a Device"):
        iteration_report(spec, grpo, w, "H100-SXM-80GB")
    with pytest.raises(ValueError, match=r"weight_sync='foo'; choose None"):
        iteration_report(spec, grpo, w, h100, weight_sync="foo")
    # a batch no memory can hold is refused before anything is built (it raised MemoryError)
    from rlm_course.cost.anatomy import MAX_RESPONSES

    with pytest.raises(ValueError, match=r"1,000,000,000 x 4 = 4,000,000,000 responses; .* at "
                                         r"most 10,000,000 .* lower prompts or group_size"):
        Workload(10**9, 4, 512, 1024)
    assert Workload(MAX_RESPONSES // 4, 4, 512, 1024).responses == MAX_RESPONSES


def test_a_generation_tp_too_small_names_the_degree_that_holds_the_weights():
    from rlm_course.algorithms import preset
    from rlm_course.cost.anatomy import Workload, iteration_report
    from rlm_course.cost.hardware import get_device

    h100, w = get_device("H100-SXM-80GB"), Workload(8, 4, 512, 1024)
    # 1,342 GB of bf16 weights: 15.8 H100s' worth of the 84.9 GB CUDA reports each, so TP 16 of 64
    spec = get_spec("deepseek-v3")
    for tp in (2, 8):
        with pytest.raises(ValueError, match=r"do not fit in tp=\d+ x 84.9 GB .*; raise the "
                                             r"generation TP degree to 16 \(the smallest that "
                                             r"divides the 64 devices"):
            iteration_report(spec, preset("grpo"), w, h100, devices=64, generation_tp=tp)
    assert iteration_report(spec, preset("grpo"), w, h100, devices=64,
                            generation_tp=16)["seconds"] > 0
    with pytest.raises(ValueError, match="no TP degree up to the 8 devices holds them: use more "
                                         "devices or a device with more memory"):
        iteration_report(spec, preset("grpo"), w, h100, devices=8, generation_tp=2)


def test_a_tp_degree_must_hold_whole_key_value_heads():
    """Qwen2.5-32B: 40 query heads, 8 KV heads. tp=5 divides the query heads but would give each
    rank 1.6 KV heads (vLLM and Megatron refuse it); tp=40 replicates each KV head on 5 ranks."""
    spec = get_spec("qwen2.5-32b")
    for tp in (5, 10, 20):
        with pytest.raises(ValueError, match=f"tp={tp} splits qwen2.5-32b's 8 key/value heads"):
            spec.check_degree("tp", tp)
        with pytest.raises(ValueError, match="unevenly"):
            Layout(tp=tp).check(spec)
    assert [spec.kv_shards(tp) for tp in (1, 2, 4, 8, 40)] == [1, 2, 4, 8, 8]
    for tp in (1, 2, 4, 8, 40):
        spec.check_degree("tp", tp)
    get_spec("deepseek-v3").check_degree("tp", 32)  # a latent cache: every rank holds it whole
