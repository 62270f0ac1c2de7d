"""``python -m rlm_course bench parallel``: every strategy at degrees 2, 4 and 8 on the tiny
model (DP and ZeRO: the whole TinyGPT; TP and SP: one of its blocks; PP: its four blocks; CP: its
attention over a 4x longer sequence; EP: an 8-expert MoE layer of its width), side by side with
one device in the same run.

For each: the simulated step's wall time on this machine relative to one device's (the
simulation's own overhead: ``p`` ranks run one after the other in this process), the bytes each
rank sends, the predicted communication time from the alpha-beta model (25 GB/s, 5 us), and the
model-state bytes per rank where the strategy shards them. Strategies that a degree does not fit
(e.g. TP 8 with 4 heads) are reported as such.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from rlm_course.lm.model import Block, TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.parallel.context_parallel import ring_attention
from rlm_course.parallel.data_parallel import DataParallel
from rlm_course.parallel.expert_parallel import MoELayer, expert_parallel_forward
from rlm_course.parallel.pipeline import run_pipeline, schedule_table
from rlm_course.parallel.tensor_parallel import TensorParallelBlock, shard_sequence
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.rl.sft import default_model_config
from rlm_course.utils import best_seconds, format_table, seed_everything

LINK = Link(alpha=5e-6, beta=25e9)
DEGREES = (2, 4, 8)


def _strategies(config, batch: int, seq: int):
    """``{name: (single-device step, parallel step(p) -> World)}`` for the tiny model."""
    d = config.d_model
    block = Block(config)
    x = torch.randn(batch, seq, d)
    gpt = TinyGPT(config)
    tokens_in = torch.randint(0, config.vocab_size, (batch, seq + 1))

    def next_token_loss(model, b):
        logits = model(b[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))

    def one_dp():
        next_token_loss(gpt, tokens_in).backward()

    def dp(stage):
        def run(p):
            world = World(p, LINK)
            trainer = DataParallel(world, gpt, stage)
            trainer.step(list(tokens_in.chunk(p)), next_token_loss)
            return world, sum(trainer.memory_per_rank().values())
        return run

    def one_block():
        block(x, None).sum().backward()

    def tp(sp):
        def run(p):
            world = World(p, LINK)
            parallel = TensorParallelBlock(block, world, sequence_parallel=sp)
            inputs = shard_sequence(x, p) if sp else [x] * p
            sum(o.sum() for o in parallel([i.clone().requires_grad_(True) for i in inputs])).backward()
            return world, 4 * sum(t.numel() for t in parallel.shards[0].parameters())
        return run

    layers = [_BlockLayer(b) for b in gpt.blocks]
    target = torch.randn(batch, seq, d)

    def one_pp():
        F.mse_loss(nn.Sequential(*copy.deepcopy(layers))(x), target).backward()

    def pp(p):
        world = World(p, LINK)
        stages = [copy.deepcopy(layer) for layer in layers]
        run_pipeline(stages, schedule_table("1f1b", p, 8), list(zip(x.chunk(8), target.chunk(8))),
                     F.mse_loss, world)
        per_stage = len(stages) // p
        return world, 4 * sum(t.numel() for layer in stages[:per_stage] for t in layer.parameters())

    q = torch.randn(batch, config.n_head, seq * 4, config.d_head)

    def one_cp():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)

    def cp(p):
        world = World(p, LINK)
        ring_attention(world, q, q, q, causal=True, load_balanced=True)
        return world, 0  # no parameters: the sequence (and its K/V) is what is split

    moe = MoELayer(d, 2 * d, n_experts=8, k=2)
    tokens = torch.randn(batch * seq, d)

    def one_ep():
        moe([tokens])

    def ep(p):
        world = World(p, LINK)
        expert_parallel_forward(world, moe, list(tokens.chunk(p)))
        local = sum(t.numel() for e in moe.experts[:moe.n_experts // p] for t in e.parameters())
        return world, 4 * (local + moe.router.weight.numel())

    return {"DP": (one_dp, dp(0)), "ZeRO-1": (one_dp, dp(1)), "ZeRO-2": (one_dp, dp(2)),
            "ZeRO-3": (one_dp, dp(3)), "TP": (one_block, tp(False)),
            "TP+SP": (one_block, tp(True)), "PP (1F1B)": (one_pp, pp),
            "CP (ring)": (one_cp, cp), "EP (MoE)": (one_ep, ep)}


def _short(message: str) -> str:
    """A table-sized reason: the part of an error message before its first semicolon."""
    return "does not fit: " + message.split(";")[0]


class _BlockLayer(nn.Module):
    """A transformer block as a one-argument layer (hidden states in and out) for pipelining."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x, None)


def bench_parallel(repeats: int = 3, batch: int = 8, seq: int = 16) -> dict:
    seed_everything(0)
    config = default_model_config(CharTokenizer())
    rows, result = [], {"bench": "parallel", "threads": torch.get_num_threads(),
                        "link": {"alpha": LINK.alpha, "beta": LINK.beta}, "strategies": {}}
    for name, (single, parallel) in _strategies(config, batch, seq).items():
        base = best_seconds(single, repeats)
        result["strategies"][name] = {}
        for p in DEGREES:
            try:
                world, state = parallel(p)
            except ValueError as err:
                rows.append([name, p, "-", "-", "-", "-", _short(str(err))])
                result["strategies"][name][p] = {"error": str(err)}
                continue
            seconds = best_seconds(lambda: parallel(p), repeats)
            comm = max(sum(e.end - e.start for e in world.events
                           if e.worker == r and e.stage == "comm") for r in range(p))
            rows.append([name, p, f"{seconds / base:.1f}", max(world.sent), f"{comm * 1e6:.1f}",
                         state or "-", ""])
            result["strategies"][name][p] = {"wall_vs_one_device": seconds / base,
                                             "max_bytes_sent_per_rank": max(world.sent),
                                             "predicted_comm_seconds": comm,
                                             "state_bytes_per_rank": state}
    print(f"Simulated strategies on the tiny model (d_model {config.d_model}, {config.n_head} "
          f"heads, {config.n_layer} layers; batch {batch} x {seq} tokens), best of {repeats}; link "
          f"alpha {LINK.alpha * 1e6:.0f} us, beta {LINK.beta / 1e9:.0f} GB/s")
    print(format_table(rows, ["strategy", "degree", "wall vs one device", "bytes sent / rank",
                              "predicted comm us", "state bytes / rank", "note"]))
    print("state bytes / rank: DP/ZeRO parameters + gradients + Adam states (fp32); TP, PP, EP: "
          "the parameters a rank holds; CP splits the sequence, not the parameters.")
    return result
