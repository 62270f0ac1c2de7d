"""Presets, option conflicts, the one training loop, and its measured vs predicted cost."""

import dataclasses

import pytest
import torch

from rlm_course.cost.accounting import predict_iteration_flops, predict_passes
from rlm_course.cost.flops import count_flops
from rlm_course.lm.checkpoint import load_checkpoint
from rlm_course.lm.sampling import concat_rollouts, generate, response_log_probs
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.rl.algorithms import PRESETS, GRPOConfig, PPOConfig, RLConfig, preset
from rlm_course.rl.advantages import group_advantages
from rlm_course.rl.rewards import groups_with_signal
from rlm_course.rl.runs import cost_summary, default_sft_checkpoint, run_rl
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

TASK = get_task("addition", digits=3)
TOK = CharTokenizer()

# The published combinations, written out independently of rlm_course.rl.algorithms.PRESETS:
# (advantage, normalize_std, ratio, clip low, clip high, aggregation, KL mode, KL estimator,
#  dynamic sampling, overlong shaping, critic, group size)
PUBLISHED = {
    "ppo": ("gae", True, "token", 0.2, 0.2, "token-mean", "reward", "k1", False, False, True, 1),
    "grpo": ("group", True, "token", 0.2, 0.2, "seq-mean-token-mean", "loss", "k3", False, False,
             False, 8),
    "dr_grpo": ("group", False, "token", 0.2, 0.2, "seq-mean-token-sum-norm", "none", "k3", False,
                False, False, 8),
    "dapo": ("group", True, "token", 0.2, 0.28, "token-mean", "none", "k3", True, True, False, 8),
    "rloo": ("rloo", True, "token", 0.2, 0.2, "seq-mean-token-mean", "reward", "k1", False, False,
             False, 8),
    "reinforce_pp": ("reinforce_pp", True, "token", 0.2, 0.2, "token-mean", "reward", "k1", False,
                     False, False, 1),
    "gspo": ("group", True, "sequence", 3e-4, 4e-4, "seq-mean-token-mean", "none", "k3", False,
             False, False, 8),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_equal_the_published_combinations(name):
    c = preset(name)
    got = (c.advantage, c.normalize_std, c.ratio_level, c.clip_eps, c.clip_high, c.loss_agg,
           c.kl_mode, c.kl_estimator, c.dynamic_sampling, c.overlong_buffer > 0, c.use_critic,
           c.group_size)
    assert got == PUBLISHED[name]
    assert c.variant == name and c.uses_reference == (c.kl_mode != "none")


def test_preset_set_and_constructors():
    assert sorted(PRESETS) == sorted(PUBLISHED)
    assert GRPOConfig() == RLConfig() == preset("grpo")
    assert PPOConfig(steps=7) == preset("ppo", steps=7)
    with pytest.raises(ValueError, match="unknown variant 'ppo2'"):
        preset("ppo2")
    with pytest.raises(ValueError, match="unknown setting"):
        preset("grpo", clip=0.3)
    # the variant names the run: GRPO's settings were labelled DAPO
    with pytest.raises(ValueError, match=r"preset\('grpo', variant='dapo'\): the variant names "
                                         r"the preset the settings come from; call "
                                         r"preset\('dapo', \.\.\.\)"):
        preset("grpo", variant="dapo")
    assert preset("dapo", variant="dapo") == preset("dapo")
    # numpy's integers (a sweep over np.arange) are integers
    import numpy as np
    sweep = preset("grpo", group_size=np.int64(8), seed=np.int64(3))
    assert (sweep.group_size, sweep.seed) == (8, 3) and type(sweep.group_size) is int


@pytest.mark.parametrize("kw,match", [
    (dict(advantage="gae"), "needs a critic"),
    (dict(use_critic=True), "only GAE uses the critic"),
    (dict(clip_eps=0.2, clip_eps_high=0.1), "clip_eps_high=0.1 < clip_eps=0.2"),
    (dict(group_size=1), "group_size=1 with advantage='group'"),
    (dict(advantage="rloo", group_size=1), "group_size=1 with advantage='rloo'"),
    (dict(ratio_level="sequence", advantage="reinforce_pp", group_size=1), "sequence-level ratio"),
    (dict(advantage="reinforce_pp", dynamic_sampling=True), "dynamic_sampling"),
    (dict(kl_mode="none"), "kl_coef=0.005 with kl_mode='none'"),
    (dict(loss_agg="mean"), "loss_agg='mean' is not known"),
    (dict(overlong_buffer=-1), "overlong_buffer=-1"),
    # a NaN warm-up made every step's learning rate the minimum; True was taken as 1
    (dict(warmup_steps=float("nan")), "warmup_steps=nan must be an integer >= 0"),
    (dict(warmup_steps=2.5), "warmup_steps=2.5 must be an integer >= 0"),
    (dict(group_size=True), "group_size=True must be a positive integer"),
    (dict(minibatches=3), "does not divide"),
    (dict(critic_lr=1e9), "critic_lr=1000000000.0 is far too large for Adam"),
    (dict(temperature=1e-38), r"temperature=1e-38 is below 0.001"),
    # a string is a true value: "False" kept the std division on, "false" turned DAPO's filter on
    (dict(normalize_std="False"), "normalize_std='False' must be True or False"),
    (dict(dynamic_sampling="false"), "dynamic_sampling='false' must be True or False"),
    (dict(use_critic="no"), "use_critic='no' must be True or False"),
    # True was taken as 1: a learning rate of 1, a KL coefficient 200 times the preset's
    (dict(lr=True), "lr=True must be a number, not a bool"),
    (dict(kl_coef=True), "kl_coef=True must be a number, not a bool"),
    (dict(clip_eps="0.2"), "clip_eps='0.2' must be a number, not a str"),
    (dict(gamma="1"), "gamma='1' must be a number, not a str"),
    (dict(seed=1.5), "seed=1.5 must be an integer"),
    (dict(seed=True), "seed=True must be an integer"),
])
def test_conflicting_options_raise_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        RLConfig(**kw)


def test_every_conflict_is_named_at_once():
    # PPO's preset with a group baseline: its group size of 1 and its critic both conflict
    with pytest.raises(ValueError, match=r"^2 settings conflict:\n - group_size=1 with "
                                         r"advantage='group'.*\n - use_critic=True with "
                                         r"advantage='group'"):
        preset("ppo", advantage="group")


def test_switching_the_kl_mode_brings_a_matching_coefficient():
    assert preset("grpo", kl_mode="none").kl_coef == 0 and not preset("grpo", kl_mode="none").uses_reference
    assert preset("dapo", kl_mode="loss").kl_coef == 0.005  # the course default, not a silent 0
    assert preset("dapo", kl_mode="loss", kl_coef=0.01).kl_coef == 0.01
    assert preset("ppo").unused(["gamma", "lam", "critic_lr"]) == {}
    assert set(preset("grpo").unused(["gamma", "lam", "max_sampling_rounds", "normalize_std"])) == \
        {"gamma", "lam", "max_sampling_rounds"}


def test_sequence_ratio_with_gae_is_refused_for_ppo():
    with pytest.raises(ValueError, match="sequence-level ratio"):
        preset("ppo", ratio_level="sequence")


def test_concatenated_rollouts_score_as_in_their_own_batches():
    # float64: more left padding only adds masked keys, so the scores differ by rounding alone
    policy = load_checkpoint(default_sft_checkpoint(TASK))["model"].double()
    rollouts = []
    for prompts, seed in ((["1+2=", "123+456="], 0), (["99+1=", "5+5=", "800+200="], 1)):
        tokens, mask = TOK.encode_prompts(prompts)
        rollouts.append(generate(policy, tokens, mask, 6, TOK.eos_id, TOK.pad_id,
                                 generator=torch.Generator().manual_seed(seed)))
    joined = concat_rollouts(rollouts, TOK.pad_id)
    with torch.no_grad():
        together = response_log_probs(policy, joined.tokens, joined.attention_mask,
                                      joined.prompt_len)
        row = 0
        for r in rollouts:
            alone = response_log_probs(policy, r.tokens, r.attention_mask, r.prompt_len)
            width = r.response_mask.shape[1]
            rows = slice(row, row + len(r.tokens))
            assert torch.equal(joined.response_mask[rows, :width], r.response_mask)
            assert relative_error(together[rows, :width][r.response_mask],
                                  alone[r.response_mask]) <= reorder_tolerance(torch.float64, 512, 8)
            row += len(r.tokens)


def _trainer(config):
    policy = load_checkpoint(default_sft_checkpoint(TASK))["model"]
    return RLTrainer(policy, TASK, TOK, config, load_eval_set(TASK)[:10])


def test_dynamic_sampling_trains_only_on_groups_with_signal():
    trainer = _trainer(preset("dapo", prompts_per_step=16, group_size=4, eval_every=100))
    batch = trainer.collect(1)
    rewards = batch.rewards
    assert len(rewards) == 16 * 4  # refilled to the full batch
    assert groups_with_signal(rewards, 4).all()
    generated = len(batch.all_rewards)
    assert generated == 64 * batch.rounds and batch.rounds >= 2  # some groups were dropped
    assert len(batch.rollout.tokens) == 64


def test_dynamic_sampling_filters_on_accuracy_not_on_the_shaped_reward(monkeypatch):
    """DAPO eq. 11 keeps a group when 0 < #correct < G: an all-wrong group whose rewards differ
    (one answer overlong, one malformed) is dropped, a group with one right answer kept."""
    from rlm_course.tasks.base import Verdict

    trainer = _trainer(preset("dapo", prompts_per_step=2, group_size=2, eval_every=100,
                              max_sampling_rounds=1))
    group, rollout, _, _ = trainer.rollout_and_reward(1)
    wrong, malformed = Verdict(True, False, 0.1), Verdict(False, False, 0.0)
    verdicts = [wrong, malformed, wrong, Verdict(True, True, 1.1)]
    # group 0: both wrong, rewards 0.1 and -0.9 (overlong); group 1: one right, one wrong
    rewards = torch.tensor([0.1, -0.9, 0.1, 1.1])
    monkeypatch.setattr(trainer, "rollout_and_reward",
                        lambda step, round_=0: (group, rollout, verdicts, rewards))
    batch = trainer.collect(1)
    assert batch.rewards.tolist() == pytest.approx([0.1, 1.1])  # only group 1 is trained
    assert [v.correct for v in batch.verdicts] == [False, True]
    assert len(batch.all_rewards) == 4


@pytest.mark.parametrize("name,overrides", [(n, {}) for n in sorted(PRESETS)] + [
    ("grpo", {"minibatches": 1}),  # one gradient step per batch: no pi_old forward
    ("ppo", {"ppo_epochs": 2}),
    ("grpo", {"kl_coef": 0.0}),  # no reference model
])
def test_measured_passes_and_model_states_equal_the_prediction(name, overrides):
    prompts = 8 if preset(name).group_size > 1 else 32
    config = preset(name, prompts_per_step=prompts, eval_every=100, **overrides)
    trainer = _trainer(config)
    for _ in range(2):
        trainer.step()
    cost = cost_summary(trainer, wall_seconds=1.0)
    assert cost["passes_per_response"] == predict_passes(config)
    memory = cost["memory_bytes"]
    assert memory["model_states"] == memory["model_states_predicted"]
    assert set(memory["model_states"]) == {m for m, role in cost["models"].items()
                                           if role in ("trained", "frozen")}
    assert cost["responses_trained"] == 2 * prompts * config.group_size


@pytest.mark.parametrize("name", ["grpo", "ppo", "rloo"])
def test_measured_flops_of_a_step_match_the_predictor(name):
    prompts = 8 if preset(name).group_size > 1 else 32
    config = preset(name, prompts_per_step=prompts, eval_every=100)
    trainer = _trainer(config)
    measured, row = count_flops(trainer.step)
    predicted = predict_iteration_flops(
        trainer.policy.config, config, generated=row["responses_generated"],
        trained=row["responses_trained"], prompt_len=row["prompt_columns"],
        response_len=row["response_columns"], padded_keys=True)
    # forward FLOPs are exact; a backward is 2x its forward to within 0.5% (see test_model)
    assert measured == pytest.approx(predicted["total"], rel=0.01)


@pytest.mark.parametrize("name, overrides, passes", [
    ("grpo", {}, ("policy", "reference")),  # 2 minibatches reuse the batch: pi_old needed
    ("grpo", {"minibatches": 1}, ("reference",)),  # one gradient step: pi_old = pi_theta
    ("dr_grpo", {}, ("policy",)),  # no KL, no reference
    ("rloo", {"minibatches": 1}, ("policy", "reference")),  # k1 in the reward needs pi_old
    ("ppo", {}, ("policy", "reference", "critic")),
    ("gspo", {"minibatches": 1}, ()),
])
def test_scoring_passes_by_hand(name, overrides, passes):
    config = preset(name, **overrides)
    assert config.scoring_passes() == passes
    assert tuple(predict_passes(config)["scoring"]) == passes


def test_config_is_a_plain_dataclass_for_checkpoints():
    c = preset("dapo", steps=3)
    assert dataclasses.asdict(c)["variant"] == "dapo" and RLConfig(**dataclasses.asdict(c)) == c


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo"])
def test_each_preset_raises_held_out_accuracy_in_a_short_run(tmp_path, name):
    # 30 steps: each preset gains 14-26 points here (0.23 -> 0.375-0.485), well above the 5 asked
    summary = run_rl(TASK, preset(name, steps=30, eval_every=15), out_dir=tmp_path, progress=False,
                     log=lambda *a: None)
    assert summary["algorithm"] == name
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.05, summary


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_a_float64_run_computes_its_advantages_in_float64(name):
    # the rewards are float32; their advantages were too, so a float64 update differed between
    # two devices by a float32 rounding of the advantages (4e-8 on the CPU against CUDA, where the
    # float64 rounding bound is 7e-9)
    policy = load_checkpoint(default_sft_checkpoint(TASK))["model"].double()
    config = preset(name, prompts_per_step=4, minibatches=1, ppo_epochs=1, eval_every=100)
    trainer = RLTrainer(policy, TASK, TOK, config, [])
    seen, collect, train = {}, trainer.collect, trainer._train
    trainer.collect = lambda step: seen.setdefault("batch", collect(step))
    trainer._train = lambda *a, **k: (seen.setdefault("advantages", a[5]), train(*a, **k))[1]
    trainer.step()
    assert seen["batch"].rewards.dtype == torch.float32 and seen["advantages"].dtype == torch.float64
    if name == "grpo":
        rewards = seen["batch"].rewards.double()
        assert torch.equal(seen["advantages"], group_advantages(rewards, config.group_size))
