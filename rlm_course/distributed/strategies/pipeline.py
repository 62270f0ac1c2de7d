"""Pipeline stages of TinyGPT for ``torch.distributed.pipelining``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlm_course.distributed.strategies.setup import PIPELINES
from rlm_course.lm.model import TinyGPT


class PipelinePart(nn.Module):
    """One pipeline stage of a TinyGPT: blocks ``lo .. hi - 1``; the first stage also embeds the
    tokens, the last also applies the final norm and the head (``tokens -> hidden -> logits``)."""

    def __init__(self, model: TinyGPT, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x, None)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def stage_ids(name: str, rank: int, p: int) -> list[int]:
    """Virtual stages of ``rank``: ``rank`` (one per rank) or ``rank, rank + p`` (looped, two)."""
    return [rank + c * p for c in range(PIPELINES[name][1])]
