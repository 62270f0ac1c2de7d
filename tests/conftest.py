import os

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collectstart(collector):
    # nbval: never compare stderr (kernel warnings, tqdm bars); correctness lives in cell asserts.
    if collector.fspath and str(collector.fspath).endswith(".ipynb"):
        collector.skip_compare += ("stderr",)
