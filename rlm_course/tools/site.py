"""The course as a static website (``make site``): every chapter with its executed outputs.

:func:`build_site` executes the chapters' notebooks (nbclient, the kernel of the current
environment, the seeds each notebook sets in its first cell, as nbval runs them), caches each
executed notebook under a key made of the notebook and of everything its outputs depend on (the
package's source, ``data/``, the versions of the main packages), and builds one folder of static
HTML with Sphinx, myst-nb and sphinx-book-theme: a landing page made of the README's story and
syllabus, one page per chapter, the exercises with their worked answers (folded), and a page of
the stored experiments with the command that made each file. The build needs no network.

A notebook whose cell raises, or that stores an error output, stops the build with a
:class:`SiteBuildError` that names the notebook and the cell: a page is never published with a
traceback. The calculators (ipywidgets) are shown as the snapshot the executed notebook left
(the controls with their values, disabled, and the output they produced), with a note on how to
run them live (``make lab``): their code imports torch, which a browser cannot run.

Command line: ``python -m rlm_course.tools.site [--chapters 00 06] [--out build/site]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import html
import json
import os
import platform
import re
import shutil
import sys
import time
import warnings as warnings_module
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from rlm_course.utils import atomic_write_text, repo_root

ROOT = repo_root()
#: Sphinx's configuration and the site's own static files (copied into every build).
SITE_SOURCE = ROOT / "site"
DEFAULT_OUT = ROOT / "build" / "site"
DEFAULT_CACHE = ROOT / "build" / "site-cache"
#: The cache's files are notebooks with their outputs, named so that no notebook tool or search for
#: ``*.ipynb`` takes them for the course's notebooks (which are committed without outputs).
CACHE_SUFFIX = ".executed.json"
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: Shown under every calculator snapshot: what it is and how to use it live.
LIVE_NOTE = ("A snapshot of the calculator as the executed notebook left it: its controls need "
             "a Python kernel (the formulas run on torch, which a browser cannot run). To change "
             "them, run the chapter live: <code>make lab</code>, then open this notebook.")
#: Packages whose versions enter the cache key (their numbers can change the outputs).
KEY_PACKAGES = ("torch", "numpy", "matplotlib", "ipywidgets", "simpy", "ray")


class SiteBuildError(RuntimeError):
    """The site cannot be built as asked: a notebook failed (the message names it and its cell),
    a chapter is unknown, or Sphinx reported an error."""


# ----------------------------------------------------------------------------- what to build


def chapter_notebooks(selection: Sequence[str | Path] | None = None) -> list[Path]:
    """The notebooks to publish, in course order.

    Args:
        selection: None for every chapter; else chapter numbers (``"06"``), notebook stems
            (``"06_work_and_depth"``) or paths to ``.ipynb`` files (any folder).

    Raises:
        SiteBuildError: an item matches no notebook (the message lists the chapters).
    """
    every = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if selection is None:
        return every
    chosen: list[Path] = []
    for item in selection:
        path = Path(item)
        if path.suffix == ".ipynb" and path.exists():
            found = [path.resolve()]
        else:
            found = [p for p in every if p.stem == str(item) or p.stem.split("_")[0] == str(item)]
        if not found:
            raise SiteBuildError(f"no chapter {str(item)!r}: choose among "
                                 f"{' '.join(p.stem.split('_')[0] for p in every)} "
                                 "(a number, a notebook's name or a path to an .ipynb)")
        chosen += [p for p in found if p not in chosen]
    return chosen


def machine() -> str:
    """The build machine in words, e.g. ``a 2-core CPU (AMD EPYC 7B13)``."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return f"a {os.cpu_count()}-core CPU ({model})" if model else f"a {os.cpu_count()}-core CPU"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def inputs_fingerprint() -> str:
    """A hash of what a notebook's outputs depend on besides the notebook: the package's
    Python source (but this module, which only renders), every file under ``data/`` and the
    versions of the main packages."""
    digest = hashlib.sha256()
    files = sorted(p for p in (ROOT / "rlm_course").rglob("*.py") if p != Path(__file__)) + sorted(
        p for p in (ROOT / "data").rglob("*") if p.is_file())
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    digest.update(json.dumps({n: _version(n) for n in KEY_PACKAGES}).encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- execution


def _first_line(cell) -> str:
    lines = [line for line in cell.source.splitlines() if line.strip()]
    return lines[0][:100] if lines else "(empty)"


def _error_message(name: str, nb, index: int, output) -> str:
    cell = nb.cells[index]
    return (f"{name}: cell {index} (code, begins {_first_line(cell)!r}) raised "
            f"{output.get('ename', 'an error')}: {output.get('evalue', '')}. "
            "A page is never published with an error: fix the notebook (run it with "
            f"`pytest --nbval-lax {name}`) and build again.")


def check_no_errors(nb, name: str) -> None:
    """Raise :class:`SiteBuildError` naming ``name`` and the cell if any cell stores an error
    output (a cell allowed to raise, or an error inside a widget's output)."""
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                raise SiteBuildError(_error_message(name, nb, index, output))


def execute_notebook(path: Path, cache: Path | None = None, *, timeout: int = 900,
                     fingerprint: str | None = None, log: Callable[[str], None] = print):
    """The notebook at ``path`` executed top to bottom, or its outputs from the cache when its
    code cells, its kernel and ``fingerprint`` (default :func:`inputs_fingerprint`) are those of
    a cached run (an edit of the text alone executes nothing).

    The kernel is the current environment's ``python3`` with the notebook's folder as working
    directory (as nbval runs it) and matplotlib's inline backend (``MPLBACKEND`` removed), so
    plots are stored as images. The executed notebook's metadata records when, on which machine
    and in how many seconds it ran (``metadata.rlm_course_site``).

    Raises:
        SiteBuildError: a cell raised or stored an error output (names the notebook and cell).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.reads(path.read_text(), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    key = hashlib.sha256(json.dumps([kernel, fingerprint or inputs_fingerprint(),
                                     [c.source for c in code]]).encode()).hexdigest()[:16]
    cached = cache / f"{path.stem}-{key}{CACHE_SUFFIX}" if cache else None
    if cached is not None and cached.exists():  # same code, same inputs: the text may differ
        done = nbformat.reads(cached.read_text(), as_version=4)
        for cell, ran in zip(code, [c for c in done.cells if c.cell_type == "code"]):
            cell.outputs, cell.execution_count = ran.outputs, ran.execution_count
        for name in ("widgets", "rlm_course_site"):
            if name in done.metadata:
                nb.metadata[name] = done.metadata[name]
        log(f"{path.stem}: executed outputs from the cache ({cached.name})")
        return nb
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    client = NotebookClient(nb, kernel_name=kernel, timeout=timeout, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    running: list[int] = []  # the index of each cell as it starts (nbclient's hook)
    client.on_cell_start = lambda cell, cell_index: running.append(cell_index)
    log(f"{path.stem}: executing ...")
    start = time.perf_counter()
    try:
        client.execute(env=env)
    except CellTimeoutError:
        where = (f"cell {running[-1]} (code, begins {_first_line(nb.cells[running[-1]])!r})"
                 if running else "a cell")
        raise SiteBuildError(f"{path.name}: {where} ran longer than {timeout} s (the cell timeout; "
                             "a busy machine is slower: --timeout raises it)") from None
    except CellExecutionError as exc:
        for index, cell in enumerate(nb.cells):
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                raise SiteBuildError(_error_message(path.name, nb, index, errors[0])) from None
        raise SiteBuildError(f"{path.name}: {type(exc).__name__}: {str(exc)[-500:]}") from None
    seconds = time.perf_counter() - start
    check_no_errors(nb, path.name)
    nb.metadata["rlm_course_site"] = {"executed": dt.date.today().isoformat(),
                                      "machine": machine(), "seconds": round(seconds, 1)}
    log(f"{path.stem}: executed in {seconds:.0f} s")
    if cached is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for old in cache.glob(f"{path.stem}-*{CACHE_SUFFIX}"):
            old.unlink()
        atomic_write_text(cached, nbformat.writes(nb))
    return nb


# ----------------------------------------------------------------------------- widgets


def _output_html(output) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return f'<pre class="widget-snapshot-stream">{html.escape("".join(output.get("text", "")))}</pre>'
    if kind == "error":
        raise ValueError(f"{output.get('ename')}: {output.get('evalue')}")
    data = output.get("data", {})
    if "text/html" in data:
        return "".join(data["text/html"])
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            payload = "".join(data[mime]).replace("\n", "")
            return f'<img src="data:{mime};base64,{payload}" alt="output"/>'
    if "image/svg+xml" in data:
        return "".join(data["image/svg+xml"])
    if "text/plain" in data:
        return f'<pre>{html.escape("".join(data["text/plain"]))}</pre>'
    return ""


def _label(state: dict) -> str:
    text = state.get("description") or ""
    return f'<label class="widget-snapshot-label">{html.escape(text)}</label>' if text else ""


def widget_html(states: dict, model_id: str, _depth: int = 0) -> tuple[str, bool]:
    """Static HTML of the widget ``model_id`` from a notebook's saved widget ``states``
    (``{model_id: {"model_name", "state"}}``), and whether it holds a control.

    Boxes become flex rows or columns, HTML and labels their value, outputs their stored
    outputs, and controls a disabled element showing their value.

    Raises:
        ValueError: an output widget stored an error.
    """
    model = states.get(model_id)
    if model is None or _depth > 50:
        return "", False
    name, state = model.get("model_name", ""), model.get("state", {})
    if "children" in state:
        parts = [widget_html(states, ref.removeprefix("IPY_MODEL_"), _depth + 1)
                 for ref in state["children"]]
        titles = state.get("titles") or state.get("_titles") or []
        if isinstance(titles, dict):
            titles = [titles.get(str(i), "") for i in range(len(parts))]
        inner = "".join((f'<div class="widget-snapshot-title">{html.escape(titles[i] or "")}</div>'
                         if i < len(titles) and titles[i] else "") + part
                        for i, (part, _) in enumerate(parts))
        direction = "row" if name == "HBoxModel" else "column"
        return (f'<div class="widget-snapshot-box widget-snapshot-{direction}">{inner}</div>',
                any(control for _, control in parts))
    if name in ("HTMLModel", "HTMLMathModel"):
        return f'<div class="widget-snapshot-html">{_label(state)}{state.get("value", "")}</div>', False
    if name == "LabelModel":
        return f'<span class="widget-snapshot-label">{html.escape(str(state.get("value", "")))}</span>', False
    if name == "OutputModel":
        return "".join(_output_html(o) for o in state.get("outputs", [])), False
    if name in ("FloatProgressModel", "IntProgressModel"):
        return (f'<div class="widget-snapshot-item">{_label(state)}<progress value="{state.get("value", 0)}" '
                f'max="{state.get("max", 100)}"></progress></div>'), False
    if "_options_labels" in state:
        labels, index = state["_options_labels"], state.get("index")
        picked = [index] if isinstance(index, int) else list(index or [])
        shown = ", ".join(html.escape(str(labels[i])) for i in picked if 0 <= i < len(labels))
        return (f'<div class="widget-snapshot-item">{_label(state)}<select disabled>'
                f'<option selected>{shown}</option></select></div>'), True
    if name in ("CheckboxModel", "ToggleButtonModel"):
        checked = " checked" if state.get("value") else ""
        return (f'<div class="widget-snapshot-item">{_label(state)}'
                f'<input type="checkbox" disabled{checked}/></div>'), True
    if name == "ButtonModel":
        return f'<button disabled>{html.escape(state.get("description", ""))}</button>', True
    if "value" in state:
        value = html.escape(str(state["value"]), quote=True)
        return (f'<div class="widget-snapshot-item">{_label(state)}'
                f'<input type="text" disabled value="{value}"/></div>'), True
    return "", False


def widgets_to_html(nb, name: str) -> int:
    """Replace every widget view in ``nb``'s outputs by its static snapshot (in place), drop
    the saved widget state (the page then loads no widget script) and return how many views
    were replaced. A snapshot with controls carries :data:`LIVE_NOTE`.

    Raises:
        SiteBuildError: a widget's output stored an error (names the notebook and cell).
    """
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    replaced = 0
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                continue
            try:
                body, has_control = widget_html(states, view.get("model_id", ""))
            except ValueError as exc:
                raise SiteBuildError(f"{name}: cell {index} (code, begins "
                                     f"{_first_line(cell)!r}) shows an error in a widget: {exc}")
            note = f'<p class="widget-snapshot-note">{LIVE_NOTE}</p>' if has_control else ""
            css = "widget-snapshot calculator" if has_control else "widget-snapshot"
            output["data"] = {"text/html": f'<div class="{css}">{body}{note}</div>'}
            replaced += 1
    nb.metadata.pop("widgets", None)
    return replaced


# ----------------------------------------------------------------------------- pages


def _readme_sections() -> tuple[str, str, str]:
    """The README's title, its story (before the first section) and its syllabus table."""
    text = (ROOT / "README.md").read_text()
    title, _, rest = text.partition("\n")
    story = rest.split("\n## ", 1)[0].strip()
    syllabus = ""
    match = re.search(r"^## Syllabus\n(.*?)(?=^## )", text, flags=re.S | re.M)
    if match:
        syllabus = match.group(1).strip()
    return title.lstrip("# ").strip(), story, syllabus


def _landing_page(chapters: Sequence[Path], extra_pages: Sequence[str], info: dict) -> str:
    title, story, syllabus = _readme_sections()
    published = {p.stem for p in chapters}

    def link(match: re.Match) -> str:
        stem = match.group(1)
        return f"[`{stem}`](chapters/{stem}.ipynb)" if stem in published else f"`{stem}`"

    syllabus = re.sub(r"`(\d\d_[a-z0-9_]+)`", link, syllabus)
    toc = "\n".join(f"chapters/{p.stem}" for p in chapters)
    return f"""# {title}

{story}

## How to read this site

Each chapter page shows its notebook with the outputs it printed and plotted when it was
executed for this site, on {info['machine']}: its timings are what that machine gives, while the
FLOPs, bytes and work-depth figures do not depend on it. The
calculators of chapters 05, 06 and 14 are shown as the snapshot the executed notebook left; to
change their controls, run the chapter live in JupyterLab (`make lab`). The exercises list each
to-do function with its worked answer folded under it. Built on {info['date']}.

## Syllabus

{syllabus}

```{{toctree}}
:caption: Chapters
:hidden:
:maxdepth: 1

{toc}
```

```{{toctree}}
:caption: Exercises and data
:hidden:
:maxdepth: 1

{chr(10).join(extra_pages)}
```
"""


def _title(notebook: Path) -> str:
    """The first heading of a notebook's markdown (its page title), or its file name."""
    for cell in json.loads(notebook.read_text()).get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return notebook.stem


def _exercise_pages(chapters: Sequence[Path], stage: Path) -> list[str]:
    """One page per chapter with an exercise: the to-do code and the worked answer, folded."""
    pages = []
    for chapter in chapters:
        number = chapter.stem[:2]
        for solution in sorted((ROOT / "solutions").glob(f"ex{number}_*.py")):
            exercise = ROOT / "exercises" / solution.name
            doc = solution.read_text().split('"""')[1] if '"""' in solution.read_text() else ""
            topic = doc.splitlines()[0].split(":", 1)[-1].strip().rstrip(".") if doc else solution.stem
            fence = "`" * 5
            body = f"""# Exercise {number}: {topic}

From chapter [{_title(chapter)}](../chapters/{chapter.stem}.ipynb). Edit `exercises/{exercise.name}`
(each `raise NotImplementedError` says what to write), then run `python -m rlm_course grade
{number}` or the notebook `exercises/{exercise.stem}.ipynb` for "3/4 checks pass"-style feedback.

## The exercise

{fence}python
{exercise.read_text() if exercise.exists() else ''}{fence}

<details>
<summary>The worked answer (open it after trying)</summary>

{fence}python
{solution.read_text()}{fence}

</details>
"""
            (stage / "exercises").mkdir(exist_ok=True)
            (stage / "exercises" / f"{solution.stem}.md").write_text(body)
            pages.append(f"exercises/{solution.stem}")
    if pages:
        listing = "\n".join(f"- [{p.split('/')[1]}]({p.split('/')[1]}.md)" for p in pages)
        (stage / "exercises" / "index.md").write_text(
            "# Exercises\n\nThe worked code of each exercise lives once in the package, between "
            "`# BEGIN SOLUTION` / `# END SOLUTION` markers; `python -m rlm_course exercises` "
            "derives the to-do and the worked files from it.\n\n" + listing + "\n\n```{toctree}\n"
            ":hidden:\n\n" + "\n".join(p.split("/")[1] for p in pages) + "\n```\n")
    return ["exercises/index"] if pages else []


def stored_files() -> list[Path]:
    """The stored results a reader may want: experiments, published figures and rates, the
    warm starts' records, the hardware catalog."""
    data = ROOT / "data"
    return (sorted((data / "experiments").glob("*.json")) + sorted((data / "published").glob("*"))
            + sorted((data / "checkpoints").glob("sft-*.json"))
            + sorted((data / "hardware").glob("*.json")))


def _experiments_page(chapters: Sequence[Path], stage: Path) -> str:
    notebooks = {p.stem: p.with_suffix(".py").read_text() if p.with_suffix(".py").exists()
                 else p.read_text() for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))}
    published = {p.stem for p in chapters}
    lines = ["# Stored experiments and data", "",
             "The notebooks plot these files instead of rerunning experiments that take longer "
             "than a notebook may. Each names the command that made it (run it from the "
             "repository's root, in the course's environment; most write to `runs/` unless "
             "`--store` asks them to replace the stored file). Published figures and rates carry "
             "their sources inside the file.", ""]
    for path in stored_files():
        rel = path.relative_to(ROOT)
        target = stage / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        lines += [f"## {rel}", "", f"{{download}}`Download {path.name} <{rel.as_posix()}>`", ""]
        try:
            content = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            content = None
        if isinstance(content, dict):
            if content.get("command"):
                lines += ["Made by:", "", "```bash", str(content["command"]), "```", ""]
            if content.get("about"):
                lines += [f"About: {content['about']}", ""]
            if content.get("machine"):
                lines += [f"Measured on: {content['machine']}", ""]
        users = [stem for stem, text in notebooks.items() if path.name in text]
        if users:
            refs = ", ".join(f"[{s}](chapters/{s}.ipynb)" if s in published else f"`{s}`"
                             for s in users)
            lines += [f"Used by: {refs}", ""]
    (stage / "experiments.md").write_text("\n".join(lines) + "\n")
    return "experiments"


