"""Notebooks are committed clean, with the python3 kernel, and agree with their paired .py."""

import json

import jupytext
import pytest
from rlm_course.utils import repo_root

ROOT = repo_root()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ALL = NOTEBOOKS + sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb"))


def test_the_first_chapters_exist():
    names = [p.stem for p in NOTEBOOKS]
    assert names[:3] == ["00_orientation", "01_tiny_reasoning_lm", "02_grpo_from_scratch"]


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_without_outputs_and_with_python3_kernel(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    with_outputs = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"
                    and (cell["outputs"] or cell["execution_count"] is not None)]
    assert not with_outputs, (
        f"{path.relative_to(ROOT)} was saved with outputs (cells {with_outputs[:5]}), probably by a "
        "notebook editor; the course keeps them clean. Run `make clean-outputs` (or `jupyter "
        f"nbconvert --clear-output --inplace {path.relative_to(ROOT)}`). `make lab` never saves "
        "outputs.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_paired_py_agrees_with_ipynb(path):
    paired = path.with_suffix(".py")
    assert paired.exists(), f"{paired} missing: jupytext --to py:percent {path}"
    text = jupytext.read(paired)
    nb = jupytext.read(path)
    as_text = [(c.cell_type, c.source) for c in text.cells]
    as_ipynb = [(c.cell_type, c.source) for c in nb.cells]
    assert as_text == as_ipynb, (f"{path.name} and {paired.name} differ: run "
                                 f"`jupytext --sync {path}` (or --to ipynb {paired})")
