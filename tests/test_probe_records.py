"""Every committed campaign probe sample's recorded IoU equals a re-evaluation of its completion through
`pixrl.pix.evaluator` (the probe numbers in runs/ are what the evaluator says of the programs they record).
Each file is checked on a fixed sample of `PER_FILE` of its samples (seeded by the file's path; a file with fewer
is checked whole); `PIXRL_PROBE_RECHECK=all` checks every sample of every file (≈ 50,000, ≈ 2.5 CPU-minutes).
All files' picks are evaluated in one `evaluate_many` batch (identical programs run once)."""
import json, os, random
from pathlib import Path

import pytest

from pixrl.pix.evaluator import evaluate_many
from pixrl.pix.reward import extract_program
from pixrl.pix.tasks import load_split

RUNS = Path(__file__).resolve().parents[1] / "runs"
PROBES = sorted(p for p in RUNS.glob("*/probe_*.json") if (p.parent / "state.json").exists())   # campaign runs
PER_FILE = 24


def _picked(path: Path, samples: list) -> list:
    "The samples of `path` this run checks: all, or PER_FILE of them chosen by a generator seeded with its path."
    if os.environ.get("PIXRL_PROBE_RECHECK") == "all" or len(samples) <= PER_FILE:
        return samples
    idx = sorted(random.Random(str(path.relative_to(RUNS))).sample(range(len(samples)), PER_FILE))
    return [samples[i] for i in idx]


@pytest.fixture(scope="session")
def reevaluated():
    """{path: (its samples, their re-evaluated results)} for every committed probe file, from one batch (session scope:
    an xdist worker that interleaves this module's tests with others' evaluates it once, not on every return)."""
    tasks = {t.id: t for t in load_split("validation")}
    samples = {p: _picked(p, json.loads(p.read_text())["samples"]) for p in PROBES}
    flat = [s for p in PROBES for s in samples[p]]
    results = evaluate_many([(tasks[s["task_id"]], extract_program(s["completion"])) for s in flat])
    out, i = {}, 0
    for p in PROBES:
        out[p] = (samples[p], results[i:i + len(samples[p])])
        i += len(samples[p])
    assert i == len(results)
    return out


@pytest.mark.parametrize("path", PROBES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_probe_iou_matches_reevaluation(path, reevaluated):
    samples, results = reevaluated[path]
    assert samples and len(samples) == len(results)
    for s, r in zip(samples, results):
        assert s["ok"] == r.ok, (s["task_id"], s["k"], s["status"], r.status)
        assert abs(s["iou"] - (r.iou if r.ok else 0.0)) < 1e-9, (s["task_id"], s["k"], s["iou"], r.iou)
