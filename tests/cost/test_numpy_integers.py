"""numpy's integers (from np.arange, an array, a pandas column) count as the Python ints they
hold everywhere the cost model takes a count, a degree or a size: the same numbers, no refusal."""

import numpy as np

from rlm_course.cluster.simulator import algorithm
from rlm_course.cost.anatomy import Workload, decode_step_seconds, stage_costs, stage_seconds
from rlm_course.cost.architectures import TransformerSpec, get_spec
from rlm_course.cost.comm import Fabric, data_parallel_comm, node_tree_levels
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import Layout, kv_slots, training_memory
from rlm_course.cost.weight_sync import reshard_received_bytes, sync_cost

SPEC, H100, I = get_spec("llama-3.1-8b"), get_device("H100-SXM-80GB"), np.int64


def test_numpy_integers_give_the_python_integers_numbers():
    assert Layout(dp=I(8), tp=np.int32(2)) == Layout(dp=8, tp=2)
    assert type(Layout(dp=I(8)).dp) is int
    assert Workload(I(4), I(4), 10, 10, response_lengths=np.array([1, 2, 3, 4] * 4)) == \
        Workload(4, 4, 10, 10, response_lengths=(1, 2, 3, 4) * 4)
    small = dict(d_model=64, n_head=4, d_ff=128, vocab_size=100)
    assert TransformerSpec("x", n_layer=I(2), **small).params() == \
        TransformerSpec("x", n_layer=2, **small).params()
    assert training_memory(SPEC, Layout(dp=I(8), zero=3), I(4096)) == \
        training_memory(SPEC, Layout(dp=8, zero=3), 4096)
    assert kv_slots(SPEC, I(1), H100, 4096, max_batch=I(64)) == 64
    assert decode_step_seconds(SPEC, H100, I(2), I(8), 1000) == \
        decode_step_seconds(SPEC, H100, 2, 8, 1000)
    trainer = Layout(dp=8)
    assert sync_cost(SPEC, H100, generation_tp=I(2), replicas=I(4), trainer=trainer) == \
        sync_cost(SPEC, H100, generation_tp=2, replicas=4, trainer=trainer)
    assert reshard_received_bytes(SPEC, I(4), I(1), I(1), I(2)) == \
        reshard_received_bytes(SPEC, 4, 1, 1, 2)
    link = Fabric.of(H100).link(8)
    assert data_parallel_comm(8e9, I(8), link, 1, micro_batches=I(2)) == \
        data_parallel_comm(8e9, 8, link, 1, micro_batches=2)
    assert node_tree_levels(I(4)) == 2 and algorithm("grpo", minibatches=I(4)).minibatches == 4
    costs = stage_costs(SPEC, algorithm("grpo"), Workload(8, 4, 128, 256))
    assert stage_seconds(costs, H100, I(8), I(2)) == stage_seconds(costs, H100, 8, 2)
