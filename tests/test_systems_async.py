"""Chapters 12-13 without processes: the staleness gate, the decoupled loss, partial rollouts,
buckets and their alpha-beta model, resharding layouts and predictions, stage 4 in the cost
models, timelines, device mappings."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.cost import workdepth as wd
from rlm_course.cost.anatomy import Workload, iteration_report
from rlm_course.cost.weight_sync import broadcast_seconds, predict_transition, sync_cost
from rlm_course.cost.architectures import SPECS
from rlm_course.cost.hardware import get_device
from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.parallel.tensor_parallel import TensorParallelBlock
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.rl.algorithms import preset
from rlm_course.rl.losses import policy_loss
from rlm_course.rl.sft import default_model_config
from rlm_course.rl.trainer import RLTrainer
from rlm_course.systems.async_rl import (DecoupledObjective, PartialRollout, PipelineConfig,
                                         decoupled_ppo_loss, rollout_capacity, staleness,
                                         tag_versions)
from rlm_course.systems.controller import DeviceMapping
from rlm_course.systems.resharding import (Split, generation_index, megatron_splits, merge,
                                           micro_dp_groups, shard, shard_major,
                                           training_shards)
from rlm_course.systems.timeline import (Event, Recorder, busy_seconds, clock_offset,
                                         overlap_seconds, utilisation)
from rlm_course.distributed.collectives import fit_link
from rlm_course.systems.weight_sync import (bucket_plan, bucketed_broadcast,
                                            handover, predict_sync_seconds)
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

TOK = CharTokenizer()


# ---------------------------------------------------------------------------------- the gate
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


# ---------------------------------------------------------------------------------- the loss
def test_decoupled_loss_is_ppo_on_policy_and_weights_off_policy_tokens():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g) * 0.1 - 1
    prox = logp.detach() + 0.01
    mask = torch.ones(4, 5, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0])
    on, _ = decoupled_ppo_loss(logp, prox, prox, adv, mask)
    assert torch.equal(on, policy_loss(logp, prox, adv, mask)[0])
    off, _ = decoupled_ppo_loss(logp, prox, prox - math.log(1.5), adv, mask, weight_cap=10.0)
    assert torch.allclose(off, 1.5 * on)
    capped, _ = decoupled_ppo_loss(logp, prox, prox - math.log(5.0), adv, mask, weight_cap=2.0)
    assert torch.allclose(capped, 2.0 * on)
    with pytest.raises(ValueError, match="weight_cap"):
        decoupled_ppo_loss(logp, prox, prox, adv, mask, weight_cap=0.0)


def _trainer(seed=0, **overrides):
    task = get_task("addition", digits=2)
    torch.manual_seed(seed)
    model = TinyGPT(default_model_config(TOK, task))
    config = preset("grpo", prompts_per_step=4, group_size=4, steps=3, eval_every=10**6,
                    **overrides)
    return RLTrainer(model, task, TOK, config, load_eval_set(task)[:8])


def test_the_trainer_hook_with_behaviour_equal_to_proximal_makes_the_plain_update():
    from rlm_course.lm.sampling import response_log_probs

    plain, hooked = _trainer(), _trainer()
    batch = plain.collect(1)
    plain.step_count = 0
    plain.step(batch)
    r = batch.rollout
    with torch.no_grad():  # what the trainer recomputes as pi_old: the proximal policy
        prox = response_log_probs(hooked.policy, r.tokens, r.attention_mask, r.prompt_len,
                                  temperature=hooked.config.temperature)
    hooked.policy_loss_fn = DecoupledObjective(hooked.config, prox, hooked.max_new_tokens)
    hooked.step(batch)
    a, b = plain.policy.state_dict(), hooked.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="token"):
        DecoupledObjective(preset("gspo"), prox, 8)


# ---------------------------------------------------------------------------------- partial rollouts
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
    with pytest.raises(ValueError, match="objective"):
        PipelineConfig(objective="magic")
    with pytest.raises(ValueError, match="bucket_bytes"):
        PipelineConfig(bucket_bytes=0)


# ---------------------------------------------------------------------------------- weight sync
def test_bucket_plan():
    assert bucket_plan([4, 4, 4], 8) == [[0, 1], [2]]
    assert bucket_plan([10, 2, 2], 8) == [[0], [1, 2]]  # too big: a bucket of its own
    assert bucket_plan([4, 4], 100, [torch.float32, torch.float64]) == [[0], [1]]
    assert bucket_plan([], 8) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_plan([1], 0)


def test_bucketed_broadcast_and_handover_copy_exactly():
    src, dst = TinyGPT(ModelConfig(vocab_size=24, n_layer=1, d_model=16, n_head=2, max_seq_len=8)), \
        TinyGPT(ModelConfig(vocab_size=24, n_layer=1, d_model=16, n_head=2, max_seq_len=8))
    sent = []
    sizes = bucketed_broadcast(list(src.state_dict().values()), 1000, lambda b: sent.append(b.clone()))
    bucketed_broadcast(list(dst.state_dict().values()), 1000, lambda b: b.copy_(sent.pop(0)))
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    assert sum(sizes) == sum(t.numel() * 4 for t in src.state_dict().values())
    other = TinyGPT(ModelConfig(vocab_size=24, n_layer=1, d_model=16, n_head=2, max_seq_len=8))
    assert handover(src, other) == sum(sizes)
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), other.state_dict().values()))
    with pytest.raises(ValueError, match="differ"):
        handover(src, TinyGPT(ModelConfig(vocab_size=24, n_layer=2, d_model=16, n_head=2,
                                          max_seq_len=8)))


def test_alpha_beta_model_and_fit():
    link = Link(alpha=1e-4, beta=1e9)
    assert predict_sync_seconds(1e6, 4, link) == pytest.approx(4e-4 + 1e-3)
    assert predict_sync_seconds(1e6, 4, link, receivers=3) == pytest.approx(2 * (4e-4 + 1e-3))
    assert broadcast_seconds(1e6, 4, link) == predict_sync_seconds(1e6, 4, link)
    # pipelined (NCCL): the bytes cross once whatever the tree's depth
    assert broadcast_seconds(1e6, 4, link, 3, pipelined=True) == pytest.approx(2 * 4e-4 + 1e-3)
    # the copies term: packing and unpacking, a read and a write of every byte on each side
    assert predict_sync_seconds(1e6, 4, link, memory_bandwidth=1e10) == pytest.approx(
        4e-4 + 1e-3 + 4e6 / 1e10)
    with pytest.raises(ValueError, match="memory_bandwidth"):
        predict_sync_seconds(1e6, 4, link, memory_bandwidth=0)
    sizes = [2**k for k in range(10, 25, 2)]
    fitted = fit_link("broadcast", sizes, [link.seconds(s) for s in sizes], 2)
    assert fitted.alpha == pytest.approx(1e-4) and fitted.beta == pytest.approx(1e9)
    with pytest.raises(ValueError, match="grow"):
        fit_link("broadcast", [1, 2], [2.0, 1.0], 2)


# ---------------------------------------------------------------------------------- resharding
def test_shards_nest_and_match_the_tensor_parallel_block():
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(vocab_size=24, max_seq_len=32))
    state = model.state_dict()
    splits = megatron_splits(state)
    for name, tensor in state.items():
        if splits[name] is None:
            continue
        assert torch.equal(merge([shard(tensor, splits[name], i, 4) for i in range(4)],
                                 splits[name]), tensor)
        for j in range(2):  # a TP-2 shard is the union of two TP-4 shards
            pair = [shard(tensor, splits[name], 2 * j + k, 4) for k in range(2)]
            assert torch.equal(merge(pair, splits[name]), shard(tensor, splits[name], j, 2))
            assert torch.equal(shard_major(torch.cat(pair, splits[name].dim), splits[name], 2),
                               shard(tensor, splits[name], j, 2))
    block = TensorParallelBlock(model.blocks[0], World(4))
    local = training_shards(state, 2, 4)
    assert torch.equal(block.shards[2].qkv_w, local["blocks.0.attn.qkv.weight"])
    assert torch.equal(block.shards[2].out_w, local["blocks.0.mlp.out.weight"])
    with pytest.raises(ValueError, match="equal chunks"):
        shard(torch.zeros(6, 2), Split(0), 0, 4)


def test_generation_layouts():
    assert [generation_index(r, 4, 2, "naive") for r in range(4)] == [0, 1, 0, 1]
    assert [generation_index(r, 4, 2, "hybridflow") for r in range(4)] == [0, 0, 1, 1]
    assert micro_dp_groups(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="divisor"):
        micro_dp_groups(4, 3)


def test_transition_predictions_are_hybridflows_table():
    m = 140e9  # 70B in bf16, TP 8 -> TP 2 (HybridFlow, arXiv:2409.19256, Table 2)
    out = predict_transition(m, 8, 2)
    assert out["naive"]["received_bytes"] == pytest.approx(7 / 8 * m)  # (tp - 1) / tp M
    assert out["hybridflow"]["received_bytes"] == pytest.approx((8 - 2) / (2 * 8) * m)
    assert out["hybridflow"]["peak_bytes"] == pytest.approx(m / 2)
    assert out["hybridflow"]["redundant_bytes"] == 0
    assert out["reduction"]["bytes"] == pytest.approx(1 - (3 / 8) / (7 / 8))
    with_pp = predict_transition(m, 4, 2, pp=2, pp_gen=1)
    assert with_pp["hybridflow"]["received_bytes"] == pytest.approx((8 - 2) / (2 * 8) * m)
    timed = predict_transition(m, 8, 2, link=Link(alpha=0.0, beta=450e9))
    assert timed["naive"]["seconds"] == pytest.approx(7 * m / 8 / 450e9)
    assert timed["hybridflow"]["seconds"] == pytest.approx(3 * m / 8 / 450e9)
    with pytest.raises(ValueError, match="divisor"):
        predict_transition(m, 8, 3)


# ---------------------------------------------------------------------------------- cost models
def test_stage_four_in_the_anatomy_and_the_dag():
    spec, h100 = SPECS["llama-3-70b"], get_device("H100-SXM-80GB")
    dis = sync_cost(spec, h100, generation_tp=8, replicas=1)
    assert dis.bytes == 2 * spec.params()
    assert dis.messages == math.ceil(dis.bytes / 2**29)
    # one trainer rank, 8 receivers on 9 devices (two nodes): the network link, pipelined
    assert dis.transfer == pytest.approx(dis.messages * 4 * h100.inter_node_latency
                                         + dis.bytes / h100.inter_node_bandwidth)
    assert dis.copies == pytest.approx(4 * dis.bytes / h100.memory_bandwidth)
    assert dis.seconds == pytest.approx(dis.transfer + dis.copies) and dis.ideal <= dis.seconds
    col = sync_cost(spec, h100, "colocated", generation_tp=8, replicas=1)
    assert col.network_bytes == 0 and col.seconds < dis.seconds / 10
    with pytest.raises(ValueError, match="placement"):
        sync_cost(spec, h100, "nearby")
    w = Workload(8, 4, 128, 256)
    plain = iteration_report(spec, preset("grpo"), w, h100, devices=16, generation_tp=8)
    synced = iteration_report(spec, preset("grpo"), w, h100, devices=16, generation_tp=8,
                              weight_sync="disaggregated")
    assert "weight sync" not in plain["stages"] and "weight sync" in synced["stages"]
    assert synced["seconds"] == pytest.approx(plain["seconds"]
                                              + synced["stages"]["weight sync"]["seconds"])
    node = wd.weight_sync(1000, receivers=3, messages=5)
    assert (node.work, node.depth) == (3000, 5 * 2)
    assert synced["work"] == plain["work"] + 2 * spec.params()  # two replicas receive
    assert (wd.weight_sync(1000, 0).work, wd.weight_sync(1000, 0).depth) == (1000, 1)


# ---------------------------------------------------------------------------------- timelines
def test_recorder_and_overlaps():
    ticks = iter([0.0, 2.0, 1.0, 3.0])
    rec = Recorder("w", clock=lambda: next(ticks))
    with rec("training", version=1, step=1) as detail:
        detail["tokens"] = 5
    with rec("sync"):
        pass
    events = rec.take()
    assert events[0] == Event("w", "training", 0.0, 2.0, 1, 1, {"tokens": 5})
    assert busy_seconds(events) == 3.0 and rec.take() == []
    both = [Event("a", "x", 0, 4), Event("b", "y", 2, 6)]
    assert overlap_seconds(both, "a", "b") == 2
    assert utilisation(both) == {"a": 4 / 6, "b": 4 / 6}
    assert clock_offset(lambda: 105.0, iter([1.0, 3.0] * 5).__next__) == pytest.approx(103.0)


def test_device_mappings():
    colocated = DeviceMapping(actor=[0, 1], rollout=[0, 1])
    assert [(g.roles, g.devices) for g in colocated.groups()] == [(("actor", "rollout"), (0, 1))]
    assert colocated.placement("actor", "rollout") == "colocated"
    split = DeviceMapping.disaggregated(actor=2, rollout=1)
    assert split.roles == {"actor": (0, 1), "rollout": (2,)}
    assert split.placement("actor", "rollout") == "disaggregated"
    with pytest.raises(ValueError, match="share some devices but not all"):
        DeviceMapping(actor=[0, 1], rollout=[1, 2])
    with pytest.raises(ValueError, match="distinct"):
        DeviceMapping(actor=[0, 0])
    with pytest.raises(ValueError, match="no role"):
        colocated.placement("actor", "critic")


def test_timeline_plot():
    from rlm_course.tools.plots import plot_timelines

    events = [Event("actor/0", "training", 0, 1, 1, 1), Event("rollout/0", "generation", 0, 2, 0, 2)]
    fig = plot_timelines({"a run": events, "another": events})
    assert len(fig.axes) == 2


def test_worker_methods_are_passed_by_reference_and_a_wrong_one_fails_in_the_driver():
    from rlm_course.systems.controller import method_name
    from rlm_course.systems.workers import RLWorker, TrainerMixin

    assert method_name(RLWorker, RLWorker.train) == "train"
    assert method_name(RLWorker, TrainerMixin.train) == "train"  # the role's mixin defines it
    with pytest.raises(TypeError, match=r"RLWorker\.train, not its name 'train'"):
        method_name(RLWorker, "train")
    with pytest.raises(ValueError, match="not a method of the worker class RLWorker"):
        method_name(RLWorker, len)
    with pytest.raises(TypeError, match="is not a method"):
        method_name(RLWorker, 3)
