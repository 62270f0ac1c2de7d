"""JupyterLab as `make lab` starts it (the repository's .jupyter/ settings): saving a notebook drops
its outputs and keeps the paired .py as it is, so running the course never breaks `make test`;
and, in a real browser (headless Chromium), the calculators' notebook runs and its rendered output
follows a control the learner changes."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from rlm_course.utils import repo_root

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = repo_root()
NOTEBOOK = "06_work_and_depth"  # the calculators' notebook (work-depth and the RL-step calculator)
TOKEN = "rlm-course-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1, started like `make lab`, over a copy of the notebook."""
    root = tmp_path_factory.mktemp("lab")
    for suffix in (".ipynb", ".py"):
        shutil.copy(ROOT / "notebooks" / f"{NOTEBOOK}{suffix}", root)
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(ROOT / ".jupyter"), "OMP_NUM_THREADS": "1"}
    command = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                pytest.fail("JupyterLab did not start within 2 minutes")
            time.sleep(0.5)
    yield base, root
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


def test_saving_in_lab_drops_outputs_and_keeps_the_paired_py(lab):
    base, root = lab
    url = f"{base}/api/contents/{NOTEBOOK}.ipynb?token={TOKEN}"
    content = json.load(urllib.request.urlopen(url))["content"]
    for cell in content["cells"]:  # as if every cell had run
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
            cell["execution_count"] = 1
    content["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    # what a run in JupyterLab writes into the metadata: the kernel's display name, the version
    content["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    content["metadata"]["language_info"] = {"name": "python", "version": "3.11.2",
                                            "mimetype": "text/x-python"}
    body = json.dumps({"type": "notebook", "format": "json", "content": content}).encode()
    request = urllib.request.Request(url, data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(request).status == 200
    saved = json.loads((root / f"{NOTEBOOK}.ipynb").read_text())
    code = [c for c in saved["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert "widgets" not in saved["metadata"]
    assert saved["metadata"] == json.loads(
        (ROOT / "notebooks" / f"{NOTEBOOK}.ipynb").read_text())["metadata"]
    assert (root / f"{NOTEBOOK}.py").read_text() == \
        (ROOT / "notebooks" / f"{NOTEBOOK}.py").read_text()


def _run_all(driver, url: str, timeout: int):
    """Open the notebook at ``url`` in JupyterLab, wait for its kernel, then Run > Run All Cells,
    as a learner would; returns the WebDriverWait used."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout)
    driver.get(url)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".jp-Notebook .jp-Cell")))
    WebDriverWait(driver, 120).until(  # the kernel is up
        lambda d: "Idle" in d.find_element(By.TAG_NAME, "body").text
        or d.find_elements(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator"))
    wait.until(ec.element_to_be_clickable((By.XPATH, "//div[contains(@class,'lm-MenuBar-itemLabel') and text()='Run']"))).click()
    wait.until(ec.element_to_be_clickable((By.XPATH, "//li[contains(@class,'lm-Menu-item')][.//div[text()='Run All Cells']]"))).click()
    return wait


def test_the_calculator_runs_in_a_browser_and_follows_a_control(lab, chrome):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chrome()
    base, _ = lab
    wait = _run_all(driver, f"{base}/lab/tree/{NOTEBOOK}.ipynb?token={TOKEN}", 180)
    status = wait.until(ec.presence_of_element_located(
        (By.XPATH, "//div[contains(@class,'widget-html-content')][contains(., 'one iteration')]")))
    # every cell has run when the last cell's prompt shows a number
    wait.until(lambda d: all(p.text.strip() not in ("[*]:", "[ ]:") for p in d.find_elements(
        By.CSS_SELECTOR, ".jp-CodeCell .jp-InputPrompt")))
    before = status.text
    box = driver.find_element(By.XPATH, "//div[contains(@class,'widget-inline-hbox')]"
                                        "[.//label[text()='devices']]//input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("128", Keys.ENTER)
    WebDriverWait(driver, 60).until(lambda d: status.text != before)
    assert "one iteration" in status.text and status.text != before


PLANNER = "14_capstone_plan_a_cluster"  # the planner widget's home (section 6)


def test_the_planner_widget_of_notebook_14_answers_in_a_browser_and_marks_a_stale_answer(lab, chrome):
    """Notebook 14's planner-widget cell (the whole notebook runs for minutes: only that cell is
    copied into a notebook of its own) runs in JupyterLab, shows its answer, marks it stale when
    a control changes and answers again when Plan is pressed."""
    import nbformat
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from rlm_course.cluster.planner_widget import STALE

    driver = chrome()
    base, root = lab
    source = nbformat.read(ROOT / "notebooks" / f"{PLANNER}.ipynb", as_version=4)
    cells = [c for c in source.cells if c.cell_type == "code" and "PlannerWidget()" in c.source]
    assert len(cells) == 1, "notebook 14 has one cell that shows the planner widget"
    scratch = nbformat.v4.new_notebook(cells=cells, metadata=source.metadata)
    nbformat.write(scratch, root / f"{PLANNER}_widget.ipynb")
    wait = _run_all(driver, f"{base}/lab/tree/{PLANNER}_widget.ipynb?token={TOKEN}", 240)
    answer = wait.until(ec.presence_of_element_located(
        (By.XPATH, "//div[contains(@class,'widget-html-content')][contains(., '1. ')]")))
    first = answer.text
    assert "why the others lose" in first and STALE not in first
    box = driver.find_element(By.XPATH, "//div[contains(@class,'widget-inline-hbox')]"
                                        "[.//label[text()='GPUs']]//input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("32", Keys.ENTER)
    WebDriverWait(driver, 60).until(lambda d: STALE in answer.text)
    assert answer.text.startswith(STALE) and first.splitlines()[0] in answer.text
    driver.find_element(By.XPATH, "//button[contains(@class,'jupyter-button')]"
                                  "[normalize-space(.)='Plan']").click()
    WebDriverWait(driver, 240).until(lambda d: STALE not in answer.text
                                     and answer.text.startswith("1. "))
    assert answer.text != first  # planned again, for 32 GPUs
