"""What one RL iteration costs: the models it holds, the forward/backward passes it runs, its FLOPs
and its memory, predicted from the configuration and measured on a run.

The prediction follows the per-sample accounting of the systems papers (e.g. the compute summary
of PPO and GRPO in HybridFlow, Sheng et al. 2024, arXiv:2409.19256, section 2; DeepSeekMath,
arXiv:2402.03300, section 4.1): for each response,

* **generation**: one policy prefill of the prompt, then one decode step per response token;
* **scoring** (experience preparation, no gradient): a policy forward for ``log pi_old`` when the
  batch is reused for more than one gradient step or a KL goes into the reward, a reference forward
  when a KL term is on, a critic forward for ``V(s_t)`` with GAE;
* **training**: per epoch, one forward and one backward of the policy (and of the critic).

FLOPs use :func:`rlm_course.cost.architectures.teacher_forced_flops` (``2 x matmul params`` per token
plus attention) and the rule that a backward costs twice its forward (Kaplan et al. 2020, arXiv:2001.08361,
section 2.1). Memory: fp32 weights (4 bytes/parameter), gradients (4) and AdamW's two moments (8)
plus one step counter per tensor for each trained model; weights only for a frozen one.

Measurement (:class:`PassCounter`, :class:`ActivationMeter`) hooks the models of a real run, so the
predicted and measured numbers come from independent code.

This module accounts for the course's own runs. The same accounting for any architecture and
cluster (GQA, MoE, bytes moved, roofline time on a catalog device, ZeRO memory) is in
:mod:`rlm_course.cost.anatomy`, over the models of :mod:`rlm_course.cost.architectures`.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import nn

from rlm_course.cost.architectures import from_model_config, kv_cache_bytes, teacher_forced_flops
from rlm_course.lm.attention import attention_key_length
from rlm_course.lm.model import ModelConfig
from rlm_course.algorithms import RLConfig

ADAM_BYTES_PER_PARAM = 16  # fp32 weight + gradient + exp_avg + exp_avg_sq
FP32 = 4


def models_held(config: RLConfig) -> dict[str, str]:
    """The five model roles of RL post-training (policy, critic, reference, reward model, old
    policy) and whether ``config`` holds each one.

    Returns:
        ``{role: "trained" | "frozen" | "not held: <why>"}``.
    """
    return {
        "policy": "trained",
        "critic": "trained" if config.use_critic else "not held: no GAE (critic-free advantage)",
        "reference": ("frozen" if config.uses_reference else
                      "not held: no KL term (kl_mode none or kl_coef 0)"),
        "reward model": "not held: a verifier scores the responses (RLVR)",
        "old policy": ("not held: pi_old log-probs come from the policy before its update"
                       if config.reuses_batch or config.kl_mode == "reward" else
                       "not held: one gradient step per batch, so pi_old = pi_theta"),
    }


def predict_passes(config: RLConfig) -> dict[str, dict[str, dict[str, int]]]:
    """Forward and backward passes per response, by stage and model.

    Generation counts are per *generated* response (one prefill; the decode steps are counted per
    token elsewhere); scoring and training counts are per *trained* response (with DAPO's dynamic
    sampling, fewer responses are trained than generated).

    Returns:
        ``{stage: {model: {"forward": n, "backward": n}}}``, omitting zeros.
    """
    passes: dict = {"generation": {"policy": {"forward": 1, "backward": 0}}}
    passes["scoring"] = {model: {"forward": 1, "backward": 0} for model in config.scoring_passes()}
    epochs = config.ppo_epochs
    passes["training"] = {"policy": {"forward": epochs, "backward": epochs}}
    if config.use_critic:
        passes["training"]["critic"] = {"forward": epochs, "backward": epochs}
    return passes


def predict_iteration_flops(model_config: ModelConfig, config: RLConfig, *, generated: int,
                            trained: int, prompt_len: int, response_len: int,
                            decode_steps: int | None = None,
                            padded_keys: bool = False) -> dict[str, int]:
    """FLOPs of one iteration, per stage, for a policy of ``model_config``.

    Args:
        generated: responses sampled (``prompts x group_size``, times the rounds of dynamic
            sampling); trained: responses kept for the update.
        prompt_len: ``P``, prompt columns (left-padded to the longest prompt).
        response_len: ``R``, response columns of the trained batch (the longest response).
        decode_steps: forward steps of generation after the prefill (default ``R - 1``: the last
            token is sampled from the previous step's logits).
        padded_keys: count the scoring and training passes' attention over the keys the course's
            model pads to on the CPU (:func:`rlm_course.lm.attention.attention_key_length`), as
            ``torch.utils.flop_counter`` sees its kernel; False: over the real ``P + R`` keys.

    Returns:
        ``{"generation", "scoring", "training", "total"}`` in FLOPs (the reward stage runs a
        verifier, not a model: 0).

    Raises:
        ValueError: for negative sizes.
    """
    for name, value in (("generated", generated), ("trained", trained),
                        ("prompt_len", prompt_len), ("response_len", response_len)):
        if value < 0:
            raise ValueError(f"predict_iteration_flops: {name}={value} must be >= 0.")
    steps = response_len - 1 if decode_steps is None else decode_steps
    seq = prompt_len + response_len
    spec = from_model_config(model_config)
    generation = teacher_forced_flops(spec, prompt_len, generated) + sum(
        generated * spec.forward_flops_per_token(prompt_len + t + 1) for t in range(steps))
    passes = predict_passes(config)
    keys = attention_key_length(seq) if padded_keys else seq
    policy_fwd = teacher_forced_flops(spec, seq, trained, key_len=keys)
    critic_fwd = teacher_forced_flops(spec, seq, trained, value_positions=response_len,
                                      key_len=keys)
    per_model = {"policy": policy_fwd, "reference": policy_fwd, "critic": critic_fwd}
    scoring = sum(per_model[m] * p["forward"] for m, p in passes["scoring"].items())
    training = sum(per_model[m] * (p["forward"] + 2 * p["backward"])
                   for m, p in passes["training"].items())
    return {"generation": generation, "scoring": scoring, "training": training,
            "total": generation + scoring + training}


def predict_model_state_bytes(parameters: dict[str, tuple[int, int]],
                              trained: dict[str, bool]) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer state per model (fp32, AdamW).

    Args:
        parameters: ``{model: (trainable parameters, trainable parameter tensors)}``, plus frozen
            parameters counted in the first entry for frozen models.
        trained: ``{model: is it trained}``.

    Returns:
        ``{model: bytes}``: ``16 P + 4 T`` for a trained model with ``P`` trainable parameters in
        ``T`` tensors (AdamW keeps a step counter per tensor), ``4 P`` for a frozen one.
    """
    return {name: (ADAM_BYTES_PER_PARAM * n + FP32 * tensors if trained[name] else FP32 * n)
            for name, (n, tensors) in parameters.items()}


def measured_model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes actually held by ``model``'s trainable weights, their gradients and ``optimizer``'s
    state tensors (frozen weights of a trained model are not counted; for a frozen model, all of
    its weights)."""
    if optimizer is None:
        return sum(p.numel() * p.element_size() for p in model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() * p.element_size() for p in params)
    total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values()
                     if isinstance(v, torch.Tensor))
    return total


class PassCounter:
    """Counts, by stage and model, the sequences each model's forward and backward passes process.

    A forward hook on each model's final LayerNorm (every pass of the trunk ends there) records the
    batch rows; when the output carries gradient, a tensor hook records the rows again when the
    backward pass reaches it. In the generation stage a call with more than one position is a
    prefill; one position is a decode step (counted in ``decode_tokens``).

    Args:
        models: ``{name: module with an ln_f}`` (a TinyGPT, or a critic's trunk).
        stage: a callable that returns the current stage name (or None: not counted, e.g. eval).
    """

    def __init__(self, models: dict[str, nn.Module], stage) -> None:
        self.stage = stage
        self.counts: dict = defaultdict(lambda: defaultdict(lambda: {"forward": 0, "backward": 0}))
        self.decode_tokens = 0
        self._handles = [module.ln_f.register_forward_hook(self._hook(name))
                         for name, module in models.items() if module is not None]

    def _hook(self, name: str):
        def hook(module, inputs, output):
            stage = self.stage()
            if stage is None:
                return
            rows, positions = output.shape[0], output.shape[1]
            if stage == "generation" and positions == 1:
                self.decode_tokens += rows
                return
            entry = self.counts[stage][name]
            entry["forward"] += rows
            if output.requires_grad:
                def on_backward(grad, entry=entry):
                    entry["backward"] += grad.shape[0]
                output.register_hook(on_backward)
        return hook

    def per_sample(self, generated: int, trained: int) -> dict:
        """Counts divided by the responses generated (generation) or trained (other stages), in
        the shape of :func:`predict_passes`; zero entries are omitted."""
        out = {}
        for stage, models in self.counts.items():
            n = generated if stage == "generation" else trained
            out[stage] = {m: {k: v / max(n, 1) for k, v in c.items()} for m, c in models.items()
                          if c["forward"] or c["backward"]}
        out.setdefault("scoring", {})
        return out

    def state_dict(self) -> dict:
        return {"counts": {s: dict(m) for s, m in self.counts.items()},
                "decode_tokens": self.decode_tokens}

    def load_state_dict(self, state: dict) -> None:
        for stage, models in state["counts"].items():
            for model, entry in models.items():
                self.counts[stage][model] = dict(entry)
        self.decode_tokens = state["decode_tokens"]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class ActivationMeter:
    """Measures the bytes autograd saves for the backward pass (the activations), per forward.

    ``with meter.track(): loss = f(x)`` sums the sizes of the distinct storages saved by every
    operation inside; ``meter.peak_bytes`` keeps the largest total seen. Parameters are excluded
    (they are model state, counted separately).
    """

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._params: set[int] = set()

    def exclude(self, *modules: nn.Module | None) -> None:
        for module in modules:
            if module is not None:
                self._params |= {p.untyped_storage().data_ptr() for p in module.parameters()}

    @contextmanager
    def track(self):
        storages: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._params:
                storages[ptr] = storage.nbytes()
            # Not the tensor itself: when an operation saves its own output (exp, tanh, ...), the
            # saved object would hold the output's grad_fn, which holds the saved object, a
            # reference cycle through C++ that Python's garbage collector cannot see: every
            # tracked forward pass (its whole graph and activations) would stay alive for ever
            # (about 45 MB per PPO step). A detached alias shares the storage and holds no graph.
            return tensor.detach()

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
        self.peak_bytes = max(self.peak_bytes, sum(storages.values()))


def kv_cache_allocated_bytes(model_config: ModelConfig, batch: int, total_len: int) -> int:
    """Bytes of the fp32 KV cache that generation allocates for ``batch`` sequences of
    ``total_len`` positions (:func:`rlm_course.cost.architectures.kv_cache_bytes`)."""
    return kv_cache_bytes(model_config.n_layer, model_config.n_head, model_config.d_head,
                          batch * total_len, FP32)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (the operating system's high-water mark; it
    includes Python, PyTorch's libraries and every model and tensor the process ever held); 0
    where the platform does not report it."""
    try:
        import resource  # POSIX only
    except ImportError:  # Windows: no high-water mark available
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def resident_bytes() -> int:
    """This process's resident memory now (bytes; Linux ``/proc/self/statm``), or its peak where
    only that is reported (other POSIX systems), or 0."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return peak_rss_bytes()


def live_tensor_bytes() -> tuple[int, int]:
    """``(tensors, bytes)``: how many tensors the Python garbage collector can reach, and the bytes
    of their distinct storages (views of one storage counted once). A tensor kept alive only from
    C++ (inside an autograd graph) is counted through the Python tensors that hold that graph."""
    gc.collect()
    count, storages = 0, {}
    with warnings.catch_warnings():  # isinstance() on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor):
                    continue
                storage = obj.untyped_storage()
            except (RuntimeError, ReferenceError):  # e.g. a meta tensor or a dying weak proxy
                continue
            count += 1
            storages[storage.data_ptr()] = storage.nbytes()
    return count, sum(storages.values())


def cost_row(cost: dict) -> dict:
    """One flat row of a run's cost summary (see :func:`rlm_course.rl.runs.cost_summary`): models
    trained and frozen, forward and backward passes per trained response (generation's prefill
    counted per generated response), memory in MB, seconds per step."""
    models = cost["models"]
    forward = backward = 0.0
    for stage, per_model in cost["passes_per_response"].items():
        for entry in per_model.values():
            forward += entry["forward"]
            backward += entry["backward"]
    memory = cost["memory_bytes"]
    return {
        "trained": ", ".join(m for m, r in models.items() if r == "trained"),
        "frozen": ", ".join(m for m, r in models.items() if r == "frozen") or "-",
        "forward": round(forward, 2),
        "backward": round(backward, 2),
        "generated_per_trained": round(cost["responses_generated"] / max(cost["responses_trained"], 1), 2),
        "model_states_mb": round(sum(memory["model_states"].values()) / 2**20, 1),
        "activations_mb": round(memory["peak_activations"] / 2**20, 1),
        "kv_cache_mb": round(memory["peak_kv_cache"] / 2**20, 1),
        "peak_rss_mb": round(memory.get("process_peak_rss", 0) / 2**20, 1),
        "seconds_per_step": cost["seconds_per_step"],
    }
