"""What an RL iteration costs: the one cost model of the course (chapters 05-14).

Architectures as numbers (:mod:`~rlm_course.cost.architectures`), the hardware catalog
(:mod:`~rlm_course.cost.hardware`), the course run's models, passes, FLOPs and memory, predicted and
measured (:mod:`~rlm_course.cost.accounting`), the same at any scale with roofline time
(:mod:`~rlm_course.cost.anatomy`), measured stages and roofline points
(:mod:`~rlm_course.cost.profiling`), FLOP counting (:mod:`~rlm_course.cost.flops`) and the
work-depth model (:mod:`~rlm_course.cost.workdepth`).

At cluster scale: alpha-beta links and collectives, and what each parallelism sends
(:mod:`~rlm_course.cost.comm`, chapters 07-11), each role's layout and its memory per device
(:mod:`~rlm_course.cost.layouts`), the seconds of each phase of an iteration on a cluster
(:mod:`~rlm_course.cost.phases`) and of weight sync (:mod:`~rlm_course.cost.weight_sync`, chapters
12 and 14), with the rates that turn FLOPs and bytes into seconds. Chapter 14's simulator
(:mod:`rlm_course.cluster`) composes them.
"""
