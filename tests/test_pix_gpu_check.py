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


SCRIPTS = SCRIPT.parent


@pytest.mark.parametrize("name", ["gpu_check_device.sh", "gpu_wheels.sh"])
def test_device_scripts_parse(name):
    r = subprocess.run(["bash", "-n", str(SCRIPTS / name)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_carried_wheels_match_tested_versions():
    "The wheels `make gpu-wheels` carries to a GPU machine are the versions installed (and so tested) here."
    import importlib.metadata as md, re
    text = (SCRIPTS / "gpu_wheels.sh").read_text()
    block = re.search(r"^WHEELS=\((.*?)^\)", text, re.S | re.M).group(1)
    pins = re.findall(r"^\s*([A-Za-z0-9_.-]+)==(\S+)", block, re.M)
    names = [n.lower() for n, _ in pins]
    assert len(names) == len(set(names)), f"one version of each: {pins}"
    assert {"trl", "peft", "transformers", "datasets"} <= set(names)
    for n, v in pins:
        assert md.version(n) == v, f"gpu_wheels.sh pins {n}=={v} but {md.version(n)} is installed here"
