import pytest
import torch

from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.lm.sampling import generate, response_log_probs
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.numerics import relative_error, reorder_tolerance

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyGPT(ModelConfig(TOK.vocab_size, max_seq_len=32)).eval()


def prompts():
    return TOK.encode_prompts(["12+34=", "5+6=", "999+1=", "0+0="])


def sample(model, seed, **kw):
    tokens, mask = prompts()
    return generate(model, tokens, mask, 8, TOK.eos_id, generator=torch.Generator().manual_seed(seed), **kw)


def test_same_seed_same_samples_and_cache_changes_nothing(model):
    # the same seed in the same process: the same operations in the same order, bit for bit
    a, b = sample(model, 3), sample(model, 3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.tokens, sample(model, 4).tokens)
    # with and without the cache the logits differ by rounding only; in float64 that is 1e-16,
    # far too little to move a sampled token, so the samples match on any machine
    double = TinyGPT(model.config).double().eval()
    double.load_state_dict(model.state_dict())
    c, d = sample(double, 3), sample(double, 3, use_cache=False)
    assert torch.equal(c.tokens, d.tokens)
    assert relative_error(c.log_probs, d.log_probs) <= reorder_tolerance(torch.float64, 512, 8)


def test_sampler_log_probs_equal_a_scoring_pass(model):
    r = sample(model, 0)
    scored = response_log_probs(model, r.tokens, r.attention_mask, r.prompt_len)
    # float32, the precision the trainer scores in: log-probs of order 1-10 agree to rounding
    # of sums over at most 512 terms in 8 chained reductions
    tol = reorder_tolerance(torch.float32, 512, 8)
    assert relative_error(scored[r.response_mask], r.log_probs[r.response_mask]) <= tol
    assert (r.log_probs[~r.response_mask] == 0).all()


def test_a_rollout_is_made_of_ordinary_tensors_a_training_step_can_use(model):
    # generation runs under torch.inference_mode; what it returns must still be usable by
    # autograd: a loss times the response mask, or times the sampler's log-probs, saves that
    # tensor for its backward, which an inference tensor refuses
    r = sample(model, 0)
    for name in ("tokens", "attention_mask", "response_mask", "log_probs"):
        assert not getattr(r, name).is_inference(), name
    policy = TinyGPT(model.config)
    policy.load_state_dict(model.state_dict())
    logp = response_log_probs(policy, r.tokens, r.attention_mask, r.prompt_len)
    (logp * r.response_mask + logp * r.log_probs).sum().backward()
    grad = policy.head.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert model.training is False and policy.training is True


def test_stops_at_eos_and_masks_the_rest(model):
    # make <eos> the only possible token after the first step by biasing the head
    biased = TinyGPT(model.config).eval()
    biased.load_state_dict(model.state_dict())
    with torch.no_grad():
        biased.head.weight.zero_()
        biased.head.weight[TOK.eos_id] = 0.0
        biased.ln_f.bias.zero_()
        biased.head.weight[TOK.eos_id, 0] = 1.0
        biased.ln_f.weight.zero_()
        biased.ln_f.bias[0] = 100.0
    r = sample(biased, 0)
    assert r.responses.shape[1] == 1  # every sequence ended after one token: generation stopped
    assert (r.responses[:, 0] == TOK.eos_id).all()
    assert r.response_mask.all()


def test_response_mask_after_eos(model):
    r = sample(model, 1)
    for row, mask in zip(r.responses, r.response_mask):
        eos = (row == TOK.eos_id).nonzero()
        n = int(eos[0]) + 1 if len(eos) else row.shape[0]
        assert mask[:n].all() and not mask[n:].any()
        assert (row[n:] == TOK.pad_id).all()


def test_top_k_one_is_greedy(model):
    tokens, mask = prompts()
    greedy = generate(model, tokens, mask, 8, TOK.eos_id, greedy=True)
    top1 = sample(model, 5, top_k=1)
    assert torch.equal(greedy.tokens, top1.tokens)


@pytest.mark.parametrize("kw,match", [({"max_new_tokens": 0}, "max_new_tokens"),
                                      ({"temperature": 0.0}, "temperature"),
                                      # logits / 1e-45 overflow: multinomial crashed on NaN
                                      ({"temperature": 1e-45}, r"temperature=1e-45 divides the "
                                                               r"logits past float range"),
                                      ({"max_new_tokens": 40}, "exceeds max_seq_len")])
def test_bad_arguments(model, kw, match):
    tokens, mask = prompts()
    args = {"max_new_tokens": 4, **kw}
    with pytest.raises(ValueError, match=match):
        generate(model, tokens, mask, eos_id=TOK.eos_id, **args)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.6])
