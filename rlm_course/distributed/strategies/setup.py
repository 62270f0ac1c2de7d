"""The strategies, their sizes and what each needs, and the single-process reference run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlm_course.lm.model import ModelConfig, TinyGPT


STRATEGIES = {
    "ddp": "DDP",
    "fsdp2": "FSDP2 (per block)",
    "tp": "TP (DTensor)",
    "tp_sp": "TP + SP",
    "pp_gpipe": "PP GPipe",
    "pp_1f1b": "PP 1F1B",
    "pp_interleaved": "PP interleaved 1F1B",
    "pp_zero_bubble": "PP interleaved zero bubble",
}


PIPELINES = {"pp_gpipe": ("gpipe", 1), "pp_1f1b": ("1f1b", 1), "pp_interleaved": ("interleaved", 2),
             "pp_zero_bubble": ("interleaved", 2)}


DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class Setup:
    """The model, batch and schedule of one comparison.

    A TinyGPT of ``n_layer`` blocks, width ``d_model``, ``n_head`` heads, trained on ``batch``
    sequences of ``seq_len`` tokens (next-token prediction on tokens drawn with ``seed``),
    ``steps`` AdamW steps at ``lr`` in ``dtype``; pipelines cut the batch into ``micro_batches``.
    """

    vocab_size: int = 24
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 32
    seq_len: int = 16
    batch: int = 8
    micro_batches: int = 4
    steps: int = 3
    lr: float = 1e-2
    dtype: str = "float64"
    seed: int = 0

    @property
    def config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, n_layer=self.n_layer, n_head=self.n_head,
                           d_model=self.d_model, max_seq_len=self.seq_len)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def check(self, name: str, p: int) -> None:
        """Refuse a strategy that does not fit this setup on ``p`` ranks.

        Raises:
            ValueError: naming the size that does not divide and what to change.
        """
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; choose from {list(STRATEGIES)}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: choose float64 (the algorithm) or float32.")
        if name in ("ddp", "fsdp2") and self.batch % p:
            raise ValueError(f"{name}: batch {self.batch} does not split into {p} equal shards; use "
                             "a multiple of the number of ranks.")
        if name.startswith("tp") and self.n_head % p:
            raise ValueError(f"{name}: {p} ranks do not divide the {self.n_head} heads; choose a "
                             "divisor of n_head.")
        if name == "tp_sp" and self.seq_len % p:
            raise ValueError(f"tp_sp: {p} ranks do not divide the sequence of {self.seq_len}.")
        if name in PIPELINES:
            stages = p * PIPELINES[name][1]
            if self.n_layer % stages:
                raise ValueError(f"{name}: {self.n_layer} blocks do not split into {stages} stages "
                                 f"({p} ranks x {PIPELINES[name][1]}); use n_layer a multiple of "
                                 f"{stages}.")
            if self.batch % self.micro_batches:
                raise ValueError(f"{name}: batch {self.batch} does not split into "
                                 f"{self.micro_batches} equal micro-batches.")
            if PIPELINES[name][1] > 1 and self.micro_batches % p:
                raise ValueError(f"{name}: {self.micro_batches} micro-batches are not a multiple of "
                                 f"the {p} ranks (interleaved schedules need it).")


def _multiple_at_least(p: int, least: int) -> int:
    """The smallest multiple of ``p`` that is at least ``least``."""
    return p * -(-least // p)


def check_setup(p: int) -> Setup:
    """The float64 setup of the equivalence checks on ``p`` ranks: a 32-wide TinyGPT with enough
    blocks for two pipeline stages per rank (4, or the first multiple of ``2 p`` from 4),
    micro-batches a multiple of ``p`` (4 at 2 and 4 ranks), two sequences per micro-batch. Only
    the 4 heads and 16 positions stay fixed: TP needs ``p`` to divide them."""
    m = _multiple_at_least(p, 4)
    return Setup(n_layer=_multiple_at_least(2 * p, 4), micro_batches=m, batch=2 * m)


def learner_setup(p: int) -> Setup:
    """The float32 setup of the timings on ``p`` ranks: the course's model width (128, 4 heads,
    32 positions) with 8 blocks (or the first multiple of ``2 p`` from 8; the same model at 2 and
    4 ranks), 16 sequences per step (or ``4 x`` the micro-batches, a multiple of ``p``)."""
    m = _multiple_at_least(p, 4)
    return Setup(n_layer=_multiple_at_least(2 * p, 8), d_model=128, seq_len=32,
                 batch=max(16, 4 * m), micro_batches=m, dtype="float32", lr=1e-3)


def ranks_that_fit(name: str, setup_for, up_to: int = 8) -> list[int]:
    """The rank counts ``2 .. up_to`` on which strategy ``name`` fits ``setup_for(p)``."""
    out = []
    for q in range(2, up_to + 1):
        try:
            setup_for(q).check(name, q)
        except ValueError:
            continue
        out.append(q)
    return out


def select(p: int, names: list[str] | None = None, timing: bool = False
           ) -> tuple[Setup, list[str], dict[str, str]]:
    """What a run of the strategies on ``p`` ranks does: the setup (:func:`check_setup`, or
    :func:`learner_setup` with ``timing``), the strategies to run (``names``, default every one
    that fits) and, for each one left out, one line that says why and which ``--nproc`` runs it
    (e.g. ``"tp: skipped, 3 ranks do not divide the 4 heads; use --nproc 2 or 4"``).

    Raises:
        ValueError: for an unknown strategy, a strategy in ``names`` that cannot run on ``p``
            ranks, or a ``p`` on which none can (one line per strategy).
    """
    setup_for = learner_setup if timing else check_setup
    if not (isinstance(p, int) and p >= 2):
        raise ValueError(f"--nproc {p!r}: the strategies need 2 or more ranks.")
    unknown = [n for n in names or () if n not in STRATEGIES]
    if unknown:
        raise ValueError(f"--strategies: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(STRATEGIES)}.")
    setup = setup_for(p)
    skipped = {}
    for name in names or STRATEGIES:
        try:
            setup.check(name, p)
        except ValueError as err:
            reason = str(err).split(": ", 1)[-1].split("; ")[0].rstrip(".")
            fits = ranks_that_fit(name, setup_for, max(8, p))
            fix = (f"use --nproc {' or '.join(map(str, fits))}" if len(fits) <= 3 else
                   f"use --nproc {', '.join(map(str, fits[:-1]))} or {fits[-1]}") if fits \
                else "no --nproc up to 8 fits it"
            skipped[name] = f"{name}: skipped, {reason}; {fix}"
    if names and skipped:
        raise ValueError(f"--strategies {' '.join(names)} on {p} ranks: "
                         + "; ".join(line.replace(": skipped, ", ": ", 1)
                                     for line in skipped.values()) + ".")
    run = [n for n in (names or STRATEGIES) if n not in skipped]
    if not run:
        raise ValueError(f"no strategy fits {p} ranks: " + "; ".join(skipped.values()) + ".")
    return setup, run, skipped


def fitting(setup: Setup, p: int) -> list[str]:
    """The strategies that fit ``setup`` on ``p`` ranks (e.g. TP needs ``p`` to divide the
    heads)."""
    out = []
    for name in STRATEGIES:
        try:
            setup.check(name, p)
        except ValueError:
            continue
        out.append(name)
    return out


def make_model(setup: Setup) -> TinyGPT:
    torch.manual_seed(setup.seed)
    return TinyGPT(setup.config).to(setup.torch_dtype)


def make_tokens(setup: Setup) -> Tensor:
    """``(batch, seq_len + 1)`` token ids: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    g = torch.Generator().manual_seed(setup.seed + 1)
    return torch.randint(0, setup.vocab_size, (setup.batch, setup.seq_len + 1), generator=g)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy: ``logits (batch, seq, vocab)``, ``targets (batch, seq)``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(params, setup: Setup, foreach: bool | None = None) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=setup.lr, weight_decay=0.0, foreach=foreach)


def reference(setup: Setup) -> dict:
    """One process, the whole batch: ``{"losses": [per step], "grads": {name: first step's
    gradient}, "params": {name: after the last step}}``."""
    model = make_model(setup)
    tokens = make_tokens(setup)
    optimizer = make_optimizer(model.parameters(), setup)
    losses, grads = [], {}
    for step in range(setup.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
