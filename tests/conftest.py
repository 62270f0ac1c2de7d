import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def _start_a_dead_kernel_again():
    """nbval starts each notebook's kernel once; a kernel that dies before it answers (the port
    race of jupyter_client's random ports when two xdist workers and the distributed tests bind
    ports at once: ZMQError "Address already in use", nbmake issue #129) failed a notebook that
    never ran. Such a start is tried once more; a kernel that dies twice still fails."""
    from nbval import kernel

    start = kernel.start_new_kernel

    def start_new_kernel(*args, **kwargs):
        try:
            return start(*args, **kwargs)
        except RuntimeError as err:
            if "Kernel died before replying" not in str(err):
                raise
            return start(*args, **kwargs)

    kernel.start_new_kernel = start_new_kernel


_start_a_dead_kernel_again()


def pytest_collectstart(collector):
    # nbval: never compare stderr (kernel warnings, tqdm bars); correctness lives in cell asserts.
    if collector.fspath and str(collector.fspath).endswith(".ipynb"):
        collector.skip_compare += ("stderr",)


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    # A command run in-process (`main([...])`) sets torch's thread count for its job, from the
    # load average (1 on a busy 2-core machine): restored after each test, or every later test
    # in the session ran on one thread (the learning runs at about half their speed).
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    # a notebook's cells are items of one .ipynb: mark them so `-m "not notebook"` skips them
    for item in items:
        if str(item.fspath).endswith(".ipynb"):
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.slow)
    # the GPU path's tests run where torch sees a GPU and say why they do not elsewhere
    if not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here "
                                       "(run `python -m rlm_course gpu-check` on a GPU machine)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
