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
                            parameters={"runs": "b_v3c,b_base", **ON_COMMITTED_RUNS}, kernel_name="python3", progress_bar=False)


# A test that reads the committed runs/ (the default runs_root) passes allow_dirty: its executed notebook goes to
# tmp_path, which the notebook cannot see, so it is no recorded run; one on copies under tmp_path needs nothing.
ON_COMMITTED_RUNS = {"allow_dirty": True}


def test_interval_is_the_deltas_seed_ci(tmp_path):
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "seed_gain.ipynb"), str(out), cwd=str(NBS), kernel_name="python3", progress_bar=False,
                        parameters=ON_COMMITTED_RUNS)
    text = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    deltas = [json.loads((RUNS / n / "summary.json").read_text())["verdicts"]["iou"]["all"]["mean_diff"] for n in ("b_v3c", "b_seed1", "b_seed2")]
    ci = seed_ci(deltas)
    assert f"iou: mean change over 3 seeds {ci.mean:+.4f} (95% t-interval {ci.lo:+.4f} … {ci.hi:+.4f})" in text



def _text(out) -> str:
    return "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))


def _other_recipe(root: Path, shift: dict[int, float]) -> None:
    """make train's three runs copied under `root` as they are (b, b_seed1, b_seed2) and as a second recipe (g4_*):
    groups_per_step 4, and each seed's IoU gain moved by `shift[seed]` (a made-up recipe with known differences)."""
    for n in ("b_v3c", "b_seed1", "b_seed2"):
        s = json.loads((RUNS / n / "summary.json").read_text())
        (root / n).mkdir()
        (root / n / "summary.json").write_text(json.dumps(s))
        s["config"]["groups_per_step"] = 4
        s["verdicts"]["iou"]["all"]["mean_diff"] += shift[s["config"]["seed"]]
        (root / f"g4_{n}").mkdir()
        (root / f"g4_{n}" / "summary.json").write_text(json.dumps(s))


def test_compare_to_is_the_per_seed_difference_of_gains(tmp_path):
    "Σ_seeds (gain_this − gain_that) / 3 with its t-interval, the sign included, recomputed by plain loops."
    shift = {0: 0.010, 1: 0.030, 2: 0.020}
    _other_recipe(tmp_path, shift)
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "seed_gain.ipynb"), str(out), cwd=str(NBS), kernel_name="python3", progress_bar=False,
                        parameters={"runs": "g4_b_v3c,g4_b_seed1,g4_b_seed2", "compare_to": "b_seed2,b_v3c,b_seed1",
                                    "runs_root": str(tmp_path)})      # compare_to in another order: paired by seed
    d = [shift[k] for k in (0, 1, 2)]                               # this (g4) − that (b), seed by seed
    mean = sum(d) / 3
    sd = (sum((x - mean) ** 2 for x in d) / 2) ** 0.5
    half = 4.302653 * sd / 3 ** 0.5                                   # t(0.975, 2 df)
    text = _text(out)
    assert f"iou: gain of this recipe − compare_to over 3 seeds {mean:+.4f} (95% t-interval {mean - half:+.4f} … {mean + half:+.4f}" in text
    assert "per seed +0.0100, +0.0300, +0.0200" in text
    assert "'groups_per_step': (4, 2)" in text


@pytest.mark.parametrize("compare_to, match", [("b_base,b_s1,b_s2", "accepted: one model for both recipes"),
                                               ("b_v3c,b_seed1", r"accepted: one run per seed of runs, \[0, 1, 2\]")])
def test_compare_to_refuses_another_model_or_other_seeds(tmp_path, compare_to, match):
    with pytest.raises(pm.PapermillExecutionError, match=match):
        pm.execute_notebook(str(NBS / "seed_gain.ipynb"), str(tmp_path / "out.ipynb"), cwd=str(NBS),
                            parameters={"compare_to": compare_to, **ON_COMMITTED_RUNS}, kernel_name="python3", progress_bar=False)
