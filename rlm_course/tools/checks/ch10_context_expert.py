"""Checks of chapter 10's exercise: The online-softmax merge and the all-to-all dispatch slots."""

from __future__ import annotations


import torch

from rlm_course.tools.checks.common import close

#: The exercise's title.
TITLE = "The online-softmax merge and the all-to-all dispatch slots"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.parallel.context_parallel", "online_softmax_merge"),
    ("rlm_course.parallel.expert_parallel", "dispatch_indices"),
)


def _checks_online_softmax_merge(fn):
    g = torch.Generator().manual_seed(0)
    scores, values = torch.randn(3, 6, generator=g), torch.randn(6, 2, generator=g)

    def part(cols):
        s = scores[:, cols]
        return torch.softmax(s, -1) @ values[cols], torch.logsumexp(s, -1)

    full = torch.softmax(scores, -1) @ values
    yield "merging two halves of the keys gives softmax over all of them", lambda: close(
        fn(*part(slice(0, 3)), *part(slice(3, 6)))[0], full)
    yield "the merged log-sum-exp is that of all the scores", lambda: close(
        fn(*part(slice(0, 2)), *part(slice(2, 6)))[1], torch.logsumexp(scores, -1))
    empty = torch.full((3,), float("-inf"))
    yield "a part with no keys (-inf) contributes nothing, and no NaN", lambda: close(
        fn(torch.zeros(3, 2), empty, *part(slice(0, 6)))[0], full)


def _checks_dispatch_indices(fn):
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    yield "hand example: capacity 2, three experts", lambda: close(
        fn(ids, 3, 2), torch.tensor([[0, 0], [1, 0], [-1, 1], [-1, -1]]))
    yield "large capacity: slots count each expert's pairs in order", lambda: close(
        fn(ids, 3, 10), torch.tensor([[0, 0], [1, 0], [2, 1], [2, 3]]))
    yield "capacity 0 drops everything", lambda: close(fn(ids, 3, 0), torch.full((4, 2), -1))


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "online_softmax_merge": _checks_online_softmax_merge,
    "dispatch_indices": _checks_dispatch_indices,
}
