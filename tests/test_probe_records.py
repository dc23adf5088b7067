"""Every committed campaign probe sample's recorded IoU equals a re-evaluation of its completion through
`pixrl.pix.evaluator` (the probe numbers in runs/ are what the evaluator says of the programs they record)."""
import json
from pathlib import Path

import pytest

from pixrl.pix.evaluator import evaluate_many
from pixrl.pix.reward import extract_program
from pixrl.pix.tasks import load_split

RUNS = Path(__file__).resolve().parents[1] / "runs"
PROBES = sorted(p for p in RUNS.glob("*/probe_*.json") if (p.parent / "state.json").exists())   # campaign runs


@pytest.mark.parametrize("path", PROBES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_probe_iou_matches_reevaluation(path):
    probe = json.loads(path.read_text())
    tasks = {t.id: t for t in load_split("validation")}
    samples = probe["samples"]
    results = evaluate_many([(tasks[s["task_id"]], extract_program(s["completion"])) for s in samples])
    for s, r in zip(samples, results):
        assert s["ok"] == r.ok, (s["task_id"], s["k"], s["status"], r.status)
        assert abs(s["iou"] - (r.iou if r.ok else 0.0)) < 1e-9, (s["task_id"], s["k"], s["iou"], r.iou)
