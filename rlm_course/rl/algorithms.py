"""The RL configuration (:class:`RLConfig`) and the published presets (:data:`PRESETS`).

They live in :mod:`rlm_course.algorithms`, a leaf module without torch, so that the cost model
(:mod:`rlm_course.cost`) can price an algorithm without importing the RL code; this module
re-exports them where the RL code and the notebooks look for them.
"""

from rlm_course.algorithms import (ADVANTAGES, AGGREGATIONS, GROUP_ADVANTAGES, KL_ESTIMATORS,
                                   KL_MODES, MAX_BATCH, PRESETS, RATIO_LEVELS, TOKEN_ADVANTAGES,
                                   GRPOConfig, PPOConfig, RLConfig, preset)

__all__ = ["ADVANTAGES", "AGGREGATIONS", "GROUP_ADVANTAGES", "KL_ESTIMATORS", "KL_MODES",
           "MAX_BATCH", "PRESETS", "RATIO_LEVELS", "TOKEN_ADVANTAGES", "GRPOConfig", "PPOConfig",
           "RLConfig", "preset"]
