# The course's JupyterLab settings, loaded by `make lab` (JUPYTER_CONFIG_PATH=.jupyter): a notebook
# is saved without its outputs, so that running the course never changes the committed notebooks
# (nbval and `make test` expect them clean). Your code and markdown edits are saved as usual;
# outputs reappear when you run the cells again.
import json
import os
import warnings

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

#: Metadata that running a notebook rewrites (the kernel's display name, the Python version in
#: language_info) but that belong to the file, not to the run: kept as they are on disk.
RUN_METADATA = ("kernelspec", "language_info")


def strip_outputs(model, path=None, contents_manager=None, **kwargs):
    """Drop code cells' outputs and execution counts, and saved widget state, before a save; keep
    the kernel metadata the notebook has on disk, so that a run and a save leave `git status`
    clean (here and in the paired .py, whose header jupytext writes from the same metadata)."""
    if model.get("content") is None:
        return
    if model.get("type") == "file" and str(path).endswith(".py"):
        _keep_paired_header(model, path, contents_manager)
        return
    if model.get("type") != "notebook":
        return
    notebook = model["content"]
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    metadata = notebook.setdefault("metadata", {})
    metadata.pop("widgets", None)
    on_disk = _metadata_on_disk(path, contents_manager)
    if on_disk is not None:
        for key in RUN_METADATA:
            if key in on_disk:
                metadata[key] = on_disk[key]
            else:
                metadata.pop(key, None)


def _keep_paired_header(model, path, contents_manager):
    """A paired .py (jupytext writes it with the notebook): keep the YAML header it has on disk
    (kernel name, jupytext version), so that only the learner's code and text change."""
    text, old = model["content"], _read(path, contents_manager)
    header = "# ---\n"
    if not (isinstance(text, str) and old and text.startswith(header) and old.startswith(header)):
        return
    end_new, end_old = text.find("\n" + header, 1), old.find("\n" + header, 1)
    if end_new > 0 and end_old > 0:
        model["content"] = old[:end_old] + text[end_new:]


def _read(path, contents_manager):
    root = getattr(contents_manager, "root_dir", None)
    if not path or root is None:
        return None
    try:
        with open(os.path.join(root, str(path).lstrip("/")), encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _metadata_on_disk(path, contents_manager):
    """The metadata of the saved file at API ``path`` (None for a new or unreadable file)."""
    try:
        return json.loads(_read(path, contents_manager)).get("metadata", {})
    except (TypeError, ValueError, AttributeError):
        return None


# One setting, on the base class every contents manager (jupytext's included) derives from.
# Jupytext's extension applies the configuration to its contents manager a second time, and
# Jupyter then warns that the hook overrides itself: the same hook, so that warning says nothing.
warnings.filterwarnings("ignore", message=r"Overriding existing pre_save_hook \(strip_outputs\) "
                                          r"with a new one \(strip_outputs\)")
c.ContentsManager.pre_save_hook = strip_outputs