def test_scoring_at_the_rollout_temperature_equals_the_sampler(temperature):
    # 64 addition prompts from the warm start: the scores of the sampled tokens are the sampler's
    # at any temperature (at temperature 0.7 scoring at 1 was off by up to 1.6 nats)
    from rlm_course.lm.checkpoint import load_checkpoint
    from rlm_course.rl.runs import default_sft_checkpoint
    from rlm_course.tasks import get_task

    task = get_task("addition", digits=3)
    policy = load_checkpoint(default_sft_checkpoint(task))["model"]
    tokens, mask = TOK.encode_prompts([p.prompt for p in task.problems(64, seed=0)])
    for model in (policy.double(), policy.float()):
        r = generate(model, tokens, mask, task.max_response_len, TOK.eos_id, TOK.pad_id,
                     temperature=temperature, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            scored = response_log_probs(model, r.tokens, r.attention_mask, r.prompt_len,
                                        temperature=temperature)
        real = r.response_mask
        # the sampler decodes with the KV cache, the scorer runs one full pass: the same logits up
        # to rounding, which dividing by the temperature scales by 1 / temperature
        dtype = next(model.parameters()).dtype
        tol = reorder_tolerance(dtype, 512, 8) / temperature
        assert relative_error(scored[real], r.log_probs[real]) <= tol, dtype
    with torch.no_grad():  # scoring at temperature 1 instead: another distribution
        wrong = response_log_probs(policy, r.tokens, r.attention_mask, r.prompt_len)
    assert (wrong[real] - r.log_probs[real]).abs().max() > 1e-2


def test_scoring_refuses_a_bad_temperature(model):
    r = sample(model, 0)
    with pytest.raises(ValueError, match="temperature=0"):
        response_log_probs(model, r.tokens, r.attention_mask, r.prompt_len, temperature=0)
    # sampling refuses what scoring refuses: NaN failed inside multinomial, inf sampled uniformly
    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match=f"temperature={bad} must be positive and finite"):
            sample(model, 0, temperature=bad)


@pytest.mark.parametrize("use_cache", [False, True])
def test_token_forwards_with_and_without_the_cache(use_cache):
    """Chapter 01's count: without a cache token t needs a forward over the P + t - 1 tokens
    before it, T P + T (T - 1) / 2 in all; with one, P + T - 1 (a prefill, then one per step)."""
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(vocab_size=TOK.vocab_size, n_layer=1, n_head=2, d_model=16,
                                max_seq_len=32))
    prompt, mask = TOK.encode_prompts(["12+34="])
    p, t = prompt.shape[1], 9
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    try:  # an eos id no token can take, so every sequence runs the whole budget
        generate(model, prompt, mask, t, eos_id=-1, generator=torch.Generator().manual_seed(0),
                 use_cache=use_cache)
    finally:
        hook.remove()
    assert sum(seen) == (p + t - 1 if use_cache else t * p + t * (t - 1) // 2)


def test_generate_refuses_what_it_would_misread_and_restores_the_mode():
    tok = CharTokenizer()
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, d_model=8,
                                max_seq_len=32))
    prompts, mask = tok.encode_prompts(["1+2=", "12+34="])
    eos = tok.eos_id
    rollout = generate(model, prompts, mask, 5, eos, generator=torch.Generator().manual_seed(0))
    right_padded = torch.tensor([[1, 4, 13, 5, 19, 0, 0]])
    small = TinyGPT(ModelConfig(vocab_size=10, n_layer=1, n_head=1, d_model=8, max_seq_len=32))
    for call, said in (
            (lambda: generate(model, prompts, mask, 5, eos, top_k=0), "top_k=0 must be a positive"),
            (lambda: generate(model, prompts, mask, 5, eos, top_k=True), "top_k=True"),
            (lambda: generate(model, prompts, mask, 5, None), "eos_id=None must be a token id"),
            (lambda: generate(model, prompts, mask, 5, 999), "eos_id=999"),
            (lambda: generate(model, prompts, mask, 5, -2), "eos_id=-2"),
            (lambda: generate(model, prompts, mask, True, eos), "max_new_tokens=True must be a "
                                                                "positive integer"),
            (lambda: generate(model, prompts, mask, 2.5, eos), "max_new_tokens=2.5"),
            (lambda: generate(model, prompts, mask.long(), 5, eos),
             r"prompt_mask must be a bool tensor of the prompts' shape \(2, 7\) \(got torch.int64"),
            (lambda: generate(model, prompts[0], mask[0], 5, eos),
             r"prompt_tokens must be a \(batch, P\) tensor"),
            (lambda: generate(model, right_padded, right_padded > 0, 5, eos),
             "every prompt's last column must be a real token"),
            (lambda: generate(small, prompts, mask, 5, 3), "outside the model's vocabulary of 10"),
            (lambda: response_log_probs(model, rollout.tokens, rollout.attention_mask, 0),
             r"prompt_len=0 must be an integer in 1..11"),
            (lambda: response_log_probs(model, rollout.tokens, rollout.attention_mask, 100),
             "prompt_len=100"),
            (lambda: tok.encode_prompts("12+3="), r"give a list of prompts, e.g. \['12\+3='\]")):
        with pytest.raises(ValueError, match=said):
            call()
    # a diverged model raises, and is left in the mode it came in (it was left in eval mode)
    model.train()
    with torch.no_grad():
        model.tok_emb.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError):
        generate(model, prompts, mask, 5, eos)
    assert model.training
