"`make gpu-check` (scripts/gpu_check.py) on a machine without CUDA: a clear refusal, not a CPU run posing as a GPU check."
import subprocess, sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a machine without CUDA must see")
def test_refuses_without_cuda():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "no CUDA device" in r.stderr and r.stdout == ""
