"""Reinforcement learning for the language model (chapters 00, 02-04; the trainer runs in every
later chapter's measurements).

One module per concept of the algorithms: :mod:`~rlm_course.rl.advantages` (group, leave-one-out,
REINFORCE++, GAE), :mod:`~rlm_course.rl.kl` (k1, k2, k3), :mod:`~rlm_course.rl.losses` (ratio,
clipped objective, aggregation), :mod:`~rlm_course.rl.off_policy` (behaviour importance weights:
AReaL's eq. 5, TIS, MIS; the mismatch statistics), :mod:`~rlm_course.rl.rewards` (DAPO's overlong penalty and
dynamic-sampling filter), :mod:`~rlm_course.rl.masked` (means over response tokens); the
configuration and published presets (:mod:`~rlm_course.rl.algorithms`); the models and loops that
use them: :mod:`~rlm_course.rl.critic`, :mod:`~rlm_course.rl.trainer` (one loop for every preset),
:mod:`~rlm_course.rl.sft` (the warm start), :mod:`~rlm_course.rl.evaluate` (held-out accuracy),
:mod:`~rlm_course.rl.runs` (the command-line job with checkpoints and resume) and
:mod:`~rlm_course.rl.experiments` (the family comparison of chapter 04)."""
