"""Checkpoints (rlm_course.lm.checkpoint): what is saved loads back the same, and what would not
load is refused before the file is written."""

import argparse
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlm_course.lm.checkpoint import load_checkpoint, save_checkpoint
from rlm_course.lm.model import ModelConfig, TinyGPT


def tiny(dtype=torch.float32):
    torch.manual_seed(0)
    return TinyGPT(ModelConfig(vocab_size=24, n_layer=1, n_head=1, d_model=8,
                               max_seq_len=32)).to(dtype)


def test_what_a_checkpoint_cannot_hold_is_refused_and_the_file_kept(tmp_path):
    path = tmp_path / "c.pt"
    model = tiny()
    save_checkpoint(path, model, step=3)
    before = path.read_bytes()
    # each saved without complaint before, then refused by the loader as "corrupt" (numpy's
    # scalars, paths, namespaces), "damaged" (a set's order changes between processes) or "not
    # a valid model" (an entry named as the checkpoint's own)
    for extra, said in ((dict(best=np.mean([0.1, 0.2])), "entry 'best' holds a float64"),
                        (dict(step=np.int64(3)), "entry 'step' holds a int64"),
                        (dict(out=pathlib.Path("/tmp")), "entry 'out' holds a PosixPath"),
                        (dict(args=argparse.Namespace(a=1)), "entry 'args' holds a Namespace"),
                        (dict(seen={"1+1=", "2+2="}), "entry 'seen' holds a set"),
                        (dict(meta={"k": [1, {2, 3}]}), "entry 'meta' holds a set"),
                        (dict(format="mine"), "'format' names the checkpoint's own entry"),
                        (dict(state_dict={}), "'state_dict' names the checkpoint's own entry")):
        with pytest.raises(ValueError, match="save_checkpoint: " + said):
            save_checkpoint(path, model, **extra)
    with torch.no_grad():
        broken = tiny()
        broken.tok_emb.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite weights \(NaN or inf in tok_emb.weight\)"):
        save_checkpoint(path, broken)
    assert path.read_bytes() == before and load_checkpoint(path)["step"] == 3
    # a loaded checkpoint's entries saved back, its digest among them: recomputed
    state = load_checkpoint(path)
    state["step"] = 4
    save_checkpoint(path, state.pop("model"), **{k: v for k, v in state.items()
                                                   if k not in ("format", "model_config",
                                                                "state_dict")})
    assert load_checkpoint(path)["step"] == 4
    with pytest.raises(ValueError, match="load_checkpoint: path=None must be a file's path"):
        load_checkpoint(None)


def test_a_checkpoint_loads_back_the_model_it_saved(tmp_path):
    path = tmp_path / "c.pt"
    # a compiled model is saved as the model it wraps (its keys were _orig_mod.-prefixed, which
    # the loader refused)
    model = tiny()
    save_checkpoint(path, torch.compile(model), seen=sorted({"2+2=", "1+1="}))
    loaded = load_checkpoint(path)
    assert loaded["seen"] == ["1+1=", "2+2="]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                  loaded["model"].parameters()))
    # a bf16 model comes back bf16, bit for bit (it came back fp32, its logits 2.6e-3 off)
    bf16 = tiny(torch.bfloat16)
    save_checkpoint(path, bf16)
    back = load_checkpoint(path)["model"]
    assert {p.dtype for p in back.parameters()} == {torch.bfloat16}
    assert all(torch.equal(a, b) for a, b in zip(bf16.parameters(), back.parameters()))
    # and another process reads it, digest and all
    code = (f"from rlm_course.lm.checkpoint import load_checkpoint; "
            f"print(load_checkpoint({str(path)!r})['model'].config.vocab_size)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "24"
