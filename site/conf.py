"""Sphinx configuration of the course's website (``make site``; see rlm_course/tools/site.py).

The build copies this folder next to the generated pages and writes ``site_info.json`` (the
build machine and date) beside it; the notebooks arrive already executed, so myst-nb only
renders them.
"""

import json
from pathlib import Path

_info = json.loads((Path(__file__).parent / "site_info.json").read_text())

project = "RL post-training systems: a course"
author = "the rlm_course authors"
copyright = f"{_info['date'][:4]}, {author} (MIT licence)"
extensions = ["myst_nb"]
exclude_patterns = ["_build", ".doctrees", "**.ipynb_checkpoints", "data/**"]
suppress_warnings = ["mystnb.unknown_mime_type"]

# Notebooks are executed, cached and checked for errors before Sphinx sees them.
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # widgets are static snapshots: no widget manager from a CDN
nb_output_stderr = "show"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "html_image", "colon_fence"]
myst_heading_anchors = 3

# MathJax 2 copied from the jupyter-server-mathjax package into _static (no CDN), with the one
# configuration and the STIX-Web fonts it ships (as Jupyter's classic notebook set them).
if (Path(__file__).parent / "_static" / "mathjax" / "MathJax.js").exists():
    mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
    mathjax2_config = {
        "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                    "processEscapes": True, "ignoreClass": "document",
                    "processClass": "math|output_area"},
        "HTML-CSS": {"availableFonts": [], "imageFont": None, "preferredFont": None,
                     "webFont": "STIX-Web"},
        "messageStyle": "none",
        "menuSettings": {"zoom": "None"},
    }
    mathjax3_config = None

html_theme = "sphinx_book_theme"
html_title = "RL post-training systems"
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_favicon = "_static/favicon.svg"  # a page without one makes the browser ask for /favicon.ico
html_context = {"default_mode": "auto"}  # the theme logs an error on a first visit without it
html_last_updated_fmt = None
# no _sources/ copies: they would ship every chapter as an executed .ipynb; the clean notebooks
# are in the repository (the download button keeps the page's PDF print)
html_copy_source = False
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "extra_footer": (f'<p class="build-machine">Numbers measured on {_info["machine"]}; '
                     f'site built on {_info["date"]}. Run any chapter yourself: '
                     '<code>make lab</code>.</p>'),
}
