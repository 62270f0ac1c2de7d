import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collectstart(collector):
    # nbval: never compare stderr (kernel warnings, tqdm bars); correctness lives in cell asserts.
    if collector.fspath and str(collector.fspath).endswith(".ipynb"):
        collector.skip_compare += ("stderr",)


def pytest_collection_modifyitems(config, items):
    # a notebook's cells are items of one .ipynb: mark them so `-m "not notebook"` skips them
    for item in items:
        if str(item.fspath).endswith(".ipynb"):
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.slow)
