"""Benchmarks: ``python -m rlm_course bench sampling``, ``... bench train``, ``... bench family``.

Each prints a readable table and, as its last line, one JSON object with its figures. Every
ratio is measured side by side in the same run (baseline and candidate alternate), never against
a number remembered from another machine.

* ``sampling``: generating 64 new tokens for a batch of 64 prompts with the KV cache vs
  recomputing the whole prefix at every step (the same samples; see
  :func:`rlm_course.lm.sampling.generate`), and the KV-cache run against its kernel floor (its
  own matmul and attention calls timed alone, :func:`rlm_course.cost.profiling.kernel_floor`) and
  its FLOP floor at the matmul peak measured in the same run. Keys: ``kv_cache_speedup``,
  ``kv_cache_over_kernel_floor``, ``kv_cache_over_flop_floor``.
* ``train``: one GRPO training step (forward, clipped loss, backward, AdamW) at the default
  mini-batch; tokens/s, achieved FLOP/s from the analytic count (checked against
  ``torch.utils.flop_counter``), and achieved / the best fp32 matmul throughput measured in the
  same run. That is MFU's form, but its denominator is this machine's measured matmul rate, not a
  datasheet peak, so the key says what it is: ``fraction_of_matmul_peak``; and the step against
  its kernel floor (``step_over_kernel_floor``).
* ``parallel``: every simulated parallelism strategy at degrees 2, 4, 8 on the tiny model: wall
  time relative to one device (the simulation's overhead), bytes per rank, and the alpha-beta
  prediction of the communication time (:mod:`rlm_course.parallel.bench`).
* ``memory``: resident memory and live tensor bytes after each step of every preset, and their
  slopes per step with their noise: memory must not grow with the number of steps.
* ``compile``: ``torch.compile`` against eager on the GRPO train step and on generation (dynamic
  shapes), each on two copies of the same model, alternating: seconds per call, compile seconds,
  the calls after which compiling pays back ("never" when the compiled call is slower), and the
  agreement of losses, weights and sampled tokens. Keys: ``train_step``, ``generation``.
* ``peer``: generation against Hugging Face ``generate`` and a GRPO step against TRL's
  ``GRPOTrainer`` on the same tiny configuration (optional extra ``.[peer]``), each with its FLOP
  floor at the measured matmul peak and the course's kernel floor, at 1 and 2 threads (1 only on
  a one-core machine). Keys: ``generation_ratio`` and ``grpo_step_ratio`` (``{threads: course
  speed / peer speed}``), ``by_threads`` (``{threads: that run's speeds, seconds, floors and
  reachable_ratio, the peer's seconds over the course's kernel floor}``).
* ``collectives``: all-reduce, all-gather, reduce-scatter, broadcast, all-to-all and send/recv on
  2 and 4 real processes from 4 B to 64 MiB: time, algorithm and bus bandwidth (nccl-tests'
  convention), the alpha and beta fitted per collective, and the fitted World's prediction
  (:mod:`rlm_course.distributed.collectives`). Keys: ``fits``, ``bus_bandwidth``.
* ``family``: seconds per step of every preset of :mod:`rlm_course.rl.algorithms` at its default
  sizes, the presets' steps interleaved, as ratios to GRPO; with each one's stage split, responses
  generated per response trained, model-state and activation memory. Key: ``presets``.
* ``realrun``: chapter 14's simulator against this machine's own GRPO and PPO iterations, stage
  by stage (target: within 20%);
* ``simulator``: simulated GPU-iterations per second of wall time of the cluster simulator
  (:mod:`rlm_course.cluster.simulator`) on 64, 1,024 and 10,000 GPUs (a 7B, a 70B and a 70B
  model, colocated, synchronous GRPO with long-tailed responses); a 10,000-GPU iteration should
  take under 10 s; and the planner's whole search for a 70B run on 10,000 GPUs, also under 10 s.
  Keys: ``sizes``, ``seconds_per_iteration_10000``, ``plan_10000``.
* ``systems``: on two Ray workers (one trainer, one rollout), trained tokens/s of synchronous RL,
  one-step off-policy and ``eta = 2`` on the scratchpad task, alternating, and a bucketed weight
  sync against the alpha-beta prediction of the link measured on the same workers
  (:func:`rlm_course.systems.experiments.bench`). Keys: ``speedup_one_step_off``,
  ``speedup_eta_2``, ``sync_over_predicted``.
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import nullcontext

import torch

from rlm_course.cost.flops import count_flops
from rlm_course.cost.hardware import catalog_device_for, matmul_peak, synchronized
from rlm_course.cost.profiling import kernel_floor
from rlm_course.devices import device_description, generator_on, resolve_device
from rlm_course.lm.model import ModelConfig, TinyGPT, forward_flops
from rlm_course.lm.sampling import generate, response_log_probs
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.advantages import group_advantages
from rlm_course.rl.losses import policy_loss
from rlm_course.rl.sft import default_model_config
from rlm_course.tasks import get_task
from rlm_course.utils import format_table, seed_everything


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _catalog_gpu(device: str):
    """The hardware catalog's entry of ``device``'s GPU (None on a CPU or an unlisted GPU)."""
    return catalog_device_for(torch.cuda.get_device_name(device)) if device != "cpu" else None


def bench_sampling(repeats: int = 5, batch: int = 64, new_tokens: int = 64,
                   device: str = "cpu") -> dict:
    """KV-cache decoding vs recomputing the prefix, same model, prompts and seed, on ``device``;
    on a GPU also the decode roofline: the bytes every decode step must read (weights and the
    KV cache so far) at the catalog's memory bandwidth."""
    seed_everything(0)
    tok = CharTokenizer()
    base = default_model_config(tok)
    config = ModelConfig(**{**base.to_dict(), "max_seq_len": 128})
    model = TinyGPT(config).eval().to(device)
    problems = get_task("addition").problems(batch, seed=0)
    prompts, mask = tok.encode_prompts([p.prompt for p in problems], device)

    def run(use_cache: bool):
        # eos_id=-1 never matches: every sequence generates exactly new_tokens tokens
        return generate(model, prompts, mask, new_tokens, eos_id=-1, pad_id=tok.pad_id,
                        generator=generator_on(device, 0), use_cache=use_cache)

    same = torch.equal(run(True).tokens, run(False).tokens)
    cached, recomputed = [], []
    for _ in range(repeats):  # alternate so that machine noise hits both alike
        cached += _time(synchronized(lambda: run(True), device), 1)
        recomputed += _time(synchronized(lambda: run(False), device), 1)
    t_cache, t_recompute = statistics.median(cached), statistics.median(recomputed)
    p = prompts.shape[1]
    flops_cache = forward_flops(config, p, batch=batch) + sum(
        forward_flops(config, 1, p + t + 1, batch) for t in range(new_tokens - 1))
    # the floors of the KV-cache run: its own matmuls and attention calls timed alone, and its
    # FLOPs at the matmul peak measured now
    kernels = kernel_floor(lambda: run(True), repeats=repeats, device=device)
    peak = matmul_peak(device=device)[0]
    flop_floor = flops_cache / peak
    flops_recompute = forward_flops(config, p, batch=batch) + sum(
        forward_flops(config, p + t + 1, batch=batch) for t in range(new_tokens - 1))
    tokens = batch * new_tokens
    print(f"Sampling {new_tokens} new tokens for {batch} prompts ({p} prompt columns), "
          f"median of {repeats}; identical samples: {same}")
    print(f"KV-cache run: {t_cache * 1e3:.1f} ms = {t_cache / kernels['seconds']:.2f}x its kernel "
          f"floor ({kernels['seconds'] * 1e3:.1f} ms: its {kernels['calls']} matmul and attention "
          f"calls timed alone) and {t_cache / flop_floor:.1f}x its FLOP floor "
          f"({flop_floor * 1e3:.2f} ms at {peak / 1e9:.0f} GFLOP/s); per decode step "
          f"{t_cache / new_tokens * 1e3:.2f} ms")
    print(format_table([
        ["KV cache", f"{t_cache * 1e3:.1f}", f"{tokens / t_cache:,.0f}", f"{flops_cache / 1e9:.2f}", "1.00"],
        ["recompute prefix", f"{t_recompute * 1e3:.1f}", f"{tokens / t_recompute:,.0f}",
         f"{flops_recompute / 1e9:.2f}", f"{t_recompute / t_cache:.2f}"],
    ], ["method", "ms", "tokens/s", "GFLOP", "time vs cache"]))
    out = {"bench": "sampling", "device": device_description(device), "batch": batch,
           "new_tokens": new_tokens, "prompt_len": p}
    gpu = _catalog_gpu(device)
    if gpu is not None:
        weights = sum(q.numel() * q.element_size() for q in model.parameters())
        per_token_kv = 2 * config.n_layer * config.d_model * 4 * batch  # K and V, fp32
        read = sum(weights + per_token_kv * (p + t + 1) for t in range(new_tokens))
        floor = read / gpu.memory_bandwidth
        print(f"decode roofline on {gpu.name}: {read / 1e6:.1f} MB read in {new_tokens} steps at "
              f"{gpu.memory_bandwidth / 1e12:.1f} TB/s = {floor * 1e3:.3f} ms; the KV-cache run "
              f"takes {t_cache / floor:.0f}x that (a model this small is bound by kernel launches, "
              "not by memory)")
        out.update(catalog_device=gpu.name, decode_roofline_seconds=floor,
                   kv_cache_over_roofline=t_cache / floor)
    out.update(kernel_floor_seconds=kernels["seconds"], flop_floor_seconds=flop_floor,
               kv_cache_over_kernel_floor=t_cache / kernels["seconds"],
               kv_cache_over_flop_floor=t_cache / flop_floor,
               decode_step_seconds=t_cache / new_tokens, matmul_peak_flops_per_s=peak)
    return {**out, "identical_samples": same, "kv_cache_seconds": t_cache,
            "recompute_seconds": t_recompute, "kv_cache_tokens_per_s": tokens / t_cache,
            "recompute_tokens_per_s": tokens / t_recompute,
            "kv_cache_gflop": flops_cache / 1e9, "recompute_gflop": flops_recompute / 1e9,
            "kv_cache_speedup": t_recompute / t_cache}


