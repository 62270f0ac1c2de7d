# Quick start: `make demo` (set up, then the main job) and `make test` (set up, then every test).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Extra package index for torch, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu on a Linux
# machine without a GPU (PyPI's Linux wheel of torch bundles CUDA and is several GB).
TORCH_INDEX ?=
STAMP := $(VENV)/.installed
# One stamp per torch source, so that `make demo TORCH_INDEX=...` after a first set-up reinstalls
# torch from the new index instead of doing nothing.
TORCH_STAMP := $(VENV)/.torch-from-$(if $(TORCH_INDEX),$(shell echo '$(TORCH_INDEX)' | tr -c 'A-Za-z0-9\n' '_'),pypi)
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=900 \
         --nbval-sanitize-with tests/nbval_sanitize.cfg
# JupyterLab refuses to start as root (e.g. in a container) unless told to.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

.PHONY: setup demo test lab bench exercises clean clean-outputs browser check-workers

$(TORCH_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if ls $(VENV)/.torch-from-* >/dev/null 2>&1; then $(BIN)/python -m pip uninstall --quiet --yes torch; fi
	rm -f $(VENV)/.torch-from-*
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $(TORCH_STAMP)

$(STAMP): pyproject.toml $(TORCH_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev]" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python -m rlm_course grpo --task addition --name demo --overwrite

# The JupyterLab browser test drives Debian's chromium; installed here when missing and possible
# (as root with apt-get), otherwise that one test says what to install and is skipped.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium and chromium-driver for the browser test"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	      chromium-driver >/dev/null) || echo "could not install chromium: the browser test will be skipped"; \
	  else echo "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver): the browser test will be skipped"; fi; \
	fi

# TEST_WORKERS must be 0 (one process) or a positive whole number, checked before the set-up.
check-workers:
	@case '$(TEST_WORKERS)' in \
	  0) ;; \
	  ''|*[!0-9]*|0*) echo "make test: TEST_WORKERS='$(TEST_WORKERS)' must be 0 (one process at the machine's threads) or a number of workers, e.g. 2 (the default)" >&2; exit 2;; \
	esac

# The tests run on TEST_WORKERS pytest-xdist workers of one thread each; `--dist loadfile` keeps a
# notebook's cells (and a test file's shared fixtures) on one worker. Most of the suite is small
# models, process start-ups and waits, which two single-threaded workers overlap: on an idle 2-core
# CPU 16 minutes against 25 for one worker of two threads. `make test TEST_WORKERS=0` runs it in
# one process at the machine's threads, as before.
TEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: check-workers setup browser
	$(BIN)/python -m rlm_course exercises --check
	$(if $(PARALLEL),OMP_NUM_THREADS=1 ,)$(BIN)/python -m pytest $(PARALLEL) tests notebooks solutions exercises $(NBVAL)

# The repository is JupyterLab's root (exercises/ and solutions/ are one click away) and it opens on
# notebooks/; .jupyter/ makes every save drop the outputs, so running the course keeps the
# committed notebooks clean for `make test`.
lab: setup
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter $(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR) \
	    --LabApp.default_url=/lab/tree/notebooks $(ALLOW_ROOT)

# Remove the outputs a notebook editor saved into the committed notebooks (make lab never does).
clean-outputs: setup
	$(BIN)/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb

bench: setup
	$(BIN)/python -m rlm_course bench sampling
	$(BIN)/python -m rlm_course bench train
	$(BIN)/python -m rlm_course bench family
	$(BIN)/python -m rlm_course bench parallel

# The course as a static website in build/site/ (open build/site/index.html): every chapter
# executed (cached in build/site-cache/ until its code, the package or data/ change), then
# Sphinx + myst-nb. A part only: make site SITE_CHAPTERS="00 06". Offline; no Node needed.
SITE_CHAPTERS ?=
SITE_TIMEOUT ?= 900
.PHONY: site
site: setup
	$(BIN)/python -m rlm_course.tools.site --timeout $(SITE_TIMEOUT) $(if $(SITE_CHAPTERS),--chapters $(SITE_CHAPTERS))

exercises: setup
	$(BIN)/python -m rlm_course exercises

clean:
	rm -rf $(VENV) runs
