"""Simulated multi-device parallelism inside one process (chapters 07-10): a world of ranks whose
collectives count the bytes each rank sends and receives and time themselves with an alpha-beta
model (:mod:`~rlm_course.parallel.world`), and one module per strategy: data parallelism and ZeRO
(:mod:`~rlm_course.parallel.data_parallel`), Megatron tensor and sequence parallelism
(:mod:`~rlm_course.parallel.tensor_parallel`), pipeline schedules
(:mod:`~rlm_course.parallel.pipeline`), ring attention (:mod:`~rlm_course.parallel.context_parallel`),
DeepSpeed-Ulysses sequence parallelism (:mod:`~rlm_course.parallel.ulysses`), mixture-of-experts
all-to-all (:mod:`~rlm_course.parallel.expert_parallel`), and the three of data, pipeline and
tensor parallelism at once on a mesh (:mod:`~rlm_course.parallel.mesh_parallel`); benchmarks of
all of them (:mod:`~rlm_course.parallel.bench`). Their seconds at cluster scale are in
:mod:`rlm_course.cost.comm`."""