def _grpo_minibatch(model: TinyGPT, device: str) -> dict:
    """The default GRPO configuration's training mini-batch on the addition task, sampled from
    ``model``: ``{"config", "rollout", "old" (its log-probs, detached), "advantages"}``."""
    from rlm_course.algorithms import GRPOConfig

    tok, task, cfg = CharTokenizer(), get_task("addition"), GRPOConfig()
    batch = cfg.prompts_per_step * cfg.group_size // cfg.minibatches
    problems = task.problems(batch, seed=0)
    prompts, mask = tok.encode_prompts([p.prompt for p in problems], device)
    rollout = generate(model, prompts, mask, task.max_response_len, tok.eos_id, tok.pad_id,
                       generator=generator_on(device, 0))
    old = response_log_probs(model, rollout.tokens, rollout.attention_mask,
                             rollout.prompt_len).detach()
    advantages = group_advantages(torch.rand(batch, device=device), cfg.group_size)
    return {"config": cfg, "rollout": rollout, "old": old, "advantages": advantages}


def _train_step(model, minibatch: dict, optimizer, autocast):
    """One GRPO update of ``model`` on ``minibatch`` (forward under ``autocast()``, clipped loss,
    backward, ``optimizer`` step); the function returns the loss."""
    cfg, rollout = minibatch["config"], minibatch["rollout"]

    def step():
        with autocast():
            logp = response_log_probs(model, rollout.tokens, rollout.attention_mask,
                                      rollout.prompt_len)
        loss, _ = policy_loss(logp, minibatch["old"], minibatch["advantages"],
                              rollout.response_mask, cfg.ratio_level, cfg.clip_eps, cfg.clip_high,
                              cfg.loss_agg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def bench_train(repeats: int = 5, device: str = "cpu", bf16: bool = False,
                peak_sizes: tuple[int, ...] = (512, 1024, 2048)) -> dict:
    """One GRPO training step at the default mini-batch on ``device``, against the matmul peak
    measured in the same run (and, on a catalog GPU, against its datasheet bf16 peak: MFU).
    ``bf16``: the forward under ``torch.autocast`` in bfloat16 (the master weights, the optimizer
    and the loss stay fp32), and the matmul peak measured in bf16; ``peak_sizes``: the square
    matmuls that measure the peak."""
    seed_everything(0)
    model = TinyGPT(default_model_config(CharTokenizer())).to(device)
    minibatch = _grpo_minibatch(model, device)
    batch, seq = minibatch["rollout"].tokens.shape
    dtype = torch.bfloat16 if bf16 else torch.float32
    autocast = ((lambda: torch.autocast(torch.device(device).type, dtype=torch.bfloat16)) if bf16
                else nullcontext)
    step = _train_step(model, minibatch, torch.optim.AdamW(model.parameters(), lr=1e-6), autocast)
    step()  # warm-up
    measured_flops, _ = count_flops(step)
    predicted = 3 * forward_flops(model.config, seq, batch=batch)
    peak, per_size = matmul_peak(sizes=peak_sizes, device=device, dtype=dtype)
    timed = synchronized(step, device)
    times = []
    for _ in range(repeats):
        times += _time(timed, 1)
        peak = max(peak, matmul_peak(sizes=(max(per_size, key=per_size.get),), repeats=1,
                                     device=device, dtype=dtype)[0])
    t = statistics.median(times)
    achieved = predicted / t
    fraction = achieved / peak
    kernels = kernel_floor(step, repeats=repeats, device=device)
    tokens = batch * seq
    where = (f"threads={torch.get_num_threads()}" if device == "cpu"
             else device_description(device))
    print(f"GRPO training step: {batch} sequences x {seq} tokens, {where}"
          f"{', bf16 autocast' if bf16 else ''}, median of {repeats}")
    print(format_table([
        ["train step", f"{t * 1e3:.1f}", f"{tokens / t:,.0f}", f"{predicted / 1e9:.2f}",
         f"{achieved / 1e9:.1f}", f"{fraction:.2f}"],
        [f"{'bf16' if bf16 else 'fp32'} matmul peak", "", "", "", f"{peak / 1e9:.1f}", "1.00"],
    ], ["what", "ms", "tokens/s", "GFLOP", "GFLOP/s", "of matmul peak"]))
    extra = {}
    gpu = _catalog_gpu(device)
    if gpu is not None:
        extra = {"catalog_device": gpu.name, "mfu": achieved / gpu.peak_flops}
        print(f"MFU against {gpu.name}'s datasheet dense bf16 peak ({gpu.peak_flops / 1e12:.0f} "
              f"TFLOP/s): {achieved / gpu.peak_flops:.4f} (a 0.8M-parameter model cannot fill a "
              "GPU: the point is the measurement, not the number)")
    print(f"train step = {t / kernels['seconds']:.2f}x its kernel floor "
          f"({kernels['seconds'] * 1e3:.1f} ms: its {kernels['calls']} matmul and attention calls, "
          f"forward and backward, timed alone) and {fraction ** -1:.2f}x its FLOP floor "
          f"({predicted / peak * 1e3:.1f} ms)")
    print(f"analytic FLOPs / flop_counter FLOPs = {predicted / measured_flops:.3f}; matmul GFLOP/s by "
          "size: " + ", ".join(f"{n}: {v / 1e9:.0f}" for n, v in per_size.items()))
    return {"bench": "train", "device": device_description(device), "bf16": bf16, **extra,
            "batch": batch, "seq_len": seq, "threads": torch.get_num_threads(),
            "step_seconds": t, "tokens_per_s": tokens / t, "flops_per_step": predicted,
            "flop_counter_flops_per_step": measured_flops, "achieved_flops_per_s": achieved,
            "matmul_peak_flops_per_s": peak, "fraction_of_matmul_peak": fraction,
            "kernel_floor_seconds": kernels["seconds"],
            "step_over_kernel_floor": t / kernels["seconds"], "flop_floor_seconds": predicted / peak}


def _compiled_against_eager(eager, compiled, repeats: int) -> dict:
    """Time ``compiled`` (its first call compiles) against ``eager``, alternating after one call of
    each: ``{"eager_seconds", "compiled_seconds"}`` (medians), ``compile_seconds`` (the first
    compiled call less an eager call) and :func:`break_even_calls`.

    Raises:
        ValueError: when the first compiled call fails (inductor needs a C++ compiler on a CPU).
    """
    first_eager = _time(eager, 1)[0]
    start = time.perf_counter()
    try:
        compiled()
    except Exception as err:  # inductor's errors have many types; all mean "cannot compile here"
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"torch.compile could not run here ({type(err).__name__}: {reason}); "
                         "on a CPU its inductor backend needs a C++ compiler (g++ or clang++ on "
                         "the PATH, or CXX set to one).") from None
    first_compiled = time.perf_counter() - start
    eager_times, compiled_times = [], []
    for _ in range(repeats):
        eager_times += _time(eager, 1)
        compiled_times += _time(compiled, 1)
    e, c = statistics.median(eager_times), statistics.median(compiled_times)
    compile_seconds = max(first_compiled - first_eager, 0.0)
    return {"eager_seconds": e, "compiled_seconds": c, "compile_seconds": compile_seconds,
            "speedup": e / c, "break_even_calls": break_even_calls(compile_seconds, e, c)}