def _provenance_cell(nb) -> dict:
    import nbformat

    run = nb.metadata.get("rlm_course_site", {})
    text = (f"*The outputs on this page were executed on {run.get('machine', machine())} on "
            f"{run.get('executed', dt.date.today().isoformat())}"
            + (f" (the whole notebook: {run['seconds']:.0f} s)" if "seconds" in run else "")
            + ". Timings are what that machine gives; run it yourself with `make lab`.*")
    return nbformat.v4.new_markdown_cell(text, metadata={"tags": ["provenance"]})


# ----------------------------------------------------------------------------- build


def build_site(out: str | Path = DEFAULT_OUT, chapters: Sequence[str | Path] | None = None, *,
               cache: str | Path | None = DEFAULT_CACHE, stage: str | Path | None = None,
               timeout: int = 900, log: Callable[[str], None] = print) -> Path:
    """Build the site into ``out`` and return the path of its ``index.html``.

    Args:
        out: the folder of the built HTML (replaced).
        chapters: the chapters to publish (see :func:`chapter_notebooks`); None: all.
        cache: the folder of executed notebooks (None: execute every notebook again).
        stage: the folder of the generated Sphinx sources (default: ``out`` + ``-src``), removed
            after a successful build.
        timeout: seconds a cell may run.

    Raises:
        SiteBuildError: a notebook failed (named with its cell), a chapter is unknown, or Sphinx
            stopped on an error.
    """
    import nbformat
    from sphinx.application import Sphinx
    from sphinx.errors import SphinxError

    out = Path(out).resolve()
    stage = Path(stage).resolve() if stage else out.with_name(out.name + "-src")
    cache = Path(cache).resolve() if cache else None
    notebooks = chapter_notebooks(chapters)
    info = {"machine": machine(), "date": dt.date.today().isoformat()}
    started = time.perf_counter()
    fingerprint = inputs_fingerprint()
    executed = []
    for path in notebooks:  # execute first: a failing notebook stops before any page is written
        nb = execute_notebook(path, cache, timeout=timeout, fingerprint=fingerprint, log=log)
        widgets_to_html(nb, path.name)
        check_no_errors(nb, path.name)
        nb.cells.insert(1, _provenance_cell(nb))
        executed.append((path, nb))
    if stage.exists():
        shutil.rmtree(stage)
    shutil.copytree(SITE_SOURCE, stage, ignore=shutil.ignore_patterns("__pycache__"))
    (stage / "chapters").mkdir()
    for path, nb in executed:
        nbformat.write(nb, stage / "chapters" / path.name)
    extra = _exercise_pages(notebooks, stage) + [_experiments_page(notebooks, stage)]
    (stage / "index.md").write_text(_landing_page(notebooks, extra, info))
    (stage / "site_info.json").write_text(json.dumps(info))
    _copy_mathjax(stage)
    if out.exists():
        shutil.rmtree(out)
    log(f"sphinx: building {len(notebooks)} chapters into {out}")
    warnings: list[str] = []

    class _Warnings:
        def write(self, text: str) -> None:
            if text.strip():
                warnings.append(text.strip())
                log(text.rstrip())

        def flush(self) -> None:
            pass

    try:
        with warnings_module.catch_warnings():
            # Sphinx 9 announces API changes its extensions have not made yet (not the site's)
            warnings_module.filterwarnings("ignore", message=".*deprecated. Check CHANGES for Sphinx")
            # HTML first inside the stage: myst-nb writes its executed copies beside the output
            # folder (``jupyter_execute``), and those go with the stage, not into ``out``'s parent
            app = Sphinx(str(stage), str(stage), str(stage / "_html"), str(stage / ".doctrees"),
                         "html", status=None, warning=_Warnings(), freshenv=True)
            app.build()
    except SphinxError as exc:
        raise SiteBuildError(f"sphinx stopped: {exc}") from None
    if app.statuscode:
        raise SiteBuildError("sphinx reported errors:\n" + "\n".join(warnings[-20:]))
    shutil.move(str(stage / "_html"), str(out))
    shutil.rmtree(stage)  # generated sources and executed copies (kept only when a build fails)
    log(f"site: {out / 'index.html'} ({len(notebooks)} chapters, "
        f"{time.perf_counter() - started:.0f} s, {len(warnings)} warnings)")
    return out / "index.html"


