"""Checks of chapter 12's exercise: A bucketed broadcast of a state dict."""

from __future__ import annotations


import torch


#: The exercise's title.
TITLE = "A bucketed broadcast of a state dict"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.systems.weight_sync", "bucketed_broadcast"),
)


def _checks_bucketed_broadcast(fn):
    """A broadcast inside one process: the source's call records each buffer it sends, a
    receiver's call gets the recorded buffers back in order (what ``dist.broadcast`` does across
    processes)."""
    from rlm_course.systems.weight_sync import bucket_plan

    def state(seed, dtype_last=torch.float32):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(4, 3, generator=g), torch.randn(5, generator=g),
                torch.randn(2, 2, 2, generator=g), torch.randn(7, generator=g).to(dtype_last)]

    def run(bucket_bytes, dtype_last=torch.float32):
        source, receiver = state(0, dtype_last), [torch.zeros_like(t) for t in state(0, dtype_last)]
        sent = []

        def send(buffer):
            sent.append(buffer.clone())

        def receive(buffer):
            if not sent:
                raise AssertionError("the receiver broadcast more buckets than the source")
            buffer.copy_(sent.pop(0))

        sizes = fn(source, bucket_bytes, send)
        n_sent = len(sent)
        fn(receiver, bucket_bytes, receive)
        return source, receiver, sizes, n_sent, sent

    def receiver_gets_the_source_weights():
        source, receiver, *_ = run(40)
        same = all(torch.equal(a, b) for a, b in zip(source, receiver))
        return same, "the receiver's tensors differ from the source's after the broadcast"

    def one_broadcast_per_bucket():
        sizes_bytes = [t.numel() * 4 for t in state(0)]
        _, _, sizes, n_sent, _ = run(40)
        want = len(bucket_plan(sizes_bytes, 40))
        ok = n_sent == want and isinstance(sizes, list) and len(sizes) == want
        return ok, f"{n_sent} broadcasts and {sizes!r} returned; expected {want} buckets of <= 40 bytes"

    def sizes_add_up():
        _, _, sizes, _, _ = run(64)
        total = sum(t.numel() * 4 for t in state(0))
        ok = sum(sizes) == total and all(s <= 64 or s == max(sizes) for s in sizes)
        return ok, f"bucket sizes {sizes} should add up to the {total} bytes of the tensors"

    def whole_state_in_one_bucket():
        source, receiver, sizes, n_sent, _ = run(10**6)
        ok = n_sent == 1 and all(torch.equal(a, b) for a, b in zip(source, receiver))
        return ok, f"a bucket bigger than the state dict should give one broadcast, got {n_sent}"

    def dtypes_are_not_mixed():
        source, receiver, sizes, n_sent, sent = run(10**6, torch.float64)
        ok = (n_sent == 2 and {b.dtype for b in sent} <= {torch.float32, torch.float64}
              and all(torch.equal(a, b) for a, b in zip(source, receiver)))
        return ok, ("a float64 tensor after float32 ones must start a new bucket (use the plan's "
                    f"buckets); got {n_sent} broadcasts")

    yield "the receiver ends with exactly the source's weights", receiver_gets_the_source_weights
    yield "one broadcast per bucket of bucket_plan", one_broadcast_per_bucket
    yield "the returned bucket sizes add up to the state's bytes", sizes_add_up
    yield "a large bucket sends the whole state at once", whole_state_in_one_bucket
    yield "a flat buffer holds one dtype", dtypes_are_not_mixed


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "bucketed_broadcast": _checks_bucketed_broadcast,
}
