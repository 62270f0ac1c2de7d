"""Asynchronous RL without processes (rlm_course.systems.async_rl): the staleness gate, the decoupled
loss, partial rollouts, tagged batches and the pipeline's settings."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.lm.model import TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import preset
from rlm_course.rl.losses import policy_loss
from rlm_course.rl.sft import default_model_config
from rlm_course.rl.trainer import RLTrainer
from rlm_course.systems.async_rl import (PartialRollout, PipelineConfig, decoupled_ppo_loss,
                                         rollout_capacity, staleness, tag_versions)
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

TOK = CharTokenizer()


def _trainer(seed=0, **overrides):
    task = get_task("addition", digits=2)
    torch.manual_seed(seed)
    model = TinyGPT(default_model_config(TOK, task))
    config = preset("grpo", prompts_per_step=4, group_size=4, steps=3, eval_every=10**6,
                    **overrides)
    return RLTrainer(model, task, TOK, config, load_eval_set(task)[:8])


def test_rollout_capacity_hand_examples_and_errors():
    assert rollout_capacity(0, 0, 4, 0) == 4   # sync: the first batch
    assert rollout_capacity(0, 0, 4, 4) == 0   # ... and not the second before step 1
    assert rollout_capacity(0, 1, 4, 4) == 4   # one-step off: the second may start
    assert rollout_capacity(2, 2, 4, 16) == 4  # (2 + 2 + 1) x 4 - 16
    with pytest.raises(ValueError, match="eta"):
        rollout_capacity(0, -1, 4, 0)
    assert staleness(train_step=5, version=3) == 1


@settings(max_examples=200, deadline=None)
@given(eta=st.integers(0, 4), batch=st.integers(1, 4),
       order=st.lists(st.booleans(), min_size=1, max_size=80))
def test_staleness_is_never_exceeded_whatever_the_event_order(eta, batch, order):
    """A rollout that starts samples whenever the gate allows and a trainer that finishes steps
    whenever a full batch is there, interleaved in any order: no sample is ever trained more than
    eta versions stale, and the pipeline never stalls."""
    version, started, start_version = 0, 0, []
    for rollout_moves in order:
        can_start = rollout_capacity(version, eta, batch, started) > 0
        can_train = started >= (version + 1) * batch
        assert can_start or can_train, "neither side can move: the gate deadlocked"
        if (rollout_moves and can_start) or not can_train:
            start_version.append(version)
            started += 1
        else:
            version += 1
    for j, v in enumerate(start_version[:version * batch]):  # the trained samples
        assert j // batch - v <= eta


def test_decoupled_loss_is_ppo_on_policy_and_weights_off_policy_tokens():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g) * 0.1 - 1
    prox = logp.detach() + 0.01
    mask = torch.ones(4, 5, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0])
    on, _ = decoupled_ppo_loss(logp, prox, prox, adv, mask)
    assert torch.equal(on, policy_loss(logp, prox, adv, mask)[0])
    off, _ = decoupled_ppo_loss(logp, prox, prox - math.log(1.5), adv, mask, correction="is")
    assert torch.allclose(off, 1.5 * on)
    # every token above the cap: masked (AReaL's code) contributes nothing, truncated contributes
    # the cap times its objective, eq. 5 uncapped the full weight
    far = prox - math.log(5.0)
    assert decoupled_ppo_loss(logp, prox, far, adv, mask, correction="mis")[0] == 0
    assert torch.allclose(decoupled_ppo_loss(logp, prox, far, adv, mask, correction="tis")[0],
                          2.0 * on)
    assert torch.allclose(decoupled_ppo_loss(logp, prox, far, adv, mask, correction="is")[0],
                          5.0 * on)
    with pytest.raises(ValueError, match="cap"):
        decoupled_ppo_loss(logp, prox, prox, adv, mask, cap=0.5)
    with pytest.raises(ValueError, match="correction"):
        decoupled_ppo_loss(logp, prox, prox, adv, mask, correction="vtrace")


def test_a_batch_whose_behaviour_is_the_proximal_policy_makes_the_plain_update():
    from rlm_course.lm.sampling import response_log_probs

    plain, weighted = _trainer(), _trainer(correction="is")
    batch = plain.collect(1)
    plain.step_count = 0
    plain.step(batch)
    r = batch.rollout
    with torch.no_grad():  # what the trainer recomputes as pi_old: the proximal policy
        prox = response_log_probs(weighted.policy, r.tokens, r.attention_mask, r.prompt_len,
                                  temperature=weighted.config.temperature)
    batch.behaviour_log_probs = prox  # w = 1 on every token
    metrics = weighted.step(batch)
    a, b = plain.policy.state_dict(), weighted.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics["behaviour_kl"] == 0 and metrics["weight_max"] == 1
    assert metrics["corrected_tokens"] == 0


def test_a_stale_batch_reports_its_staleness_and_behaviour_kl():
    trainer = _trainer(correction="mis")
    batch = tag_versions(trainer.collect(1), 0)
    trainer.step_count = 2  # the batch of version 0 trains at step 3: 2 versions stale
    batch.behaviour_log_probs = batch.rollout.log_probs - 0.9  # w = e^0.9 > 2: every token masked
    metrics = trainer.step(batch)
    assert metrics["staleness_max"] == 2 and metrics["staleness_mean"] == 2
    assert metrics["staleness_token_mean"] == 2
    assert metrics["over_cap_tokens"] == 1 and metrics["corrected_tokens"] == 1
    assert metrics["policy_loss"] == 0  # every token masked
    assert metrics["behaviour_kl"] == pytest.approx(math.exp(0.9) - 1 - 0.9, rel=1e-3)


def test_one_segment_partial_rollout_is_the_trainers_own_batch():
    trainer = _trainer()
    want = trainer.collect(2)
    partial = PartialRollout(trainer, 2)
    partial.advance(trainer.policy, version=0, max_tokens=trainer.max_new_tokens)
    got = partial.batch()
    for key in ("tokens", "attention_mask", "response_mask", "log_probs"):
        assert torch.equal(getattr(got.rollout, key), getattr(want.rollout, key)), key
    assert torch.equal(got.rewards, want.rewards)
    assert torch.equal(got.versions, torch.where(got.rollout.response_mask, 0, -1))


def test_an_interrupted_rollout_records_two_versions_and_trains():
    trainer = _trainer()
    new_weights = _trainer(seed=1).policy
    partial = PartialRollout(trainer, 1)
    partial.advance(trainer.policy, version=0, max_tokens=1)
    assert not partial.done
    while not partial.done:  # the rest with the new weights: the cache recomputed with them
        partial.advance(new_weights, version=1, max_tokens=1)
    batch = partial.batch()
    versions = batch.versions[batch.rollout.response_mask]
    assert set(versions.tolist()) == {0, 1} and (batch.versions[:, 0] == 0).all()
    metrics = trainer.step(batch)
    assert math.isfinite(metrics["policy_loss"])
    with pytest.raises(ValueError, match="max_tokens"):
        partial.advance(trainer.policy, 0, 0)


def test_migrated_sequences_continue_elsewhere():
    trainer = _trainer()
    a, b = PartialRollout(trainer, 1, share=0, shares=2), PartialRollout(trainer, 1, 1, 2)
    assert {r.index for r in a.rows} | {r.index for r in b.rows} == set(range(16))
    a.advance(trainer.policy, 0, 1)
    b.advance(trainer.policy, 0, 1)
    moved = b.export_unfinished()
    a.adopt(moved)
    while not a.done:
        a.advance(trainer.policy, 0, 4)
    assert all(r.finished for r in a.rows) and b.done


def test_tagged_batches_carry_versions_and_behaviour_log_probs():
    trainer = _trainer()
    batch = tag_versions(trainer.collect(1), 7)
    mask = batch.rollout.response_mask
    assert (batch.versions[mask] == 7).all() and (batch.versions[~mask] == -1).all()
    assert batch.behaviour_log_probs is batch.rollout.log_probs


def test_pipeline_config_is_checked():
    with pytest.raises(ValueError, match="eta"):
        PipelineConfig(eta=-1)
    with pytest.raises(ValueError, match="bucket_bytes"):
        PipelineConfig(bucket_bytes=0)
