"""How the models of an RL pipeline share a cluster, on real processes (chapters 12-13).

A single controller on Ray whose worker groups are placed colocated or disaggregated by a device
mapping, each group a ``torch.distributed`` group (:mod:`~rlm_course.systems.controller`, with the
workers of :mod:`~rlm_course.systems.workers`, one mixin per role, and the drivers of the
experiments in :mod:`~rlm_course.systems.pipelines`); weight sync from the trainer to the rollout engine
in fixed-size buckets, measured against the cost model of :mod:`rlm_course.cost.weight_sync`
(:mod:`~rlm_course.systems.weight_sync`), or only the bf16 weights that changed
(:mod:`~rlm_course.systems.delta_sync`); hybrid-engine resharding from the training layout to the
generation layout, naive and HybridFlow's (:mod:`~rlm_course.systems.resharding`); asynchronous
RL: policy versions, the staleness gate, partial rollouts and the decoupled PPO objective
(:mod:`~rlm_course.systems.async_rl`); the rollout/trainer numeric mismatch, measured
(:mod:`~rlm_course.systems.mismatch`); stage fusion against long-tailed
responses (:mod:`~rlm_course.systems.fusion`); and the timelines every worker records
(:mod:`~rlm_course.systems.timeline`).

The same questions at cluster scale are priced by :mod:`rlm_course.cost` and simulated by
:mod:`rlm_course.cluster` (chapter 14).
"""
