"""rlm_course: performance foundations of parallel and distributed RL for reasoning LMs."""

__version__ = "0.1.0"
