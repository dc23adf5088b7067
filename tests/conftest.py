"""Fixtures and helpers shared by several test files."""
import json
import shutil
import time
from pathlib import Path

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    "torch on one thread for the test, restored after: the offset fits compare numbers that thread count can change."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def min_seconds(fn, arg, repeat: int = 5) -> float:
    "The fastest of `repeat` timings of fn(arg): timing noise only adds, so the minimum is what a ratio test compares."
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return min(times)


@pytest.fixture
def best_time():
    "`min_seconds` (the fastest of `repeat` timings of fn(arg)) for the linear-time tests of parent-side text handling."
    return min_seconds


def notebook_parameters(path) -> dict:
    "The values the papermill `parameters` cell of the notebook at `path` assigns, in order (the cell run alone)."
    nb = json.loads(Path(path).read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    namespace = {}
    exec("".join(cell["source"]), {}, namespace)
    return {k: v for k, v in namespace.items() if not k.startswith("__")}    # not __annotations__


def cache_with_data(root) -> str:
    """`root` as a PIXRL_CACHE holding a copy of the default cache's data release (its sealed files: verified
    against the manifest when loaded), so that a campaign started there does not spend ≈ 5 s regenerating it.
    Returns str(root) for an environment; the default cache is never touched."""
    from pixrl.pix import tasks
    tasks.load_split("validation")                       # the default cache exists and is complete
    dst = Path(root) / tasks.RELEASE
    shutil.copytree(tasks.cache_dir(tasks.RELEASE), dst, ignore=shutil.ignore_patterns(".lock"), dirs_exist_ok=True)
    return str(root)


def release_copy(tmp_path, monkeypatch) -> Path:
    "A private copy of the dataset cache under a tmp PIXRL_CACHE (the real cache is never touched): its release folder."
    from pixrl.pix import tasks
    dst = tmp_path / "cache"
    monkeypatch.setenv("PIXRL_CACHE", cache_with_data(dst))
    assert tasks.cache_dir(tasks.RELEASE) == dst / tasks.RELEASE
    return dst / tasks.RELEASE