def break_even_calls(compile_seconds: float, eager_seconds: float,
                     compiled_seconds: float) -> float | None:
    """Calls after which compiling has paid for itself: ``compile / (eager - compiled)`` seconds
    per call saved; None when the compiled call is not faster (it never pays).

    Raises:
        ValueError: for a negative or non-finite time.
    """
    for name, value in (("compile_seconds", compile_seconds), ("eager_seconds", eager_seconds),
                        ("compiled_seconds", compiled_seconds)):
        if not (value >= 0 and value < float("inf")):
            raise ValueError(f"break_even_calls: {name}={value} must be a finite time >= 0.")
    saved = eager_seconds - compiled_seconds
    return compile_seconds / saved if saved > 0 else None


def bench_compile(repeats: int = 5, new_tokens: int = 32,
                  config: ModelConfig | None = None) -> dict:
    """``torch.compile`` against eager on the core loop's two hot paths, compile time counted
    (item 2 of the speed work; chapter 05 reports the result):

    * the GRPO train step of ``bench train`` (forward, clipped loss, backward, AdamW) with the
      model compiled (static shapes: the mini-batch is the same at every call);
    * generation (64 prompts x ``new_tokens`` sampled tokens with the KV cache) with the model
      compiled with dynamic shapes (the cache grows at every decode step).

    Each path runs on two copies of the same model, eager and compiled, alternating; it reports
    eager and compiled seconds per call (medians of ``repeats``), the compile seconds (the first
    compiled call less an eager one), the speed-up and the calls after which compiling pays
    (:func:`break_even_calls`; "never" when the compiled call is slower), and how far the two
    agree: the largest difference of the losses and of the updated weights after one step, and
    whether generation sampled the same tokens. ``config``: the model (default: the course's).

    Raises:
        ValueError: when ``torch.compile`` cannot run here (on a CPU it needs a C++ compiler).
    """
    import copy

    seed_everything(0)
    tok = CharTokenizer()
    config = config or default_model_config(tok)
    eager_model = TinyGPT(config)
    minibatch = _grpo_minibatch(eager_model, "cpu")
    compiled_model = copy.deepcopy(eager_model)
    compiled_forward = torch.compile(compiled_model)
    steps = {name: _train_step(forward, minibatch,
                               torch.optim.AdamW(weights.parameters(), lr=1e-6), nullcontext)
             for name, forward, weights in (("eager", eager_model, eager_model),
                                            ("compiled", compiled_forward, compiled_model))}
    losses = {k: [] for k in steps}
    train = _compiled_against_eager(lambda: losses["eager"].append(steps["eager"]()),
                                    lambda: losses["compiled"].append(steps["compiled"]()), repeats)
    train["max_loss_difference"] = max(abs(a - b).item() for a, b in zip(*losses.values()))
    train["max_weight_difference"] = max(
        (a - b).abs().max().item()
        for a, b in zip(eager_model.parameters(), compiled_model.parameters()))

    seed_everything(0)
    model = TinyGPT(ModelConfig(**{**config.to_dict(),
                                   "max_seq_len": max(config.max_seq_len, 32 + new_tokens)})).eval()
    problems = get_task("addition").problems(64, seed=0)
    prompts, mask = tok.encode_prompts([p.prompt for p in problems])
    dynamic = torch.compile(model, dynamic=True)
    samples = {}

    def sample(name, m):
        samples[name] = generate(m, prompts, mask, new_tokens, eos_id=-1, pad_id=tok.pad_id,
                                 generator=torch.Generator().manual_seed(0)).tokens

    gen = _compiled_against_eager(lambda: sample("eager", model),
                                  lambda: sample("compiled", dynamic), repeats)
    gen["same_tokens"] = bool(torch.equal(samples["eager"], samples["compiled"]))

    def row(name, r):
        even = r["break_even_calls"]
        return [name, f"{r['eager_seconds'] * 1e3:.1f}", f"{r['compiled_seconds'] * 1e3:.1f}",
                f"{r['compile_seconds']:.1f}", f"{r['speedup']:.2f}x",
                "never" if even is None else f"{even:,.0f}"]

    print(f"torch.compile against eager (torch {torch.__version__}, threads="
          f"{torch.get_num_threads()}, median of {repeats}, alternating)")
    print(format_table([row("GRPO train step", train),
                        row(f"generation, 64 x {new_tokens} tokens (dynamic shapes)", gen)],
                       ["what", "eager ms", "compiled ms", "compile s", "speed-up",
                        "calls to pay back"]))
    print(f"agreement: losses within {train['max_loss_difference']:.1e}, weights after the steps "
          f"within {train['max_weight_difference']:.1e}; generation sampled the same tokens: "
          f"{gen['same_tokens']}")
    return {"bench": "compile", "torch": torch.__version__, "threads": torch.get_num_threads(),
            "repeats": repeats, "train_step": train, "generation": gen}


