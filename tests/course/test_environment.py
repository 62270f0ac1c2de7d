"""environment.yml (conda/mamba) must name the same packages and pins as pyproject.toml."""

import re
import tomllib

import yaml
from rlm_course.utils import repo_root

ROOT = repo_root()


def split(spec: str) -> tuple[str, str]:
    name = re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)
    return name.lower().replace("_", "-"), spec[len(name):].replace("==", "=").strip()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = dict(split(s) for s in project["dependencies"] + project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] and env["channels"] == ["conda-forge"]
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"unexpected entry {dep}"
            pip += [d for d in dep["pip"] if not d.startswith("-")]
        else:
            conda.append(dep)
    named = dict(split(s) for s in conda + pip if split(s)[0] not in ("python", "pip"))
    assert named == wanted


def test_torch_is_pinned_to_the_cpu_tested_release():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]
