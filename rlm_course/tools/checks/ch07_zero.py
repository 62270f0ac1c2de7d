"""Checks of chapter 07's exercise: ZeRO-1's optimizer step: reduce-scatter, shard update, all-gather."""

from __future__ import annotations


import torch

from rlm_course.tools.checks.common import close

#: The exercise's title.
TITLE = "ZeRO-1's optimizer step: reduce-scatter, shard update, all-gather"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.parallel.data_parallel", "zero1_step"),
)


def _checks_zero1_step(fn):
    from rlm_course.parallel.data_parallel import adam_update, bytes_sent_per_step
    from rlm_course.parallel.world import World

    lr = 0.1

    def setup(p, grads):
        n = grads[0].numel()
        shard = n // p
        params = torch.zeros(n, dtype=grads[0].dtype)
        shards = [params[r * shard:(r + 1) * shard].clone() for r in range(p)]
        zeros = [torch.zeros(shard, dtype=grads[0].dtype) for _ in range(p)]
        return World(p), params, shards, zeros, [z.clone() for z in zeros]

    def first_step_is_sign():
        # Adam's first step moves each parameter by lr against the sign of its summed gradient:
        # m_hat = g, v_hat = g^2, so the update is lr g / (|g| + eps)
        grads = [torch.tensor([0.5, -1.0, 1.5, -2.0], dtype=torch.float64),
                 torch.tensor([0.5, -1.0, 1.5, -2.0], dtype=torch.float64)]
        world, _, shards, m, v = setup(2, grads)
        out = fn(world, grads, shards, m, v, 1, lr)
        if not isinstance(out, list) or len(out) != 2:
            return False, f"expected a list of 2 full parameter vectors, got {type(out).__name__}"
        return close(out[0], torch.tensor([-lr, lr, -lr, lr], dtype=torch.float64), atol=1e-6)

    g = torch.Generator().manual_seed(0)
    grads4 = [torch.randn(8, generator=g, dtype=torch.float64) for _ in range(4)]

    def equals_one_device_adam():
        # two steps on 4 ranks against two steps of Adam on the summed gradient on one device
        world, params, shards, m, v = setup(4, grads4)
        m1, v1 = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
        reference = params.clone()
        out = None
        for step in (1, 2):
            out = fn(world, grads4, shards, m, v, step, lr)
            if not isinstance(out, list) or len(out) != 4:
                return False, f"expected a list of 4 full parameter vectors, got {type(out).__name__}"
            shards = [out[0][r * 2:(r + 1) * 2].clone() for r in range(4)]
            reference = adam_update(reference, sum(grads4), m1, v1, step, lr)
        return close(out[0], reference)

    def every_rank_holds_the_same_parameters():
        world, _, shards, m, v = setup(4, grads4)
        out = fn(world, grads4, shards, m, v, 1, lr)
        same = all(torch.equal(o, out[0]) for o in out)
        return same and out[0].shape == (8,), "the ranks' parameter vectors differ (or are not full)"

    def moments_stay_sharded():
        world, _, shards, m, v = setup(4, grads4)
        fn(world, grads4, shards, m, v, 1, lr)
        total = sum(grads4)
        ok_m, msg_m = close(m[1], 0.1 * total[2:4])  # (1 - beta1) g of rank 1's shard
        ok_v, msg_v = close(v[1], 0.001 * total[2:4] ** 2)  # (1 - beta2) g^2
        return ok_m and ok_v, msg_m or msg_v or "m[r], v[r] must be rank r's moments, updated in place"

    def bytes_of_one_all_reduce():
        grads = [t.float() for t in grads4]
        world, _, shards, m, v = setup(4, grads)
        fn(world, grads, shards, m, v, 1, lr)
        want = bytes_sent_per_step(1, 8, 4)  # 2 (p - 1) / p x 4 bytes x 8 elements = 48
        if world.sent != [want] * 4:
            return False, (f"each rank sent {world.sent}, expected {want}: one reduce-scatter and "
                           "one all-gather")
        # an all-reduce moves the same bytes, but leaves every rank the whole gradient: ZeRO-1
        # needs two collectives, each rank keeping only its shard in between
        calls = [e.name for e in world.events if e.worker == 0 and e.stage == "comm"]
        return len(calls) == 2, (f"rank 0 took part in {len(calls)} collectives {calls}; expected "
                                 "two: a reduce-scatter, then an all-gather")

    yield "hand example: the first Adam step moves each parameter by lr against its gradient", \
        first_step_is_sign
    yield "two steps on 4 ranks equal two Adam steps of one device on the summed gradient", \
        equals_one_device_adam
    yield "every rank ends with the same full parameter vector", every_rank_holds_the_same_parameters
    yield "each rank updates only its own shard of the Adam moments, in place", moments_stay_sharded
    yield "two collectives (reduce-scatter, all-gather), 2 (p-1)/p x the parameter bytes per rank", \
        bytes_of_one_all_reduce


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "zero1_step": _checks_zero1_step,
}