def bench_family(repeats: int = 5) -> dict:
    """Seconds per step and memory of every preset, side by side, from the same warm start.

    Each preset runs one warm-up step, then ``repeats`` timed steps (steps 2.. of a real run, at
    the default sizes); the presets alternate step by step so that machine noise hits all alike.
    Ratios are to GRPO's seconds per step in the same run.
    """
    from rlm_course.cost.accounting import cost_row
    from rlm_course.algorithms import PRESETS, preset
    from rlm_course.rl.runs import cost_summary, load_sft_policy
    from rlm_course.rl.trainer import RLTrainer
    from rlm_course.tasks.eval_sets import load_eval_set

    tok, task = CharTokenizer(), get_task("addition")
    held_out = load_eval_set(task)
    trainers = {}
    for name in PRESETS:
        seed_everything(0)
        policy, _ = load_sft_policy(task, tok, progress=False)
        trainers[name] = RLTrainer(policy, task, tok, preset(name, eval_every=10**6), held_out)
        trainers[name].step()  # warm-up
    seconds = {name: [] for name in PRESETS}
    stages = {name: {} for name in PRESETS}
    for _ in range(repeats):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            row = trainer.step()
            seconds[name].append(time.perf_counter() - start)
            for stage in ("generation", "reward", "scoring", "training"):
                stages[name][stage] = stages[name].get(stage, 0.0) + row[f"seconds_{stage}"] / repeats
    base = statistics.median(seconds["grpo"])
    rows, result = [], {"bench": "family", "threads": torch.get_num_threads(), "repeats": repeats,
                        "presets": {}}
    for name, trainer in trainers.items():
        t = statistics.median(seconds[name])
        cost = cost_row(cost_summary(trainer, sum(seconds[name])))
        rows.append([name, f"{t:.3f}", f"{t / base:.2f}", f"{stages[name]['generation']:.3f}",
                     f"{stages[name]['scoring']:.3f}", f"{stages[name]['training']:.3f}",
                     cost["generated_per_trained"], cost["model_states_mb"],
                     cost["activations_mb"]])
        result["presets"][name] = {**cost, "seconds_per_step": t, "vs_grpo": t / base,
                                   "stage_seconds": stages[name]}
    print(f"Seconds per step of each preset on addition-3 (512 responses per step; median of "
          f"{repeats} steps after a warm-up; threads={torch.get_num_threads()})")
    print(format_table(rows, ["preset", "s/step", "vs grpo", "generation", "scoring", "training",
                              "gen/train", "model states MB", "activations MB"]))
    return result


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``ys`` against ``xs`` and its standard error (0 with < 3 points)."""
    n = len(xs)
    if n < 2:
        return 0.0, 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if n < 3:
        return slope, 0.0
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return slope, (residual / (n - 2) / sxx) ** 0.5


def bench_memory(repeats: int = 5, steps: int = 30, warmup: int = 5) -> dict:
    """Memory per step of every preset: resident memory (RSS) and live tensor bytes after each
    step, and their slopes (bytes per step, least squares over the steps after ``warmup``) with
    two standard errors as the noise. A slope within its noise of zero means memory is flat.

    Every preset runs ``steps`` steps at its default sizes in this process, one after another
    (``repeats`` is not used: the steps are the repeats).
    """
    import gc

    from rlm_course.cost.accounting import live_tensor_bytes, peak_rss_bytes, resident_bytes
    from rlm_course.algorithms import PRESETS, preset
    from rlm_course.rl.runs import load_sft_policy
    from rlm_course.rl.trainer import RLTrainer
    from rlm_course.tasks.eval_sets import load_eval_set

    tok, task = CharTokenizer(), get_task("addition")
    held_out = load_eval_set(task)
    result = {"bench": "memory", "threads": torch.get_num_threads(), "steps": steps,
              "warmup": warmup, "presets": {}}
    rows = []
    for name in PRESETS:
        seed_everything(0)
        policy, _ = load_sft_policy(task, tok, progress=False)
        trainer = RLTrainer(policy, task, tok, preset(name, eval_every=10**6), held_out)
        rss, live = [], []
        for _ in range(steps):
            trainer.step()
            tensors, live_bytes = live_tensor_bytes()
            live.append(live_bytes)
            rss.append(resident_bytes())
        xs = list(range(warmup + 1, steps + 1))
        rss_slope, rss_se = _slope(xs, rss[warmup:])
        live_slope, live_se = _slope(xs, live[warmup:])
        flat = abs(live_slope) <= max(2 * live_se, 1.0) and abs(rss_slope) <= max(2 * rss_se, 2**20)
        result["presets"][name] = {
            "rss_bytes": rss, "live_tensor_bytes": live, "live_tensors_last_step": tensors,
            "rss_slope_bytes_per_step": rss_slope, "rss_slope_noise": 2 * rss_se,
            "live_slope_bytes_per_step": live_slope, "live_slope_noise": 2 * live_se,
            "flat": flat}
        rows.append([name, f"{rss[-1] / 2**20:.0f}", f"{rss_slope / 2**20:+.2f}",
                     f"{2 * rss_se / 2**20:.2f}", f"{live[-1] / 2**20:.1f}",
                     f"{live_slope / 2**10:+.1f}", f"{2 * live_se / 2**10:.1f}",
                     "yes" if flat else "NO"])
        del trainer, policy
        gc.collect()
    result["process_peak_rss_bytes"] = peak_rss_bytes()
    result["all_flat"] = all(p["flat"] for p in result["presets"].values())
    print(f"Memory after each of {steps} steps of every preset on addition-3 (default sizes, "
          f"threads={torch.get_num_threads()}); slopes by least squares over steps {warmup + 1}.."
          f"{steps}, noise = 2 standard errors")
    print(format_table(rows, ["preset", "RSS MB", "RSS MB/step", "noise", "live tensors MB",
                              "live KB/step", "noise", "flat"]))
    return result


#: The thread counts ``bench peer`` compares at (those the machine has cores for).
PEER_THREADS = (1, 2)


def bench_peer(repeats: int = 5, new_tokens: int = 16) -> dict:
    """The course's generation and GRPO step against Hugging Face ``generate`` and TRL's
    ``GRPOTrainer`` on the same tiny configuration (:mod:`rlm_course.tools.peer`), alternating
    step by step, medians and ratios (course / peer speed), at each thread count of
    :data:`PEER_THREADS` the machine has cores for (``torch.set_num_threads``; the count this
    process had is restored after).

    Returns:
        ``{"bench": "peer", "repeats", "threads": [1, 2], "generation_ratio": {"1": x, "2": y},
        "grpo_step_ratio": {...}, "by_threads": {"1": {...}, "2": {...}}}``: a ratio above 1 is
        the course faster; ``by_threads`` holds each run's speeds, seconds, FLOP and kernel
        floors, and ``reachable_ratio`` (``{"generation", "grpo_step"}``: the peer's seconds over
        the course's kernel floor, the largest ratio the course could reach).

    * generation: 64 prompts x ``new_tokens`` new tokens with the KV cache, sampled;
    * GRPO step: 8 prompts x 8 samples of 6-digit addition (responses up to 8 tokens), no
      reference model, one optimizer step per batch, from a random initialisation.

    Each row also gives its **FLOP floor**: the course's FLOPs for that work
    (``torch.utils.flop_counter``) at this machine's fp32 matmul peak measured in the same run
    (:func:`rlm_course.cost.hardware.matmul_peak`): the time that arithmetic alone needs; and its
    **kernel floor** (:func:`rlm_course.cost.profiling.kernel_floor`): the course's own matmul and
    attention calls of that work, each timed alone at its shapes. The peer does the same
    arithmetic up to its own sampled response lengths and padding. The course cannot beat its
    kernel floor without other arithmetic, so a ratio to the peer above ``peer / kernel floor``
    (``reachable_ratio``) is out of its reach.

    Raises:
        ValueError: if ``transformers``/``trl``/``datasets`` are not installed (the message says how).
    """
    from rlm_course.tools.peer import quiet_peer, require_peer

    require_peer()
    import os

    counts = [n for n in PEER_THREADS if n <= (os.cpu_count() or 1)]
    before = torch.get_num_threads()
    runs = {}
    try:
        for n in counts:
            torch.set_num_threads(n)
            with quiet_peer():
                runs[str(n)] = _bench_peer(repeats, new_tokens)
    finally:
        torch.set_num_threads(before)
    return {"bench": "peer", "repeats": repeats, "threads": counts,
            "generation_ratio": {k: r["generation_speedup_vs_transformers"]
                                 for k, r in runs.items()},
            "grpo_step_ratio": {k: r["grpo_step_speedup_vs_trl"] for k, r in runs.items()},
            "by_threads": runs}


def _bench_peer(repeats: int, new_tokens: int) -> dict:
    from rlm_course.algorithms import preset
    from rlm_course.rl.trainer import RLTrainer
    from rlm_course.tools.peer import TRLSteps, hf_generate, hf_model

    tok = CharTokenizer()
    config = default_model_config(tok)
    seed_everything(0)
    ours, peer = TinyGPT(config).eval(), hf_model(config)
    problems = get_task("addition").problems(64, seed=0)
    prompts, mask = tok.encode_prompts([p.prompt for p in problems])

    def our_generate():
        generate(ours, prompts, mask, new_tokens, eos_id=-1, pad_id=tok.pad_id,
                 generator=torch.Generator().manual_seed(0))

    our_generate(), hf_generate(peer, prompts, mask, new_tokens, 0)  # warm-up
    gen = {"course": [], "transformers": []}
    for r in range(repeats):
        gen["course"] += _time(our_generate, 1)
        gen["transformers"] += _time(lambda: hf_generate(peer, prompts, mask, new_tokens, r), 1)
    tokens = prompts.shape[0] * new_tokens
    gen_speed = {k: tokens / statistics.median(v) for k, v in gen.items()}

    task = get_task("addition", digits=6)
    config6 = ModelConfig(**{**config.to_dict(), "max_seq_len": 1 + task.max_prompt_len
                             + task.max_response_len})
    seed_everything(0)
    rl_config = preset("grpo", prompts_per_step=8, group_size=8, minibatches=1, kl_mode="none",
                       eval_every=10**6)
    trainer = RLTrainer(TinyGPT(config6), task, tok, rl_config, task.problems(8, seed=99))
    course_steps: list[float] = []
    trl_steps = TRLSteps(task, config6, 8, 8, rl_config.lr).run(
        repeats + 2, between=lambda: course_steps.extend(_time(trainer.step, 1)))
    step = {"course": statistics.median(course_steps[2:]), "trl": statistics.median(trl_steps[2:])}
    threads = torch.get_num_threads()
    peak, _ = matmul_peak()
    floor = {"generation": count_flops(our_generate)[0] / peak,
             "grpo_step": count_flops(trainer.step)[0] / peak}
    kernels = {"generation": kernel_floor(our_generate, repeats=repeats)["seconds"],
               "grpo_step": kernel_floor(trainer.step, repeats=repeats)["seconds"]}
    seconds = {"generation": {k: tokens / v for k, v in gen_speed.items()},
               "grpo_step": step}
    print(f"The course against its peers (threads={threads}, median of {repeats}, alternating); "
          f"FLOP floor at this machine's matmul peak of {peak / 1e9:.0f} GFLOP/s; kernel floor: "
          "the course's own matmul and attention calls timed alone")
    rows = []
    for key, what, peer_name, peer_key in (
            ("generation", f"generation, {prompts.shape[0]} prompts x {new_tokens} new tokens",
             "HF generate", "transformers"),
            ("grpo_step", f"GRPO step, 8 prompts x 8 samples x <= {task.max_response_len} tokens",
             "TRL GRPOTrainer", "trl")):
        ours, theirs = seconds[key]["course"], seconds[key][peer_key]
        rows.append([what, peer_name, f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}",
                     f"{theirs / ours:.2f}x", f"{floor[key] * 1e3:.1f}",
                     f"{kernels[key] * 1e3:.1f}", f"{ours / kernels[key]:.2f}x",
                     f"{theirs / kernels[key]:.2f}x"])
    print(format_table(rows, ["what", "peer", "course (ms)", "peer (ms)", "course faster by",
                              "FLOP floor (ms)", "kernel floor (ms)", "course / kernel floor",
                              "peer / kernel floor"]))
    print("The course cannot run below its kernel floor without changing its arithmetic (other "
          "kernels, precision or shapes), so 'peer / kernel floor' bounds how much faster than "
          "the peer it can become.")
    return {"threads": threads, "repeats": repeats, "generation_tokens_per_s": gen_speed, "grpo_step_seconds": step,
            "generation_speedup_vs_transformers": gen_speed["course"] / gen_speed["transformers"],
            "grpo_step_speedup_vs_trl": step["trl"] / step["course"],
            "matmul_peak_flops": peak, "flop_floor_seconds": floor,
            "kernel_floor_seconds": kernels,
            "reachable_ratio": {"generation": seconds["generation"]["transformers"]
                                / kernels["generation"],
                                "grpo_step": step["trl"] / kernels["grpo_step"]}}


def bench_collectives(repeats: int = 5) -> dict:
    """Collectives on 2 and 4 real processes, 4 B to 64 MiB, and the alpha-beta fit of each
    (:mod:`rlm_course.distributed.collectives`); the rows are printed, not repeated in the JSON."""
    from rlm_course.distributed.collectives import bench_collectives as run

    result = run(repeats)
    result.pop("rows")
    return result


def bench_systems(repeats: int = 5) -> dict:
    """Asynchronous RL and weight sync on Ray workers (chapters 12-13):
    :func:`rlm_course.systems.experiments.bench`."""
    from rlm_course.systems.experiments import bench

    return bench(repeats)


def bench_simulator(repeats: int = 5) -> dict:
    """Wall time of simulated RL iterations at 64, 1,024 and 10,000 GPUs (best of
    ``min(repeats, 3)``), as GPU-iterations per second."""
    from rlm_course.cost.anatomy import Workload
    from rlm_course.cost.architectures import get_spec
    from rlm_course.cost.hardware import get_device
    from rlm_course.cost.layouts import Layout
    from rlm_course.cost.phases import Cluster
    from rlm_course.cluster.simulator import Scenario, algorithm, simulate

    h100 = get_device("H100-SXM-80GB")
    sizes = {  # gpus: (model, prompts, generation tp, trainer layout)
        64: ("qwen2.5-7b", 256, 1, Layout(dp=64, zero=3, recompute=True, micro_batch_tokens=32768)),
        1024: ("llama-3.1-70b", 1024, 8, Layout(dp=64, tp=8, pp=2, zero=1, recompute=True,
                                                 micro_batch_tokens=32768)),
        10000: ("llama-3.1-70b", 4096, 8, Layout(dp=250, tp=8, pp=5, zero=1, recompute=True,
                                                  micro_batch_tokens=32768)),
    }
    rows, result = [], {"bench": "simulator", "sizes": {}}
    for gpus, (model, prompts, tp, layout) in sizes.items():
        workload = Workload.long_tailed(prompts, 16, 512, 4000, 0.8, 16384, seed=0)
        scenario = Scenario(get_spec(model), algorithm("grpo", minibatches=16), workload,
                            Cluster(h100, gpus), generation_tp=tp, trainer=layout)
        best = float("inf")
        for _ in range(max(1, min(repeats, 3))):
            start = time.perf_counter()
            sim = simulate(scenario, iterations=3, warmup=1)
            best = min(best, (time.perf_counter() - start) / 3)
        rows.append([gpus, model, workload.responses, f"{best:.2f}", f"{gpus / best:,.0f}",
                     f"{sim.step_seconds:,.0f}"])
        result["sizes"][gpus] = {"model": model, "responses": workload.responses,
                                 "seconds_per_iteration": best,
                                 "gpu_iterations_per_second": gpus / best,
                                 "simulated_step_seconds": sim.step_seconds}
    print("Cluster simulator (SimPy): wall seconds per simulated RL iteration, colocated "
          "synchronous GRPO on H100s, log-normal responses (mean 4,000, sigma 0.8, at most 16,384)")
    print(format_table(rows, ["GPUs", "model", "responses", "wall s / iteration",
                              "GPU-iterations / s", "simulated step s"]))
    ten = result["sizes"][10000]["seconds_per_iteration"]
    print(f"a 10,000-GPU iteration: {ten:.2f} s of wall time "
          f"({'under' if ten < 10 else 'OVER'} the 10 s target)")
    result["seconds_per_iteration_10000"] = ten
    result["plan_10000"] = bench_planner(repeats)
    return result


def bench_planner(repeats: int = 5) -> dict:
    """Wall seconds of the planner's whole search (:func:`rlm_course.cluster.planner.plan`: every
    placement, split, layout and mode it tries, with the calibrated rates) for a 70B GRPO run on
    10,000 H100s, the largest cluster ``python -m rlm_course plan`` accepts; best of
    ``min(repeats, 2)``. Target: under 10 s on 2 cores."""
    from rlm_course.cluster.planner import plan
    from rlm_course.cluster.simulator import algorithm
    from rlm_course.cost.anatomy import Workload
    from rlm_course.cost.architectures import get_spec
    from rlm_course.cost.hardware import get_device

    workload = Workload.long_tailed(512, 16, 512, 4000, 0.8, 16384, seed=0)
    best, result = float("inf"), None
    for _ in range(max(1, min(repeats, 2))):
        start = time.perf_counter()
        result = plan(get_spec("llama-3.1-70b"), algorithm("grpo", minibatches=16), workload,
                      get_device("H100-SXM-80GB"), 10_000)
        best = min(best, time.perf_counter() - start)
    print(f"planner search, llama-3.1-70b GRPO on 10,000 H100s: {best:.2f} s of wall time "
          f"({len(result.ranked)} plans simulated, {len(result.refused)} refused; "
          f"{'under' if best < 10 else 'OVER'} the 10 s target); best: {result.best.name}")
    return {"seconds": best, "simulated": len(result.ranked), "refused": len(result.refused),
            "under_10_s": best < 10, "best": result.best.name}


def bench_realrun(repeats: int = 5) -> dict:
    """The simulator against this machine's own runs (chapter 14, section 3): the course's GRPO
    and PPO iterations with the rates measured by micro-benchmarks interleaved with them
    (:func:`rlm_course.cluster.realrun.course_run_record`), every stage predicted by the
    simulator and compared; target: each within 20%. On one thread, as the run measures; a busy
    machine slows the run and its micro-benchmarks unequally, so run it alone."""
    import torch

    from rlm_course.cluster.realrun import check_real_run, course_run_record

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for variant in ("grpo", "ppo"):
            rows = check_real_run(course_run_record(variant, rounds=max(2, min(repeats, 4))), 0.2)
            out[variant] = rows
            print(format_table([[variant, r["stage"], f"{r['predicted']:.3f}",
                                 f"{r['measured']:.3f}", f"{r['ratio']:.2f}",
                                 "yes" if r["ok"] else "NO"] for r in rows],
                               ["run", "stage", "simulated s", "measured s", "ratio",
                                "within 20%"]))
    finally:
        torch.set_num_threads(threads)
    return {"bench": "realrun", "rows": out,
            "all_within_20_percent": all(r["ok"] for rows in out.values() for r in rows)}


#: The benchmarks that take ``--device`` (the others measure the CPU, or processes and Ray).
DEVICE_BENCHES = ("sampling", "train")


def main(what: str, repeats: int = 5, device: str | None = None, bf16: bool = False) -> int:
    """Run benchmark ``what`` (``python -m rlm_course bench <what>``) with ``repeats`` timings and
    print its result as one JSON line. ``device`` (``sampling``, ``train``; None: auto) and
    ``bf16`` (``train``) as in :func:`bench_train`.

    Raises:
        ValueError: for ``repeats`` below 1, an unknown benchmark, a device for a benchmark that
            has none, ``bf16`` for another benchmark than ``train``.
    """
    if repeats <= 0:
        raise ValueError(f"--repeats={repeats} must be positive: give 5 (the default) or more "
                         "for a stable median; simulator and planner take the best of at most "
                         "3 and 2.")
    if device is not None and what not in DEVICE_BENCHES:
        raise ValueError(f"--device: bench {what} has no device option (only "
                         f"{', '.join(DEVICE_BENCHES)} do); drop --device.")
    if bf16 and what != "train":
        raise ValueError(f"--bf16: only bench train has it, not bench {what}; drop --bf16.")
    from rlm_course.parallel.bench import bench_parallel

    benches = {"sampling": bench_sampling, "train": bench_train, "family": bench_family,
               "parallel": bench_parallel, "memory": bench_memory, "peer": bench_peer,
               "collectives": bench_collectives, "systems": bench_systems,
               "simulator": bench_simulator, "realrun": bench_realrun, "compile": bench_compile}
    if what not in benches:
        raise ValueError(f"unknown benchmark {what!r}; choose one of {', '.join(benches)}.")
    if what in DEVICE_BENCHES:
        result = benches[what](repeats, device=resolve_device(device or "auto"),
                               **({"bf16": bf16} if what == "train" else {}))
    else:
        result = benches[what](repeats)
    print(json.dumps(result))
    return 0
