"""One configuration for PPO and the GRPO family, the named options of each of its parts, and the
named presets of published algorithms.

A leaf module (no torch, no other module of the course): the RL code runs a configuration
(:mod:`rlm_course.rl`), the cost model prices it (:mod:`rlm_course.cost`), and the command line
lists its options at once, all from here. :mod:`rlm_course.rl.algorithms` re-exports it.

An algorithm here is a choice of one option per part (the parts live in
:mod:`rlm_course.rl.advantages`, :mod:`rlm_course.rl.kl`, :mod:`rlm_course.rl.losses` and
:mod:`rlm_course.rl.rewards`); :class:`rlm_course.rl.trainer.RLTrainer` runs any valid choice with
one code path. The presets (:data:`PRESETS`) are the published combinations:

    preset        advantage       ratio     clip (low/high)  aggregation              KL               extras
    ppo           GAE + critic    token     0.2 / 0.2        token-mean               k1 in reward     critic, group 1
    grpo          group, std      token     0.2 / 0.2        seq-mean-token-mean      k3 as loss
    dr_grpo       group, no std   token     0.2 / 0.2        seq-mean-token-sum-norm  none
    dapo          group, std      token     0.2 / 0.28       token-mean               none             dynamic sampling, overlong shaping
    rloo          leave-one-out   token     0.2 / 0.2        seq-mean-token-mean      k1 in reward (sequence sum)
    reinforce_pp  batch-normed    token     0.2 / 0.2        token-mean               k1 in reward (per token), group 1
    gspo          group, std      sequence  3e-4 / 4e-4      seq-mean-token-mean      none

Sources: PPO for LLMs (Ouyang et al. 2022, arXiv:2203.02155; GAE, Schulman et al. 2016,
arXiv:1506.02438); GRPO (Shao et al. 2024, arXiv:2402.03300, eq. 3); Dr. GRPO (Liu et al. 2025,
arXiv:2503.20783, section 3.1); DAPO (Yu et al. 2025, arXiv:2503.14476, eqs. 8-13); RLOO (Ahmadian
et al. 2024, arXiv:2402.14740, eq. 5); REINFORCE++ (Hu et al. 2025, arXiv:2501.03262, section 3);
GSPO (Zheng et al. 2025, arXiv:2507.18071, eqs. 5-7). The KL coefficient of every preset with a KL
term is the course's 0.005 (the papers use 0.001-0.04 on far larger models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from rlm_course.utils import is_real, plain_ints

# ---------------------------------------------------------------------------------- the options
# Plain tuples of names, so that the command line can list them (and answer --help) at once; the
# modules that implement each option check against the same tuples.
#: Advantage estimators (:mod:`rlm_course.rl.advantages`).
ADVANTAGES = ("group", "rloo", "reinforce_pp", "gae")
#: Advantages that compare the responses of one prompt with each other (need ``group_size >= 2``).
GROUP_ADVANTAGES = ("group", "rloo")
#: Advantages with one value per token (the rest give one value per response).
TOKEN_ADVANTAGES = ("gae", "reinforce_pp")
#: Importance ratio per token (PPO, GRPO) or per sequence (GSPO) (:mod:`rlm_course.rl.losses`).
RATIO_LEVELS = ("token", "sequence")
#: Loss aggregations (:func:`rlm_course.rl.losses.aggregate_loss`).
AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
#: Where the KL to the reference goes: nowhere, into the loss, or into the reward.
KL_MODES = ("none", "loss", "reward")
#: KL estimators (:func:`rlm_course.rl.kl.kl_estimate`).
KL_ESTIMATORS = ("k1", "k2", "k3")
#: The policy loss clamps a log-ratio to +-20 before ``exp`` (a ratio of 5e8 either way), as
#: veRL does (``core_algos.compute_policy_loss``): past about 88.7 nats ``exp`` overflows float32,
#: and even where the loss then clips or masks the value, the backward pass multiplies a zero
#: gradient by inf and writes NaN into the weights. The behaviour weights of
#: :mod:`rlm_course.rl.off_policy` are clamped alike, so a correction cap must lie below exp(20).
LOG_RATIO_CLAMP = 20.0


def check_correction_cap(cap, name: str = "correction_cap") -> None:
    """Refuse a truncation/masking cap of the off-policy corrections that is not a number from 1
    to below ``exp(LOG_RATIO_CLAMP)`` (a weight below 1 is never truncated or masked, and the
    weights are clamped at ``exp(LOG_RATIO_CLAMP)``).

    Raises:
        ValueError: naming ``name``, the value and the range.
    """
    if (isinstance(cap, bool) or not isinstance(cap, (int, float))
            or not 1.0 <= cap < math.exp(LOG_RATIO_CLAMP)):  # NaN fails too
        raise ValueError(f"{name}={cap!r} must be a number from 1 to below "
                         f"exp({LOG_RATIO_CLAMP:g}) = {math.exp(LOG_RATIO_CLAMP):.3g}, where the "
                         "weights are clamped (2 is typical; AReaL and TRL use 2-5); a weight "
                         "below 1 is never truncated or masked.")


def check_dual_clip(clip_c, name: str = "dual clip c") -> None:
    """Refuse a dual-clip bound that is neither None nor a finite number above 1 (at 1 or below,
    it would cap the loss of a negative advantage at ratios PPO itself keeps; verl asserts the
    same).

    Raises:
        ValueError: naming ``name``, the value and the fix.
    """
    if clip_c is not None and (isinstance(clip_c, bool) or not isinstance(clip_c, (int, float))
                               or not 1.0 < clip_c < math.inf):  # NaN fails too
        raise ValueError(f"{name}={clip_c!r} must be a finite number above 1 (verl uses 3), or "
                         "none to turn it off.")


#: Corrections for tokens sampled by another policy than the proximal one (staleness, the
#: rollout/trainer mismatch): :mod:`rlm_course.rl.off_policy`.
CORRECTIONS = ("none", "is", "tis", "mis", "seq-tis", "seq-mis")
#: Numerics of the rollout engine's copy of the policy (:mod:`rlm_course.lm.precision`): the
#: trainer's own (fp32), bf16 weights and activations, or weights rounded to fp8 (e4m3).
PRECISIONS = ("fp32", "bf16", "fp8")

#: The lowest sampling temperature a run accepts: logits of up to 1e35 divided by it stay finite
#: in float32 (at 1e-38 they overflow and sampling fails).
MIN_TEMPERATURE = 1e-3
MAX_BATCH = 16384  # responses per step; more does not fit a laptop's memory comfortably


# ---------------------------------------------------------------------------------- the presets
_GRPO = dict(advantage="group", normalize_std=True, ratio_level="token", clip_eps=0.2,
             clip_eps_high=None, loss_agg="seq-mean-token-mean", kl_mode="loss", kl_estimator="k3",
             kl_coef=0.005, dynamic_sampling=False, overlong_buffer=0, use_critic=False)

#: Published combinations: preset name -> the fields it sets (everything else keeps its default).
PRESETS: dict[str, dict] = {
    "ppo": {**_GRPO, "advantage": "gae", "use_critic": True, "group_size": 1,
            "prompts_per_step": 512, "loss_agg": "token-mean", "kl_mode": "reward",
            "kl_estimator": "k1"},
    "grpo": dict(_GRPO),
    "dr_grpo": {**_GRPO, "normalize_std": False, "loss_agg": "seq-mean-token-sum-norm",
                "kl_mode": "none", "kl_coef": 0.0},
    "dapo": {**_GRPO, "clip_eps_high": 0.28, "loss_agg": "token-mean", "kl_mode": "none",
             "kl_coef": 0.0, "dynamic_sampling": True, "overlong_buffer": 2},
    "rloo": {**_GRPO, "advantage": "rloo", "kl_mode": "reward", "kl_estimator": "k1"},
    "reinforce_pp": {**_GRPO, "advantage": "reinforce_pp", "group_size": 1,
                     "prompts_per_step": 512, "loss_agg": "token-mean", "kl_mode": "reward",
                     "kl_estimator": "k1"},
    "gspo": {**_GRPO, "ratio_level": "sequence", "clip_eps": 3e-4, "clip_eps_high": 4e-4,
             "kl_mode": "none", "kl_coef": 0.0},
}


# ---------------------------------------------------------------------------------- the configuration
@dataclass
class RLConfig:
    """Every setting of one RL run: the schedule, and one option per part of the algorithm.

    Schedule: ``steps`` iterations of ``prompts_per_step`` prompts x ``group_size`` responses;
    ``ppo_epochs`` passes over each batch in ``minibatches`` gradient steps; AdamW at ``lr`` with a
    linear warm-up and a cosine decay (:meth:`lr_at`).

    Algorithm parts:
        advantage: ``group`` (GRPO; ``normalize_std=False`` is Dr. GRPO), ``rloo`` (leave-one-out),
            ``reinforce_pp`` (per-token return, normalised over the batch), ``gae`` (PPO; needs
            ``use_critic``).
        ratio_level: ``token`` (PPO/GRPO) or ``sequence`` (GSPO, length-normalised).
        clip_eps, clip_eps_high: epsilon_low and epsilon_high of the clipped objective
            (``clip_eps_high=None`` is symmetric; DAPO's clip-higher raises only the upper bound).
        dual_clip: dual-clip PPO's ``c`` > 1 (Ye et al. 2020): the loss of a token with a
            negative advantage is at most ``-c A`` (:func:`rlm_course.rl.losses.clipped_objective`;
            None: off, as in the published presets here; verl defaults to 3).
        loss_agg: ``seq-mean-token-mean`` (GRPO), ``token-mean`` (DAPO, PPO),
            ``seq-mean-token-sum-norm`` (Dr. GRPO, divided by the generation budget).
        kl_mode: ``none`` (no reference model), ``loss`` (``kl_coef * KL`` added to the loss, GRPO)
            or ``reward`` (``-kl_coef * KL`` added to the reward: per token for token-level
            advantages, summed over the response for response-level ones); ``kl_estimator`` k1/k2/k3.
        entropy_coef: weight of an entropy bonus (0: off).
        dynamic_sampling: DAPO's filter: drop groups whose answers are all right or all wrong
            (arXiv:2503.14476, eq. 11) and sample more prompts, up to ``max_sampling_rounds``
            generation rounds, until ``prompts_per_step`` groups carry signal.
        overlong_buffer: DAPO's overlong shaping: the generation budget grows by this many tokens
            past the task's longest valid response, and a response reaching into them loses up to 1
            reward (0: off).
        use_critic, gamma, lam, critic_lr, value_clip, value_coef: PPO's critic and GAE.
        rollout_precision: the numerics the rollout engine samples with (``fp32``: the trainer's
            own; ``bf16``, ``fp8``: a rounded copy, synced every step, whose log-probs differ
            from the trainer's for the same weights: chapter 13's mismatch).
        correction, correction_cap: how the loss weighs tokens sampled by another policy than
            the proximal one (:data:`CORRECTIONS`, :mod:`rlm_course.rl.off_policy`) and the cap
            of the truncating and masking ones.
        variant: the preset this configuration started from; names the run.

    Raises:
        ValueError: for a value out of range, or a combination that makes no sense (GAE without a
            critic, a critic without GAE, ``clip_eps_high < clip_eps``, a group baseline or dynamic
            sampling with ``group_size`` 1, a sequence-level ratio with per-token advantages, a KL
            coefficient with ``kl_mode='none'``, k1 as a loss, whose expected gradient is zero);
            the message names the conflict and the fix.
    """

    variant: str = field(default="grpo", metadata={
        "help": "the preset this configuration starts from (the other flags override parts of "
                "it); names the run",
        "choices": PRESETS
    })
    steps: int = field(default=300, metadata={"help": "RL iterations"})
    prompts_per_step: int = field(default=64, metadata={"help": "prompts sampled per iteration"})
    group_size: int = field(default=8, metadata={"help": "responses per prompt (GRPO's G)"})
    ppo_epochs: int = field(default=1, metadata={"help": "passes over each batch"})
    minibatches: int = field(default=2, metadata={
        "help": "gradient steps per pass (they split the batch)"
    })
    lr: float = field(default=3e-4, metadata={"help": "AdamW learning rate of the policy"})
    warmup_steps: int = field(default=20, metadata={
        "help": "iterations of linear learning-rate warm-up"
    })
    min_lr_ratio: float = field(default=0.1, metadata={
        "help": "the cosine decay's final learning rate, as a fraction of lr"
    })
    temperature: float = field(default=1.0, metadata={
        "help": "sampling temperature (the log-probs of every pass use it too)"
    })
    max_grad_norm: float = field(default=1.0, metadata={
        "help": "gradient-norm clipping of the policy"
    })
    eval_every: int = field(default=25, metadata={
        "help": "held-out greedy accuracy every this many iterations"
    })
    seed: int = field(default=0, metadata={"help": "seed of the prompts, sampling and shuffling"})
    advantage: str = field(default="group", metadata={
        "help": "advantage estimator",
        "choices": ADVANTAGES
    })
    normalize_std: bool = field(default=True, metadata={
        "help": "divide group advantages by the group's standard deviation (off: Dr. GRPO)"
    })
    ratio_level: str = field(default="token", metadata={
        "help": "importance ratio per token (PPO, GRPO) or per sequence (GSPO)",
        "choices": RATIO_LEVELS
    })
    clip_eps: float = field(default=0.2, metadata={"help": "lower clip epsilon of the ratio"})
    clip_eps_high: float | None = field(default=None, metadata={
        "help": "upper clip epsilon (DAPO's clip-higher; 'none': the lower one)"
    })
    dual_clip: float | None = field(default=None, metadata={
        "help": "dual-clip PPO's c: a negative advantage's token loss is at most -c A, however "
                "large its ratio (verl's clip_ratio_c, 3 there; 'none': off)"
    })
    loss_agg: str = field(default="seq-mean-token-mean", metadata={
        "help": "how token losses are averaged into the loss",
        "choices": AGGREGATIONS
    })
    kl_mode: str = field(default="loss", metadata={
        "help": "where the KL to the reference goes",
        "choices": KL_MODES
    })
    kl_estimator: str = field(default="k3", metadata={
        "help": "KL estimator",
        "choices": KL_ESTIMATORS
    })
    kl_coef: float = field(default=0.005, metadata={"help": "KL coefficient (0: off)"})
    entropy_coef: float = field(default=0.0, metadata={
        "help": "entropy bonus coefficient (0: off)"
    })
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO's filter: drop groups whose answers are all right or all wrong and "
                "sample more"
    })
    max_sampling_rounds: int = field(default=4, metadata={
        "help": "most generation rounds of dynamic sampling per iteration"
    })
    overlong_buffer: int = field(default=0, metadata={
        "help": "DAPO's overlong shaping: tokens of soft penalty past the longest valid "
                "response (0: off)"
    })
    use_critic: bool = field(default=False, metadata={
        "help": "train PPO's critic (with --advantage gae)"
    })
    gamma: float = field(default=1.0, metadata={"help": "discount of per-token returns"})
    lam: float = field(default=0.95, metadata={"help": "GAE's lambda"})
    critic_lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the critic"})
    value_clip: float = field(default=0.2, metadata={
        "help": "clip range of the critic's value loss"
    })
    value_coef: float = field(default=1.0, metadata={"help": "weight of the value loss"})
    rollout_precision: str = field(default="fp32", metadata={
        "help": "numerics of the rollout engine's copy of the policy (bf16, fp8: a rounded copy "
                "whose log-probs differ from the trainer's)",
        "choices": PRECISIONS
    })
    correction: str = field(default="none", metadata={
        "help": "off-policy correction of tokens the proximal policy did not sample: none, is "
                "(AReaL eq. 5), tis (truncate), mis (mask, AReaL's code), seq-tis, seq-mis",
        "choices": CORRECTIONS
    })
    correction_cap: float = field(default=2.0, metadata={
        "help": "cap of the truncating and masking corrections (>= 1)"
    })

    @property
    def algorithm(self) -> str:
        return self.variant

    @property
    def clip_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def uses_reference(self) -> bool:
        """A frozen reference model is held only when a KL term is on."""
        return self.kl_mode != "none" and self.kl_coef > 0

    @property
    def reuses_batch(self) -> bool:
        """More than one gradient step per batch: then the policy moves between steps and the
        ratio needs the log-probs of the policy that sampled the batch (one extra forward)."""
        return self.ppo_epochs * self.minibatches > 1

    def scoring_passes(self) -> tuple[str, ...]:
        """The models that score a batch before its update, one forward pass each without
        gradient, in this order: ``"policy"`` (the log-probs of the policy that sampled the batch,
        when the batch is reused across gradient steps, the KL goes into the reward or an
        off-policy correction or a rounded rollout engine compares them with the rollout's),
        ``"reference"`` (when a KL term is on) and ``"critic"`` (PPO's values).

        :meth:`rlm_course.rl.trainer.RLTrainer.step` runs exactly these, and the cost model prices
        them (:func:`rlm_course.cost.accounting.predict_passes`)."""
        passes = []
        if self.reuses_batch or (self.kl_mode == "reward" and self.uses_reference) or \
                self.correction != "none" or self.rollout_precision != "fp32":
            passes.append("policy")
        if self.uses_reference:
            passes.append("reference")
        if self.use_critic:
            passes.append("critic")
        return tuple(passes)

    def __post_init__(self) -> None:
        self._check_values()
        self._check_combination()

    def _check_values(self) -> None:
        plain_ints(self)  # numpy's integers (a sweep's np.arange) as Python's
        for name in ("normalize_std", "dynamic_sampling", "use_critic"):
            if not isinstance(getattr(self, name), bool):  # "False" is a true string
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False.")
        for name in ("lr", "min_lr_ratio", "temperature", "max_grad_norm", "clip_eps",
                     "clip_eps_high", "dual_clip", "kl_coef", "entropy_coef", "gamma", "lam",
                     "critic_lr", "value_clip", "value_coef", "correction_cap"):
            value = getattr(self, name)
            if not (is_real(value) or (value is None and name in ("clip_eps_high", "dual_clip"))):
                raise ValueError(f"{name}={value!r} must be a number, not a "
                                 f"{type(value).__name__}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an integer.")
        for name, allowed in (("advantage", ADVANTAGES), ("ratio_level", RATIO_LEVELS),
                              ("loss_agg", AGGREGATIONS), ("kl_mode", KL_MODES),
                              ("kl_estimator", KL_ESTIMATORS), ("correction", CORRECTIONS),
                              ("rollout_precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not known; choose one of "
                                 f"{', '.join(allowed)}.")
        if self.variant not in PRESETS:
            raise ValueError(f"variant={self.variant!r} is not a preset; choose one of "
                             f"{', '.join(PRESETS)}.")
        for name in ("steps", "prompts_per_step", "group_size", "ppo_epochs", "minibatches",
                     "eval_every", "max_sampling_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value} must be a positive integer.")
        for name in ("warmup_steps", "overlong_buffer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value} must be an integer >= 0.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1].")
        for name in ("lr", "clip_eps", "temperature", "max_grad_norm", "critic_lr", "value_clip",
                     "value_coef", *(("clip_eps_high",) if self.clip_eps_high is not None else ())):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value} must be a positive finite number.")
        check_correction_cap(self.correction_cap)
        check_dual_clip(self.dual_clip, "dual_clip")
        for name in ("lr", "critic_lr"):
            if getattr(self, name) > 1.0:
                raise ValueError(f"{name}={getattr(self, name)} is far too large for Adam (use "
                                 "1e-4 to 1e-3).")
        if self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={self.temperature} is below {MIN_TEMPERATURE:g}: the "
                             "logits divided by it leave float range; sample at 1e-3 or more, or "
                             "evaluate greedily (vLLM treats temperatures under 1e-5 as greedy).")
        if self.clip_eps >= 1.0:
            raise ValueError(f"clip_eps={self.clip_eps}: the lower clip bound 1 - clip_eps would not "
                             "be positive; use a value below 1 (0.2 is typical).")
        for name in ("kl_coef", "entropy_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value} must be a finite number >= 0 (0 turns it off).")
        for name in ("gamma", "lam"):  # NaN fails too
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1].")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed} must be in [0, 2**63).")
        batch = self.prompts_per_step * self.group_size
        if batch > MAX_BATCH:
            raise ValueError(f"prompts_per_step x group_size = {batch} responses per step is more "
                             f"than {MAX_BATCH}; lower --prompts-per-step or --group-size.")
        if batch % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} does not divide the batch of "
                             f"{batch} responses (prompts_per_step x group_size); change "
                             "--minibatches or --prompts-per-step.")

    def _check_combination(self) -> None:
        """Refuse combinations that make no sense, every one of them at once (fixing one to meet
        the next would take as many runs as there are conflicts)."""
        problems: list[str] = []
        if self.advantage in GROUP_ADVANTAGES and self.group_size < 2:
            problems.append(f"group_size={self.group_size} with advantage={self.advantage!r}: a "
                            "group baseline needs at least 2 responses per prompt; use "
                            "--group-size 2 or more (8 is typical), or an advantage without a "
                            "group (gae, reinforce_pp).")
        if self.advantage == "gae" and not self.use_critic:
            problems.append("advantage='gae' needs a critic for V(s_t): set use_critic=True (--use-critic; "
                            "--variant ppo sets it), or choose a critic-free advantage (group, rloo, "
                            "reinforce_pp).")
        if self.use_critic and self.advantage != "gae":
            problems.append(f"use_critic=True with advantage={self.advantage!r}: only GAE uses the "
                            "critic's values, so it would be trained for nothing; drop the critic "
                            "(--no-use-critic) or use advantage='gae' (--advantage gae).")
        if self.clip_eps_high is not None and self.clip_eps_high < self.clip_eps:
            problems.append(f"clip_eps_high={self.clip_eps_high} < clip_eps={self.clip_eps}: "
                            "the upper clip bound must be at least the lower one (DAPO's "
                            "clip-higher raises it, e.g. --clip-eps 0.2 --clip-eps-high 0.28).")
        if self.ratio_level == "sequence" and self.advantage in TOKEN_ADVANTAGES:
            problems.append(f"ratio_level='sequence' with advantage={self.advantage!r}: a "
                            "sequence-level ratio weighs one advantage per response, but "
                            f"{self.advantage} gives one per token (and puts a per-token KL in the "
                            "reward); use advantage group or rloo with a sequence ratio, or "
                            "ratio_level='token' (--ratio-level token).")
        if self.ratio_level == "sequence" and self.correction in ("is", "tis", "mis"):
            problems.append(f"correction={self.correction!r} with ratio_level='sequence': GSPO "
                            "weighs whole responses, so weigh them with a sequence correction "
                            "(--correction seq-tis or seq-mis), or use ratio_level='token'.")
        if self.dynamic_sampling and self.advantage not in GROUP_ADVANTAGES:
            problems.append(f"dynamic_sampling with advantage={self.advantage!r}: the filter drops "
                            "groups whose answers are all right or all wrong, so it needs a group "
                            "advantage "
                            "(group, rloo) and group_size >= 2 (--advantage group --group-size 8).")
        if self.kl_mode == "loss" and self.kl_estimator == "k1" and self.kl_coef > 0:
            problems.append("kl_estimator='k1' with kl_mode='loss': as a loss on tokens sampled "
                            "from the policy, k1 = log pi_theta - log pi_ref has expected gradient "
                            "E[grad log pi_theta] = 0, so it would not hold the policy near the "
                            "reference; use k3 (GRPO's) or k2 as a loss (--kl-estimator k3), or "
                            "put k1 in the reward (--kl-mode reward).")
        if self.kl_mode == "none" and self.kl_coef > 0:
            problems.append(f"kl_coef={self.kl_coef} with kl_mode='none': the coefficient would be "
                            "ignored; set kl_coef 0 (--kl-coef 0), or kl_mode 'loss' or 'reward'.")
        if len(problems) == 1:
            raise ValueError(problems[0])
        if problems:
            raise ValueError(f"{len(problems)} settings conflict:\n - " + "\n - ".join(problems))

    def unused(self, names) -> dict[str, str]:
        """Which of the settings ``names`` this combination ignores, and why: e.g. the critic's
        settings without a critic. The CLI refuses such flags instead of ignoring them."""
        why = {}
        for name in names:
            if name in ("lam", "critic_lr", "value_clip", "value_coef") and not self.use_critic:
                why[name] = "only PPO's critic and GAE use it (--variant ppo)"
            elif name == "gamma" and self.advantage not in TOKEN_ADVANTAGES:
                why[name] = "only per-token advantages (gae, reinforce_pp) discount"
            elif name == "normalize_std" and self.advantage != "group":
                why[name] = "only the group advantage divides by a standard deviation"
            elif name == "max_sampling_rounds" and not self.dynamic_sampling:
                why[name] = "it bounds dynamic sampling, which is off (--dynamic-sampling)"
            elif name == "correction_cap" and self.correction in ("none", "is"):
                why[name] = (f"correction {self.correction!r} has no cap (--correction tis, mis, "
                             "seq-tis or seq-mis)")
            elif name == "kl_estimator" and not self.uses_reference:
                why[name] = "no KL term is on (kl_mode none or kl_coef 0)"
        return why

    def lr_at(self, step: int) -> float:
        """Learning rate of ``step`` (1-based): linear warm-up over ``warmup_steps`` (Adam's first
        updates move every weight by about ``lr`` whatever its gradient), then a cosine decay to
        ``min_lr_ratio * lr`` at ``steps`` (Loshchilov & Hutter 2017, arXiv:1608.03983), so the
        final policy is not the noisiest one."""
        if step <= self.warmup_steps:
            return self.lr * step / max(self.warmup_steps, 1)
        progress = min(1.0, (step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


def preset(name: str, **overrides) -> RLConfig:
    """The configuration of preset ``name`` (see :data:`PRESETS`), with ``overrides`` applied.

    Raises:
        ValueError: for an unknown preset or field, or an invalid resulting combination.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown variant {name!r}; choose one of {', '.join(PRESETS)}.")
    known = {f.name for f in fields(RLConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; the settings are "
                         f"{', '.join(sorted(known))}.")
    if "variant" in overrides and overrides["variant"] != name:
        raise ValueError(f"preset({name!r}, variant={overrides['variant']!r}): the variant names "
                         f"the preset the settings come from; call preset({overrides['variant']!r}"
                         ", ...) for that one's settings.")
    settings = {**PRESETS[name], "variant": name, **overrides}
    if "kl_mode" in overrides and "kl_coef" not in overrides:
        # switching the KL off drops the preset's coefficient; switching it on gives it one
        if overrides["kl_mode"] == "none":
            settings["kl_coef"] = 0.0
        elif settings["kl_coef"] == 0:
            settings["kl_coef"] = _GRPO["kl_coef"]
    return RLConfig(**settings)


def GRPOConfig(**overrides) -> RLConfig:  # noqa: N802 (reads as the constructor it stands for)
    """GRPO's settings (the ``grpo`` preset: group advantages with std, token ratio, clip 0.2,
    seq-mean-token-mean, k3 KL as a loss with coefficient 0.005) with ``overrides``.

    Raises:
        ValueError: see :class:`RLConfig`.
    """
    return preset("grpo", **overrides)


def PPOConfig(**overrides) -> RLConfig:  # noqa: N802 (reads as the constructor it stands for)
    """PPO's settings (the ``ppo`` preset: critic and GAE with gamma 1, lambda 0.95, whitened
    advantages, k1 KL in the per-token reward, token-mean clipped loss, one response per prompt,
    512 prompts per step) with ``overrides``.

    Raises:
        ValueError: see :class:`RLConfig`.
    """
    return preset("ppo", **overrides)
