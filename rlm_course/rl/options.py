"""The named options of each part of an RL algorithm (see :class:`rlm_course.rl.algorithms.RLConfig`).

Plain tuples of names, with no import of torch, so that the command line can list them (and
answer ``--help``) at once; the modules that implement each option check against the same tuples.
"""

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
