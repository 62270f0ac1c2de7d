"""What an RL iteration costs (chapters 05-06; the parallelism chapters use its formulas):
architectures as numbers (:mod:`~rlm_course.cost.architectures`), the hardware catalog
(:mod:`~rlm_course.cost.hardware`), the course run's models, passes, FLOPs and memory, predicted and
measured (:mod:`~rlm_course.cost.accounting`), the same at any scale with roofline time
(:mod:`~rlm_course.cost.anatomy`), measured stages and roofline points
(:mod:`~rlm_course.cost.profiling`), FLOP counting (:mod:`~rlm_course.cost.flops`) and the
work-depth model (:mod:`~rlm_course.cost.workdepth`)."""
