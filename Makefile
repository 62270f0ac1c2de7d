# Quick start: `make demo` (set up, then the main job) and `make test` (set up, then every test).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Extra package index for torch, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu on a Linux
# machine without a GPU (PyPI's Linux wheel of torch bundles CUDA and is several GB).
TORCH_INDEX ?=
STAMP := $(VENV)/.installed
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=900 \
         --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: setup demo test lab bench exercises clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python -m rlm_course grpo --task addition --name demo --overwrite

test: setup
	$(BIN)/python -m rlm_course exercises --check
	$(BIN)/python -m pytest tests notebooks solutions exercises $(NBVAL)

lab: setup
	$(BIN)/jupyter lab notebooks

bench: setup
	$(BIN)/python -m rlm_course bench sampling
	$(BIN)/python -m rlm_course bench train
	$(BIN)/python -m rlm_course bench family
	$(BIN)/python -m rlm_course bench parallel

exercises: setup
	$(BIN)/python -m rlm_course exercises

clean:
	rm -rf $(VENV) runs
