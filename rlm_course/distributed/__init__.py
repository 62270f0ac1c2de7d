"""Real ``torch.distributed`` programs on several processes (chapter 11); the simulated ranks of
chapters 07-10 stay in :mod:`rlm_course.parallel`.

* :mod:`~rlm_course.distributed.launch`: start ranks from a notebook or a script
  (``torch.multiprocessing``), backend by device (gloo on CPU, NCCL on CUDA), free ports, one
  thread per rank, every rank's result or traceback; :func:`~rlm_course.distributed.launch.
  init_from_env` joins a group that ``torchrun`` set up;
* :mod:`~rlm_course.distributed.__main__`: the same workers under ``torchrun``
  (``python -m rlm_course.distributed <worker>``), on one machine or several, and
  :mod:`~rlm_course.distributed.torchrun`, the command that runs them;
* :mod:`~rlm_course.distributed.comm`: what goes over a process group: every call counted with
  the simulator's byte conventions, communication time from the profiler, socket bytes;
* :mod:`~rlm_course.distributed.collectives`: the collective benchmark (nccl-tests' bus
  bandwidth) and the alpha-beta fit that drives chapter 07's ``World``;
* :mod:`~rlm_course.distributed.strategies`: DDP, FSDP2, tensor (and sequence) parallelism with
  DTensor, and pipeline schedules on TinyGPT, checked against one device and the formulas;
* :mod:`~rlm_course.distributed.grpo`: data-parallel GRPO with the course's ``RLTrainer``;
* :mod:`~rlm_course.distributed.by_hand`: a ring all-reduce and DDP's bucketing, written by hand
  (the chapter's exercises);
* :mod:`~rlm_course.distributed.demo`: small workers that show a group and its failures.
"""
