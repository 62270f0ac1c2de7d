"""How the models of an RL pipeline share a cluster (chapters 12-14).

At cluster scale (chapter 14): communication in seconds over the catalog's links, per
parallelism strategy (:mod:`~rlm_course.systems.comm`), each role's layout on devices and its
memory per device (:mod:`~rlm_course.systems.layouts`), the seconds of each phase of an iteration
(:mod:`~rlm_course.systems.phases`), a discrete-event simulator of whole iterations on SimPy
(:mod:`~rlm_course.systems.simulator`), its checks against measured runs and published figures
(:mod:`~rlm_course.systems.validation`), and a planner that searches placements, layouts and
execution modes (:mod:`~rlm_course.systems.planner`, with an ipywidgets front-end in
:mod:`~rlm_course.systems.planner_widget`). Chapters 07-10 use the communication seconds.

On real processes (chapters 12-13): a single controller on Ray whose worker groups are placed
colocated or disaggregated by a device mapping, each group a ``torch.distributed`` group
(:mod:`~rlm_course.systems.controller`, with the workers of :mod:`~rlm_course.systems.workers`);
weight sync from the trainer to the rollout engine in fixed-size buckets and its alpha-beta model
(:mod:`~rlm_course.systems.weight_sync`); hybrid-engine resharding from the training layout to the
generation layout, naive and HybridFlow's (:mod:`~rlm_course.systems.resharding`); asynchronous
RL: policy versions, the staleness gate, partial rollouts, the decoupled PPO objective and the
pipeline that runs them (:mod:`~rlm_course.systems.async_rl`); stage fusion against long-tailed
responses (:mod:`~rlm_course.systems.fusion`); and the timelines every worker records
(:mod:`~rlm_course.systems.timeline`).
"""
