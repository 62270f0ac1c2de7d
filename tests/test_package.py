"""The package's structure, read from its source with ``ast``: layers point down, no import cycle,
no private name imported across modules, no worker method called by its name as a string."""

import ast
from pathlib import Path

import pytest

from rlm_course.utils import repo_root

PACKAGE = repo_root() / "rlm_course"

#: Layers, lowest first: a module may import its own layer and the ones below. Leaves (any layer
#: may import them) import nothing of the course but other leaves.
LEAVES = {"rlm_course.utils", "rlm_course.vocabulary", "rlm_course.algorithms",
          "rlm_course.timeline", "rlm_course.numerics", "rlm_course.tools.plots",
          "rlm_course.devices"}
LAYERS = (
    ("rlm_course.tasks", "rlm_course.lm", "rlm_course.arguments"),
    ("rlm_course.cost",),
    ("rlm_course.rl",),
    ("rlm_course.parallel",),
    ("rlm_course.distributed",),
    ("rlm_course.systems",),
    ("rlm_course.cluster",),
    ("rlm_course.tools",),
    ("rlm_course.cli", "rlm_course.__main__", "rlm_course"),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _runtime_imports(tree: ast.AST):
    """Every import node outside ``if TYPE_CHECKING:`` blocks (function-level ones included)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return [n for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def _imports(module: str) -> list[tuple[str, str | None]]:
    """``(imported module, imported name or None)`` of every course import of ``module``."""
    path = MODULES[module]
    out = []
    for node in _runtime_imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("rlm_course")]
            continue
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
        if not base.startswith("rlm_course"):
            continue
        for alias in node.names:
            full = f"{base}.{alias.name}"
            out.append((full, None) if full in MODULES else (base, alias.name))
    return out


GRAPH = {m: sorted({target for target, _ in _imports(m) if target in MODULES} - {m})
         for m in MODULES}


def _layer(module: str) -> int:
    best = None
    for k, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (k, len(prefix))
    assert best is not None, f"{module} is in no layer of tests/test_package.py: add it"
    return best[0]


def test_every_module_is_placed_and_layers_point_down():
    wrong = []
    for module, targets in GRAPH.items():
        for target in targets:
            if target in LEAVES:
                if module in LEAVES and not set(GRAPH[target]) <= LEAVES:
                    wrong.append(f"leaf {module} imports {target}, which is not a leaf")
                continue
            if module in LEAVES:
                wrong.append(f"leaf {module} imports {target}")
            elif _layer(target) > _layer(module):
                wrong.append(f"{module} (layer {_layer(module)}) imports {target} "
                             f"(layer {_layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_the_cost_model_does_not_import_rl_and_distributed_does_not_import_the_cli():
    for module, targets in GRAPH.items():
        if module.startswith("rlm_course.cost"):
            assert not [t for t in targets if t.startswith("rlm_course.rl")], module
        if module.startswith("rlm_course.distributed"):
            assert not [t for t in targets if t.startswith("rlm_course.cli")], module


def test_no_import_cycle():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_no_private_name_is_imported_across_modules():
    private = [f"{m} imports {target}.{name}" for m in MODULES for target, name in _imports(m)
               if name and name.startswith("_") and not name.startswith("__")]
    assert not private, "\n".join(private)


def _string_method_calls(source: str, name: str) -> list[str]:
    """``controller.call(workers, "method", ...)``-shaped calls (a string as the method)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("call", "submit") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.append(f"{name}:{node.lineno} {ast.unparse(node)[:80]}")
    return found


@pytest.mark.parametrize("folder", ["rlm_course", "notebooks", "tests", "exercises", "solutions"])
def test_no_worker_method_is_called_by_a_string(folder):
    found = [hit for p in sorted((repo_root() / folder).rglob("*.py"))
             for hit in _string_method_calls(p.read_text(), str(p.relative_to(repo_root())))]
    assert not found, "\n".join(found)


def test_the_graph_is_read_right():
    # known edges, so that a broken reader cannot pass the tests above by seeing nothing
    assert "rlm_course.algorithms" in GRAPH["rlm_course.cost.accounting"]
    assert "rlm_course.systems.workers" in GRAPH["rlm_course.systems.pipelines"]
    assert "rlm_course.arguments" in GRAPH["rlm_course.distributed.__main__"]
    assert len(MODULES) > 80
    assert _layer("rlm_course.cluster.planner") > _layer("rlm_course.cost.phases")
    assert _layer("rlm_course.cost.anatomy") < _layer("rlm_course.rl.trainer")
    assert len(_string_method_calls('c.call(ws, "train")\nc.submit(w, RLWorker.train)', "x")) == 1


def test_durations_are_shown_in_units_that_keep_their_digits():
    from rlm_course.utils import seconds_text

    assert seconds_text(0.0) == "0 ms" and seconds_text(0.01234) == "12.3 ms"
    assert seconds_text(0.99949) == "999 ms" and seconds_text(0.9996) == "1.0 s"
    assert seconds_text(1.0) == "1.0 s" and seconds_text(475.25, 0) == "475 s"
    assert seconds_text(96475.7) == "96,475.7 s (26.8 h)"
    assert seconds_text(3599.0, 0) == "3,599 s"


def test_the_arguments_the_tasks_and_the_presets_import_no_torch():
    """rlm_course.arguments (the command line's flags, the torchrun worker's parser), the tasks
    and the presets stay light: importing torch takes about a second on a laptop (tasks/base
    once reached it through utils' top-level import)."""
    import subprocess
    import sys

    code = ("import sys, rlm_course.arguments, rlm_course.tasks, rlm_course.algorithms, "
            "rlm_course.utils; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=repo_root()).stdout
    assert out.strip() == "[]"
