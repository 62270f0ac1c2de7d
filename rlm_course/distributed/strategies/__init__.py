"""TinyGPT trained with every intra-model strategy on real processes: each equal to one device, and
each sending the bytes the simulators of chapters 07-09 predict.

Strategies (:data:`STRATEGIES`), all with ``torch.distributed``'s own implementations:

* ``ddp``: ``DistributedDataParallel``; each rank trains on ``batch / p`` rows, the gradients are
  all-reduced (averaged) in buckets during backward.
* ``fsdp2``: ``fully_shard`` on every block, then on the model (the root group holds the
  embeddings, the final norm and the head), with ``reshard_after_forward=True`` everywhere:
  parameters are gathered for the forward and again for the backward, gradients reduce-scattered.
  (By default FSDP2 keeps the root's parameters gathered between forward and backward, saving one
  all-gather of the root group.)
* ``tp``: DTensor's ``parallelize_module`` on every block: the QKV projection and the MLP's first
  layer column-wise, the attention output and the MLP's second layer row-wise (Megatron's split);
  embeddings, norms and head are replicated. The QKV rows are stored head by head
  (:class:`HeadParallelAttention`) so that a column shard holds whole heads.
* ``tp_sp``: the same plus sequence parallelism: norms and residuals work on sequence shards
  (``SequenceParallel``), the column-wise layers all-gather the sequence and the row-wise ones
  reduce-scatter it; the model enters the sequence layout before its first block and leaves it
  after its last.
* ``pp_gpipe``, ``pp_1f1b``, ``pp_interleaved``, ``pp_zero_bubble``: ``torch.distributed.
  pipelining`` stages (the blocks split evenly; the first stage also embeds, the last also
  normalises and projects to the vocabulary) run by ``ScheduleGPipe``, ``Schedule1F1B``,
  ``ScheduleInterleaved1F1B`` (two stages per rank, looped) and ``ScheduleInterleavedZeroBubble``
  (two stages per rank; the backward split into input and weight gradients).

**Equal to one device.** :func:`equivalence_worker` trains ``steps`` AdamW steps on the global
batch of next-token prediction in float64 and returns the losses, the gradients of the first
step and the parameters after the last; :func:`check_equivalence` compares them with
:func:`reference` (one process, whole batch) within :func:`tolerances`, which come from
:mod:`rlm_course.numerics` (Higham's bound for sums in another order, and its effect through
Adam), not from looking at one machine's error.

**Bytes = the simulators' formulas.** During the last step (pipelining exchanges shapes in its
first, DDP settles its buckets in its second) :class:`~rlm_course.distributed.comm.CommCounter`
records every collective and send/recv;
:func:`predicted_sent` gives each rank's bytes from the course's formulas:
:func:`rlm_course.parallel.data_parallel.bytes_sent_per_step` (DDP: stage 0; FSDP2: stage 3 on
FSDP's padded parameter count), :func:`rlm_course.parallel.tensor_parallel.layer_bytes_per_rank`
per block (TP, TP+SP, plus the two terms the simulator of one block does not have: the model's
entry into and exit from the sequence layout, and the all-reduce of the norms' partial
gradients; only the norms': the row-wise layers' biases get whole gradients from DTensor with
no collective of their own, where chapter 08's simulated block all-reduces them too), and the
simulated pipeline of :func:`rlm_course.parallel.pipeline.run_pipeline` on a
:class:`~rlm_course.parallel.world.World` (PP).

**Time.** :func:`timing_worker` measures the step time of each strategy at learner size in
float32, and the share of it that the backend spends communicating (the union of its
``gloo:*`` profiler records, waiting for peers included; :func:`rlm_course.distributed.comm.
comm_seconds`).
"""

# one module per part, as parallel/ has one per strategy; the names are re-exported here
from rlm_course.distributed.strategies.setup import (DTYPES, PIPELINES, STRATEGIES, Setup,
                                                     check_setup, fitting, learner_setup, lm_loss,
                                                     make_model, make_optimizer, make_tokens,
                                                     ranks_that_fit, reference, select)
from rlm_course.distributed.strategies.tensor_parallel import (HeadParallelAttention,
                                                               from_head_major, head_major_rows,
                                                               parallelize_tinygpt,
                                                               reduce_partial_grads,
                                                               tensor_parallel_plan, tp_ready)
from rlm_course.distributed.strategies.pipeline import PipelinePart, stage_ids
from rlm_course.distributed.strategies.run import StrategyRun
from rlm_course.distributed.strategies.formulas import fsdp_numel, predicted_sent
from rlm_course.distributed.strategies.checks import (check_equivalence, format_equivalence,
                                                      merge_ranks, summarize_timing, tolerances)
from rlm_course.distributed.strategies.workers import equivalence_worker, timing_worker

__all__ = [
    "DTYPES", "PIPELINES", "STRATEGIES", "Setup", "check_setup", "fitting", "learner_setup",
    "ranks_that_fit", "select", "lm_loss", "make_model", "make_optimizer", "make_tokens", "reference",
    "HeadParallelAttention", "from_head_major", "head_major_rows", "parallelize_tinygpt",
    "reduce_partial_grads", "tensor_parallel_plan", "tp_ready", "PipelinePart", "stage_ids",
    "StrategyRun", "fsdp_numel", "predicted_sent", "check_equivalence", "format_equivalence",
    "merge_ranks", "summarize_timing", "tolerances", "equivalence_worker", "timing_worker",
]
