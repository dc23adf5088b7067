# pixrl — every target builds its own environment first (make setup is idempotent).
SHELL := /bin/bash
VENV  := .venv
PY    := $(CURDIR)/$(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STAMP := $(VENV)/.pixrl-setup

.PHONY: setup test train probe lab bench bench-eval gpu-check export clean-nbs

setup: $(STAMP)

# torch first, from this machine's CPU build: a plain `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (pixrl .venv)" >/dev/null
	touch $@

export: setup
	nbdev_export

# The test target: generated package and cleaned notebooks must already be committed, then all tests.
test: setup
	nbdev_export
	@if [ -n "$$(git status --porcelain -- pixrl)" ]; then \
	  echo "nbdev_export changed pixrl/ — edit the notebooks, export, and commit:"; git status --porcelain -- pixrl; exit 1; fi
	nbdev_clean
	@if [ -n "$$(git status --porcelain -- nbs)" ]; then \
	  echo "nbdev_clean changed notebooks — run nbdev_clean and commit:"; git status --porcelain -- nbs; exit 1; fi
	nbdev_test
	python -m pytest -q -p no:cacheprovider tests

train: setup
	@echo "make train: the pix GRPO campaign is not implemented yet (issue: GRPO campaigns on depth-v1)." >&2; exit 2

# Evaluator throughput: in-process vs sandbox (2 workers) vs spawn-per-candidate, one run (~3-5 min).
bench-eval: setup
	papermill nbs/bench_eval.ipynb runs/bench_eval.ipynb --cwd nbs

lab: setup
	jupyter lab --notebook-dir=nbs

clean-nbs: setup
	nbdev_clean
