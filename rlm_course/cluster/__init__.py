"""Plan a cluster (chapter 14): whole RL iterations on 8 to 10,000 simulated GPUs.

A discrete-event simulator of iterations on SimPy (:mod:`~rlm_course.cluster.simulator`) whose
every phase is priced by the one cost model of :mod:`rlm_course.cost` (stage seconds in
:mod:`~rlm_course.cost.phases`, memory per device in :mod:`~rlm_course.cost.layouts`, collectives
in :mod:`~rlm_course.cost.comm`, weight sync in :mod:`~rlm_course.cost.weight_sync`); its check
against measured runs and published figures, calibrated once on a declared set and predicting the
rest (:mod:`~rlm_course.cluster.validation`); and a planner that searches placements, layouts and
execution modes (:mod:`~rlm_course.cluster.planner`, with an ipywidgets front-end in
:mod:`~rlm_course.cluster.planner_widget`).
"""
