#!/usr/bin/env bash
# The optional lerobot environment of the offset line (nbs/offset_lerobot.ipynb, tests/test_offset_lerobot.py).
#
# lerobot 0.4.4 pins torch<2.11 and huggingface-hub<0.36; pixrl's .venv has torch 2.13 and huggingface-hub 2.x.
# So lerobot is NOT installed into .venv: `pip install --target` puts it, without its dependency resolution
# (--no-deps), into a private folder that only scripts/lerobot_env.py puts on sys.path (appended: nothing
# there can shadow a package of .venv). The packages below are what importing
# lerobot.policies.vqbet.modeling_vqbet needs beyond .venv, pinned inside lerobot's own ranges where it has one.
# torchvision 0.28.0 is the release built for torch 2.13; its C++ ops cannot load against the CPU torch of
# .venv (the wheel is a CUDA build) — scripts/lerobot_env.py says how that is handled.
#
# Folder: $PIXRL_LEROBOT_DIR, default $PIXRL_CACHE/envs/lerobot-0.4.4 ($PIXRL_CACHE defaults to ~/.cache/pixrl).
# Idempotent: a stamp file with the installed versions marks a finished install.
set -euo pipefail
PY=${PY:-.venv/bin/python}
DIR=${PIXRL_LEROBOT_DIR:-${PIXRL_CACHE:-$HOME/.cache/pixrl}/envs/lerobot-0.4.4}
STAMP="$DIR/.pixrl-lerobot.json"
PKGS=(
  lerobot==0.4.4
  draccus==0.10.0 mergedeep==1.3.4 pyyaml-include==1.4.1 toml==0.10.2 typing-inspect==0.9.0 mypy-extensions==1.1.0
  einops==0.8.2 torchvision==0.28.0
  imageio==2.37.0 diffusers==0.35.2 pyserial==3.5 deepdiff==8.6.1 orderly-set==5.5.0 av==15.1.0
)
if [ -f "$STAMP" ]; then echo "lerobot environment present: $DIR"; exit 0; fi
mkdir -p "$DIR"
echo "installing ${PKGS[*]} into $DIR (--no-deps; .venv is not touched)"
"$PY" -m pip install -q --no-deps --target "$DIR" "${PKGS[@]}"
"$PY" - "$DIR" "$STAMP" <<'PYEOF'
import json, sys
from importlib import metadata
d, stamp = sys.argv[1], sys.argv[2]
versions = {dist.metadata["Name"]: dist.version for dist in metadata.distributions(path=[d])}
json.dump({"dir": d, "versions": dict(sorted(versions.items()))}, open(stamp, "w"), indent=1)
print("installed:", versions)
PYEOF
