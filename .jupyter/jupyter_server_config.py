# The course's JupyterLab settings, loaded by `make lab` (JUPYTER_CONFIG_PATH=.jupyter): a notebook
# is saved without its outputs, so that running the course never changes the committed notebooks
# (nbval and `make test` expect them clean). Your code and markdown edits are saved as usual;
# outputs reappear when you run the cells again.
c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)


def strip_outputs(model, **kwargs):
    """Drop code cells' outputs and execution counts, and saved widget state, before a save."""
    if model.get("type") != "notebook" or model.get("content") is None:
        return
    notebook = model["content"]
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    notebook.get("metadata", {}).pop("widgets", None)


c.FileContentsManager.pre_save_hook = strip_outputs
c.ContentsManager.pre_save_hook = strip_outputs
