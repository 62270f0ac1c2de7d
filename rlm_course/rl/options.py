"""The named options of each part of an RL algorithm; they live in :mod:`rlm_course.algorithms`
(a leaf module that the cost model and the command line import too) and are re-exported here."""

from rlm_course.algorithms import (ADVANTAGES, AGGREGATIONS, GROUP_ADVANTAGES, KL_ESTIMATORS,
                                   KL_MODES, RATIO_LEVELS, TOKEN_ADVANTAGES)

__all__ = ["ADVANTAGES", "AGGREGATIONS", "GROUP_ADVANTAGES", "KL_ESTIMATORS", "KL_MODES",
           "RATIO_LEVELS", "TOKEN_ADVANTAGES"]
