"""arm_compare pairs A and B campaigns that differ only in the arm, and its A − B is the plain per-task mean."""
import json
from pathlib import Path

import papermill as pm
import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
RUNS = NBS.parent / "runs"


def _run(tmp_path, **parameters) -> str:
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "arm_compare.ipynb"), str(out), cwd=str(NBS), parameters=parameters,
                        kernel_name="python3", progress_bar=False)
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))


def test_refuses_a_pair_of_different_recipes(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="differs in more than the arm"):
        _run(tmp_path, a_runs="a_base", b_runs="b")          # pixrl-base's A against the pixrl-base-noisy B


def test_refuses_arms_other_than_a_then_b(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match=r"accepted: \(A, B\)"):
        _run(tmp_path, a_runs="b_base", b_runs="a_base")


def _plain_mean_diff(a: str, b: str, metric: str) -> float:
    "Σ_tasks (mean_k A − mean_k B) / n_tasks over the last stages' probes, by plain loops."
    def last(name):
        n = len(json.loads((RUNS / name / "state.json").read_text())["stages"])
        per = {}
        for s in json.loads((RUNS / name / f"probe_{n - 1}.json").read_text())["samples"]:
            per.setdefault(s["task_id"], []).append(float(s[metric]))
        return {t: sum(v) / len(v) for t, v in per.items()}
    pa, pb = last(a), last(b)
    return sum(pa[t] - pb[t] for t in pb) / len(pb)


def test_a_minus_b_is_the_per_task_mean_difference(tmp_path):
    pairs = [("a", "b"), ("a_seed1", "b_seed1")]
    text = _run(tmp_path, a_runs=",".join(a for a, _ in pairs), b_runs=",".join(b for _, b in pairs))
    from pixrl.stats import seed_ci
    ci = seed_ci([_plain_mean_diff(a, b, "iou") for a, b in pairs])
    assert f"iou: A − B over 2 seeds {ci.mean:+.4f} (95% t-interval {ci.lo:+.4f} … {ci.hi:+.4f})" in text


def test_refuses_two_pairs_of_one_seed(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match=r"pairs are one per seed; got seeds \[0, 0\]"):
        _run(tmp_path, a_runs="a,a_sftlr1e-4", b_runs="b,b")


def test_sft_change_is_after_minus_base_per_task(tmp_path):
    "The SFT table's Δ iou is Σ_tasks (mean_k after-SFT − mean_k base) / n_tasks (sign included), by plain loops."
    def per_task(k):
        per = {}
        for s in json.loads((RUNS / "a_sftlr1e-4" / f"probe_{k}.json").read_text())["samples"]:
            per.setdefault(s["task_id"], []).append(float(s["iou"]))
        return {t: sum(v) / len(v) for t, v in per.items()}
    base, after = per_task("base"), per_task(0)
    d = sum(after[t] - base[t] for t in base) / len(base)
    assert d < 0                                                 # this SFT lowered IoU: the sign is informative
    assert f"{d:.4f}" in _run(tmp_path, a_runs="a_sftlr1e-4", b_runs="b")
