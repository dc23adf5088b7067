"""arm_compare pairs A and B campaigns that differ only in the arm, and its A − B is the plain per-task mean."""
import json
import shutil
from pathlib import Path

import papermill as pm
import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
RUNS = NBS.parent / "runs"


def _run(tmp_path, **parameters) -> str:
    out = tmp_path / "out.ipynb"
    if "runs_root" not in parameters:   # it reads the committed runs/, but its executed notebook goes to tmp_path: no recorded run
        parameters["allow_dirty"] = True
    pm.execute_notebook(str(NBS / "arm_compare.ipynb"), str(out), cwd=str(NBS), parameters=parameters,
                        kernel_name="python3", progress_bar=False)
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))


def test_refuses_a_pair_of_different_recipes(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="differs in more than the arm"):
        _run(tmp_path, a_runs="a_base", b_runs="b_noisy")          # pixrl-base's A against the pixrl-base-noisy B


def test_refuses_arms_other_than_a_then_b(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match=r"accepted: \(A, B\)"):
        _run(tmp_path, a_runs="b_base", b_runs="a_base")


def _plain_mean_diff(root: Path, a: str, b: str, metric: str) -> float:
    "Σ_tasks (mean_k A − mean_k B) / n_tasks over the last stages' probes under `root`, by plain loops."
    def last(name):
        n = len(json.loads((root / name / "state.json").read_text())["stages"])
        per = {}
        for s in json.loads((root / name / f"probe_{n - 1}.json").read_text())["samples"]:
            per.setdefault(s["task_id"], []).append(float(s[metric]))
        return {t: sum(v) / len(v) for t, v in per.items()}
    pa, pb = last(a), last(b)
    return sum(pa[t] - pb[t] for t in pb) / len(pb)


def test_a_minus_b_is_the_per_task_mean_difference(tmp_path):
    """The committed pairs have A − B = 0 (A's SFT is refused), which would not tell A − B from B − A; here B's last
    probe is lowered by a known amount on some tasks (seed 0: 0.10 on 8 tasks, seed 1: 0.05 on 16), so A − B > 0."""
    pairs = [("a_noisy", "b_noisy"), ("a_noisy_seed1", "b_noisy_seed1")]
    for a, b in pairs:
        shutil.copytree(RUNS / a, tmp_path / a)
        shutil.copytree(RUNS / b, tmp_path / b)
    for b, (drop, n) in (("b_noisy", (0.10, 8)), ("b_noisy_seed1", (0.05, 16))):
        k = len(json.loads((tmp_path / b / "state.json").read_text())["stages"]) - 1
        path = tmp_path / b / f"probe_{k}.json"
        probe = json.loads(path.read_text())
        lowered = sorted({s["task_id"] for s in probe["samples"]})[:n]
        for s in probe["samples"]:
            if s["task_id"] in lowered:
                s["iou"] -= drop
        path.write_text(json.dumps(probe))
    text = _run(tmp_path, a_runs=",".join(a for a, _ in pairs), b_runs=",".join(b for _, b in pairs), runs_root=str(tmp_path))
    from pixrl.stats import seed_ci
    d = [_plain_mean_diff(tmp_path, a, b, "iou") for a, b in pairs]
    assert d[0] > 0.009 and d[1] > 0.009                           # 0.10·8/80 and 0.05·16/80 over A − B = 0
    ci = seed_ci(d)
    assert f"iou: A − B over 2 seeds {ci.mean:+.4f} (95% t-interval {ci.lo:+.4f} … {ci.hi:+.4f})" in text


def test_refuses_two_pairs_of_one_seed(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match=r"pairs are one per seed; got seeds \[0, 0\]"):
        _run(tmp_path, a_runs="a_noisy,a_sftlr1e-4", b_runs="b_noisy,b_noisy")


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
    assert f"{d:.4f}" in _run(tmp_path, a_runs="a_sftlr1e-4", b_runs="b_noisy")
