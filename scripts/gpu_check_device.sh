#!/usr/bin/env bash
# `make gpu-check`: run scripts/gpu_check.py with a system Python that already has a CUDA torch, no internet needed.
#
# Made for a GPU machine without a package index (the lent "device": Python 3.12, CUDA torch, transformers,
# accelerate, huggingface_hub, ... but no trl/datasets): the wheels it lacks are carried in .whl/ (built here by
# `make gpu-wheels`, i.e. scripts/gpu_wheels.sh), installed (when $PY3 has no trl) with --no-index into $PIXRL_SITE (default
# /tmp/pixrl-site) and put first on PYTHONPATH, with the repo root after them: pixrl is imported from this checkout,
# not installed (the campaign's subprocesses inherit PYTHONPATH). Without .whl/ the interpreter's own packages are used.
#
#   on the device:   bash scripts/gpu_check_device.sh            (with `.whl` named in the call's carry)
#   anywhere:        make gpu-check                               (system python3)
#   CUDA venv:       make gpu-check PY3=.venv/bin/python          (or PY3=... bash scripts/gpu_check_device.sh)
#   no GPU:          bash scripts/gpu_check_device.sh --cpu-dry-run --hidden 128 --layers 2
# The device call: `make gpu-wheels` here, then run(command="bash scripts/gpu_check_device.sh", carry=[".whl"],
# timeout_s=600); the log, gpu_check.json and campaign.log come back from $OUT.
#
# Arguments go to scripts/gpu_check.py (--hidden, --layers, --keep, --cpu-dry-run, --timeout; the campaign is
# stopped after $GPU_CHECK_TIMEOUT s, default 480, so that its log still comes back within a 10-minute call).
# Output is also written to ${OUT:-/tmp}/gpu_check.log; gpu_check.py adds $OUT/gpu_check.json and $OUT/campaign.log.
# Exits with gpu_check.py's status (2: no CUDA visible, 1: the campaign failed, 0: done).
set -uo pipefail
cd "$(dirname "$0")/.."
PY3=${PY3:-python3}
SITE=${PIXRL_SITE:-/tmp/pixrl-site}
LOG=${OUT:-/tmp}/gpu_check.log

if ! "$PY3" -c "import torch" 2>/dev/null; then
  echo "gpu-check: $PY3 has no torch; run with a Python that has a CUDA torch (PY3=/path/to/python, e.g." \
       "PY3=.venv/bin/python on a CUDA venv) — the lent GPU machine's python3 has one" >&2
  exit 2
fi

# carried wheels only where they are needed: an interpreter without trl (the lent machine); a full env uses its own
if compgen -G ".whl/*.whl" >/dev/null && ! "$PY3" -c "import trl" 2>/dev/null; then
  echo "gpu-check-device: installing $(ls .whl/*.whl | wc -l) carried wheels into $SITE"
  "$PY3" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "gpu-check-device: installing .whl/*.whl failed" >&2; exit 3; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

{
  command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "gpu-check-device: no nvidia-smi"
  "$PY3" - "$SITE" <<'EOF'
import importlib.metadata as md, sys
from pathlib import Path
print("python", sys.version.split()[0], sys.executable)
for n in ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "huggingface_hub", "tokenizers"):
    try:
        m = __import__(n); print(f"  {n} {getattr(m, '__version__', '?')} from {Path(m.__file__).parent.parent}")
    except Exception as e:
        print(f"  {n}: cannot import ({type(e).__name__}: {e})")
try:
    import torch; print("  cuda available:", torch.cuda.is_available(), "| torch CUDA build:", torch.version.cuda)
except Exception: pass
# The carried wheels were installed with --no-deps: name any requirement of theirs that this machine misses.
try:
    from packaging.requirements import Requirement
    carried = [d for d in md.distributions(path=[sys.argv[1]])] if Path(sys.argv[1]).is_dir() else []
    for d in carried:
        for r in map(Requirement, d.requires or []):
            if r.marker and not r.marker.evaluate({"extra": ""}): continue
            try: v = md.version(r.name)
            except md.PackageNotFoundError: print(f"  WARNING: {d.metadata['Name']} needs {r}: not installed"); continue
            if not r.specifier.contains(v, prereleases=True):
                print(f"  WARNING: {d.metadata['Name']} needs {r}: found {v}")
except Exception as e:
    print("  (requirement check skipped:", e, ")")
EOF
  "$PY3" scripts/gpu_check.py --timeout "${GPU_CHECK_TIMEOUT:-480}" "$@"
} 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
echo "gpu-check-device: exit $rc (log: $LOG)"
exit "$rc"
