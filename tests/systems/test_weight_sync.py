"""Weight sync without processes (rlm_course.systems.weight_sync): the bucket plan, a bucketed
broadcast and the hand-over copy exactly, the alpha-beta model and its fit."""

import pytest
import torch

from rlm_course.cost.weight_sync import broadcast_seconds
from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.cost.comm import Link
from rlm_course.distributed.collectives import fit_link
from rlm_course.systems.weight_sync import (bucket_plan, bucketed_broadcast,
                                            handover, predict_sync_seconds)

TOK = CharTokenizer()


def test_bucket_plan():
    assert bucket_plan([4, 4, 4], 8) == [[0, 1], [2]]
    assert bucket_plan([10, 2, 2], 8) == [[0], [1, 2]]  # too big: a bucket of its own
    assert bucket_plan([4, 4], 100, [torch.float32, torch.float64]) == [[0], [1]]
    assert bucket_plan([], 8) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_plan([1], 0)


def test_bucketed_broadcast_and_handover_copy_exactly():
    src, dst = TinyGPT(ModelConfig(vocab_size=24, n_layer=1, d_model=16, n_head=2, max_seq_len=8)), \
        TinyGPT(ModelConfig(vocab_size=24, n_layer=1, d_model=16, n_head=2, max_seq_len=8))
    sent = []
    sizes = bucketed_broadcast(list(src.state_dict().values()), 1000, lambda b: sent.append(b.clone()))
    bucketed_broadcast(list(dst.state_dict().values()), 1000, lambda b: b.copy_(sent.pop(0)))
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    assert sum(sizes) == sum(t.numel() * 4 for t in src.state_dict().values())
    other = TinyGPT(ModelConfig(vocab_size=24, n_layer=1, d_model=16, n_head=2, max_seq_len=8))
    assert handover(src, other) == sum(sizes)
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), other.state_dict().values()))
    with pytest.raises(ValueError, match="differ"):
        handover(src, TinyGPT(ModelConfig(vocab_size=24, n_layer=2, d_model=16, n_head=2,
                                          max_seq_len=8)))


def test_alpha_beta_model_and_fit():
    link = Link(alpha=1e-4, beta=1e9)
    assert predict_sync_seconds(1e6, 4, link) == pytest.approx(4e-4 + 1e-3)
    assert predict_sync_seconds(1e6, 4, link, receivers=3) == pytest.approx(2 * (4e-4 + 1e-3))
    assert broadcast_seconds(1e6, 4, link) == predict_sync_seconds(1e6, 4, link)
    # pipelined (NCCL): the bytes cross once whatever the tree's depth
    assert broadcast_seconds(1e6, 4, link, 3, pipelined=True) == pytest.approx(2 * 4e-4 + 1e-3)
    # the copies term: packing and unpacking, a read and a write of every byte on each side
    assert predict_sync_seconds(1e6, 4, link, memory_bandwidth=1e10) == pytest.approx(
        4e-4 + 1e-3 + 4e6 / 1e10)
    with pytest.raises(ValueError, match="memory_bandwidth"):
        predict_sync_seconds(1e6, 4, link, memory_bandwidth=0)
    sizes = [2**k for k in range(10, 25, 2)]
    fitted = fit_link("broadcast", sizes, [link.seconds(s) for s in sizes], 2)
    assert fitted.alpha == pytest.approx(1e-4) and fitted.beta == pytest.approx(1e9)
    with pytest.raises(ValueError, match="grow"):
        fit_link("broadcast", [1, 2], [2.0, 1.0], 2)
