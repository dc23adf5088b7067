"""Fixtures and helpers shared by several test files."""
import json
import os
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


# --- make test's schedule: whole scopes, the longest first ---------------------------------------------------------------
# `make test` runs `pytest -n 2 --dist loadscope --no-loadscope-reorder`, with the scope below: a test module (its
# module-scoped fixtures are built once, on one worker), or one notebook of test_notebooks.py. A free worker takes the
# next scope in collection order; collected longest first (greedy longest-processing-time), the last scopes taken are
# short, so neither worker waits long on the other at the end. The seconds come from tests/durations.json, written by
# a run with PIXRL_TEST_DURATIONS set:   PIXRL_TEST_DURATIONS=tests/durations.json make test
DURATIONS = Path(__file__).with_name("durations.json")
UNTIMED_S = 10.0                                       # a scope durations.json does not know yet
NOTEBOOK_TEST = "tests/test_notebooks.py::test_notebook["


def scope_of(nodeid: str) -> str:
    "The scheduling scope of a test: a notebook's test is its own; any other test's is its module's path."
    return nodeid if nodeid.startswith(NOTEBOOK_TEST) else nodeid.split("::", 1)[0]


def longest_first(items: list, seconds: dict) -> list:
    "`items` grouped by scope, scopes ordered by recorded seconds (most first, ties in collection order), items kept in order."
    scopes: dict[str, list] = {}
    for item in items:
        scopes.setdefault(scope_of(item.nodeid), []).append(item)
    order = sorted(scopes, key=lambda s: -seconds.get(s, UNTIMED_S))       # sorted is stable: ties keep collection order
    return [item for s in order for item in scopes[s]]


def pytest_collection_modifyitems(session, config, items):
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items[:] = longest_first(items, seconds)


def pytest_xdist_make_scheduler(config, log):
    "Under --dist loadscope: xdist's scheduler with `scope_of` as its scope; any other --dist: xdist's own."
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)
    return ByScope(config, log)


_spent: dict[str, float] = {}


def pytest_runtest_logreport(report):
    "Seconds per scope (setup + call + teardown), summed where the reports arrive (under xdist: the controller)."
    scope = scope_of(report.nodeid)
    _spent[scope] = _spent.get(scope, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("PIXRL_TEST_DURATIONS")
    if out and not hasattr(session.config, "workerinput") and exitstatus == 0:
        Path(out).write_text(json.dumps({k: round(v, 1) for k, v in sorted(_spent.items())}, indent=0) + "\n")
