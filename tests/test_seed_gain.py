"""seed_gain refuses runs that differ in more than their seed, and its interval is the campaigns' own deltas'."""
import json
from pathlib import Path

import papermill as pm
import pytest

from pixrl.stats import seed_ci

NBS = Path(__file__).resolve().parents[1] / "nbs"
RUNS = NBS.parent / "runs"


def test_refuses_runs_of_different_recipes(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="differ in more than seed"):
        pm.execute_notebook(str(NBS / "seed_gain.ipynb"), str(tmp_path / "out.ipynb"), cwd=str(NBS),
                            parameters={"runs": "b,b_base"}, kernel_name="python3", progress_bar=False)


def test_interval_is_the_deltas_seed_ci(tmp_path):
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "seed_gain.ipynb"), str(out), cwd=str(NBS), kernel_name="python3", progress_bar=False)
    text = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    deltas = [json.loads((RUNS / n / "summary.json").read_text())["verdicts"]["iou"]["all"]["mean_diff"] for n in ("b", "b_seed1", "b_seed2")]
    ci = seed_ci(deltas)
    assert f"iou: mean change over 3 seeds {ci.mean:+.4f} (95% t-interval {ci.lo:+.4f} … {ci.hi:+.4f})" in text
