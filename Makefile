# pixrl — every target builds its own environment first (make setup is idempotent).
SHELL := /bin/bash
VENV  := .venv
PY    := $(CURDIR)/$(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STAMP := $(VENV)/.pixrl-setup

.PHONY: setup test train probe lab bench-eval gpu-check tiny export clean-nbs

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

# The main job: arm B (base RL L0 -> L4) on the embedded pixrl-tiny; re-running resumes (finished stages are skipped).
train: setup
	papermill nbs/train.ipynb runs/b.ipynb -p arm B --cwd nbs

# The fixed 80-task probe of a model (default pixrl-tiny); -> runs/probe.ipynb + runs/probe/probe.json
probe: setup
	papermill nbs/probe.ipynb runs/probe.ipynb --cwd nbs

# Smoke campaign on CUDA with a from-config model larger than pixrl-tiny; refuses clearly without a GPU.
gpu-check: setup
	python scripts/gpu_check.py

# Rebuild pixrl-tiny from its seed (~35 min on 2 free cores); the committed copy is in data/models/pixrl-tiny.
tiny: setup
	papermill nbs/base_model.ipynb runs/base_model.ipynb --cwd nbs

# Evaluator throughput: in-process vs sandbox (2 workers) vs spawn-per-candidate, one run (~3-5 min).
bench-eval: setup
	papermill nbs/bench_eval.ipynb runs/bench_eval.ipynb --cwd nbs

lab: setup
	jupyter lab --notebook-dir=nbs

clean-nbs: setup
	nbdev_clean
