"""The course as a website (`make site`, rlm_course/tools/site.py): built from a small part of the
course (the landing page and chapter 06, which has plots and a calculator) with the same function
as `make site`, then opened page by page in headless Chromium: every page loads without a console
error, every image has a size, every internal link and anchor resolves, the calculator shows its
output and the search finds a chapter. A notebook whose cell raises stops the build, named."""

import functools
import http.server
import re
import threading
import tomllib
import urllib.request
from urllib.parse import urldefrag, urlsplit

import nbformat
import pytest
from rlm_course.tools.site import (CACHE_SUFFIX, SiteBuildError, broken_links, build_site,
                                   execute_notebook, site_pages)
from rlm_course.utils import repo_root

ROOT = repo_root()
CHAPTER = "06_work_and_depth"  # light (about 40 s on 2 cores), with plots and the calculator


def test_site_packages_are_pinned_and_installed_by_the_dev_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    site, dev = extras["site"], set(extras["dev"])
    pinned = [spec for spec in site if "==" in spec]
    assert {s.split("==")[0] for s in pinned} >= {"sphinx", "myst-nb", "sphinx-book-theme"}
    assert set(site) <= dev, "make test installs .[dev]: it must hold every site package"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the site's packages: pip install -e '.[site]'")
    root = tmp_path_factory.mktemp("site")
    index = build_site(root / "html", [CHAPTER[:2]], cache=root / "cache", log=lambda _: None)
    return index.parent


@pytest.mark.slow
def test_the_built_site_has_its_pages_and_no_broken_link(site):
    pages = {p.relative_to(site).as_posix() for p in site_pages(site)}
    assert {"index.html", f"chapters/{CHAPTER}.html", "experiments.html", "search.html",
            "exercises/index.html", "exercises/ex06_workdepth.html"} <= pages
    assert broken_links(site) == []
    assert not list(site.rglob("*.ipynb"))  # no executed notebook leaves with the site
    chapter = (site / "chapters" / f"{CHAPTER}.html").read_text()
    assert "widget-view+json" not in chapter and "cdn.jsdelivr" not in chapter
    assert 'class="widget-snapshot calculator"' in chapter and "make lab" in chapter
    assert chapter.count("<img") >= 3  # the chapter's plots
    experiments = re.sub(r"<[^>]+>", "", (site / "experiments.html").read_text())
    assert "python -m rlm_course systems async" in experiments and "systems-async.json" in experiments
    for page in ("index.html", f"chapters/{CHAPTER}.html"):
        assert re.search(r"Numbers measured on a \d+-core CPU.*site built on \d{4}-\d\d-\d\d",
                         (site / page).read_text(), flags=re.S)


def test_a_failing_cell_stops_the_build_naming_the_notebook_and_the_cell(tmp_path):
    pytest.importorskip("sphinx", reason="the site's packages: pip install -e '.[site]'")
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · Broken"), nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("raise RuntimeError('the cell fails')")]
    path = tmp_path / "99_broken.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(SiteBuildError, match=r"99_broken\.ipynb: cell 2 .*RuntimeError: the cell fails"):
        build_site(tmp_path / "html", [path], cache=tmp_path / "cache", log=lambda _: None)
    assert not (tmp_path / "html").exists()  # nothing published
    assert not list((tmp_path / "cache").glob("*"))  # nor cached


def test_an_executed_notebook_is_cached_under_its_inputs(tmp_path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell("import random; random.seed(0); print(random.random())")]
    path = tmp_path / "98_seeded.ipynb"
    nbformat.write(nb, path)
    messages = []
    first = execute_notebook(path, tmp_path / "cache", fingerprint="a", log=messages.append)
    again = execute_notebook(path, tmp_path / "cache", fingerprint="a", log=messages.append)
    assert "from the cache" in messages[-1] and again.cells[0].outputs == first.cells[0].outputs
    assert first.cells[0].outputs[0]["text"].strip() == "0.8444218515250481"
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# An edited text"))
    nbformat.write(nb, path)
    edited = execute_notebook(path, tmp_path / "cache", fingerprint="a", log=messages.append)
    assert "from the cache" in messages[-1] and edited.cells[0].source == "# An edited text"
    assert edited.cells[1].outputs == first.cells[0].outputs
    execute_notebook(path, tmp_path / "cache", fingerprint="b", log=messages.append)
    assert "executed in" in messages[-1]  # other inputs: executed again, the old entry replaced
    assert len(list((tmp_path / "cache").glob(f"98_seeded-*{CACHE_SUFFIX}"))) == 1


@pytest.fixture(scope="module")
def browser(site, chrome):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield chrome(console=True), f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def _load(driver, url):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return document.readyState") == "complete")
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return Array.from(document.images).every(i => i.complete)"))


@pytest.mark.slow
@pytest.mark.browser
def test_every_page_loads_in_a_browser_with_its_images_links_and_no_console_error(site, browser):
    driver, base = browser
    fetched: dict[str, str] = {}

    def fetch(url: str) -> str:
        if url not in fetched:
            with urllib.request.urlopen(url, timeout=30) as response:
                assert response.status == 200, url
                fetched[url] = response.read().decode(errors="replace")
        return fetched[url]

    for page in site_pages(site):
        url = f"{base}/{page.relative_to(site).as_posix()}"
        _load(driver, url)
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"{url}: console errors {errors}"
        empty = driver.execute_script(
            "return Array.from(document.images).filter(i => !(i.naturalWidth > 0 && "
            "i.naturalHeight > 0)).map(i => i.src.slice(0, 100))")
        assert not empty, f"{url}: images without a size {empty}"
        if page.name not in ("genindex.html", "search.html"):
            assert "Numbers measured on" in driver.page_source, f"{url}: no build machine"
        links = driver.execute_script(
            "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        for link in links:
            if not link.startswith(base):
                continue
            target, fragment = urldefrag(link)
            text = fetch(target)
            if fragment and urlsplit(target).path.endswith(".html"):
                assert f'id="{fragment}"' in text, f"{url}: link to a missing anchor {link}"


@pytest.mark.slow
@pytest.mark.browser
def test_the_calculator_shows_its_output_and_the_search_finds_the_chapter(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, base = browser
    _load(driver, f"{base}/chapters/{CHAPTER}.html")
    calculator = driver.find_element(By.CSS_SELECTOR, ".widget-snapshot.calculator")
    driver.execute_script("arguments[0].scrollIntoView()", calculator)
    assert calculator.is_displayed()
    text = calculator.text
    assert "one iteration" in text and "devices" in text and "make lab" in text
    assert re.search(r"one iteration: [\d.]+ s", text)
    controls = calculator.find_elements(By.CSS_SELECTOR, "input, select")
    assert controls and all(not c.is_enabled() for c in controls)  # a snapshot, said so
    plots = driver.execute_script(
        "return Array.from(document.querySelectorAll('.cell_output img'))"
        ".map(i => [i.naturalWidth, i.naturalHeight])")
    assert len(plots) >= 3 and all(w > 100 and h > 100 for w, h in plots)
    _load(driver, f"{base}/search.html?q=Brent")
    WebDriverWait(driver, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results li a"))
    hits = [a.get_attribute("href") for a in
            driver.find_elements(By.CSS_SELECTOR, "#search-results li a")]
    assert any(CHAPTER in hit for hit in hits), hits