def _copy_mathjax(stage: Path) -> None:
    """MathJax 2 from the ``jupyter-server-mathjax`` package into ``_static/mathjax`` (the
    pages' equations render without a CDN); skipped, with equations as TeX, if absent."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        return
    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    if (source / "MathJax.js").exists():
        shutil.copytree(source, stage / "_static" / "mathjax")


# ----------------------------------------------------------------------------- checking


def site_pages(html_dir: str | Path) -> list[Path]:
    """Every HTML page of a built site (Sphinx's own ``_static``, ``_sources`` excluded)."""
    root = Path(html_dir)
    return sorted(p for p in root.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(root).parts[:-1]))


def broken_links(html_dir: str | Path) -> list[str]:
    """Internal ``href``/``src`` targets of the built pages that name no file of the site."""
    from urllib.parse import unquote, urlsplit

    root = Path(html_dir).resolve()
    problems = []
    for page in site_pages(root):
        text = page.read_text(errors="replace")
        for attr, target in re.findall(r'\b(href|src)="([^"]*)"', text):
            url = urlsplit(html.unescape(target))
            if url.scheme or url.netloc or not url.path or target.startswith("#"):
                continue
            resolved = (page.parent / unquote(url.path)).resolve()
            if not resolved.exists():
                problems.append(f"{page.relative_to(root)}: {attr}={target}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlm_course.tools.site",
                                     description="Build the course as a static website.")
    parser.add_argument("--chapters", nargs="*", default=None,
                        help="chapter numbers or notebook names (default: every chapter)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the built HTML's folder")
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds a cell may run (default 900, as nbval in make test)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE),
                        help="executed notebooks' cache ('' to execute every notebook again)")
    args = parser.parse_args(argv)
    try:
        index = build_site(args.out, args.chapters or None, cache=args.cache or None,
                           timeout=args.timeout)
    except SiteBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    problems = broken_links(index.parent)
    if problems:
        print("error: links to missing files:\n" + "\n".join(problems[:30]), file=sys.stderr)
        return 1
    print(f"open {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
