#!/usr/bin/env bash
# `make gpu-wheels`: download into .whl/ the wheels a GPU machine without internet lacks for `make gpu-check`.
#
# The lent GPU machine ("device") has Python 3.12 with torch (CUDA), transformers 5.17, accelerate, huggingface_hub
# 1.33, tokenizers 0.23.2, safetensors, numpy, pandas, pyarrow, peft (unknown version), ... but no trl, datasets,
# dill or multiprocess, and no package index. This script runs where pip reaches PyPI and fetches, for CPython 3.12
# on manylinux x86_64, exactly the wheels below: trl/datasets/peft/transformers pinned to the versions this repo's
# .venv is tested with (tests/test_pix_gpu_check.py checks the pins against the installed versions), plus the
# dependencies of those that the device lacks or has in too old a version. scripts/gpu_check_device.sh installs
# them with `pip install --no-index --no-deps --target` there.
#
# usage: scripts/gpu_wheels.sh [DEST]     (default .whl; the old contents of DEST are removed first)
# env:   PYVER (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PYVER=${PYVER:-3.12}
PY=${PY:-python3}

# One version of each; keep in step with .venv (the test reads these lines: NAME==VERSION, one per line).
WHEELS=(
  trl==1.16.0           # not on the device
  datasets==5.2.0       # not on the device (trl needs it)
  dill==0.4.1           # datasets: dill<0.4.2; not on the device
  multiprocess==0.70.19 # datasets: multiprocess<0.70.20; not on the device (wheel is per Python version)
  peft==0.21.2          # device's version unknown: carry the tested one
  transformers==5.24.0  # device has 5.17.0: carry the tested one
)

rm -rf "$DEST"; mkdir -p "$DEST"
plat=(); for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
                   manylinux1_x86_64; do plat+=(--platform "$p"); done
specs=(); for w in "${WHEELS[@]}"; do specs+=("${w%%#*}"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${plat[@]}" -d "$DEST" "${specs[@]}"

n=$(ls "$DEST"/*.whl | wc -l)
[ "$n" -eq "${#WHEELS[@]}" ] || { echo "gpu-wheels: expected ${#WHEELS[@]} wheels, got $n" >&2; exit 1; }
ls -l "$DEST"/*.whl | awk '{printf "  %7.2f MiB  %s\n", $5/1048576, $NF}'
du -cb "$DEST"/*.whl | awk 'END {printf "gpu-wheels: %d wheels, %.1f MiB in %s\n", '"$n"', $1/1048576, "'"$DEST"'"}'
