"""reviser_seeds refuses runs of different recipes and untrained loops at another seed; its over-seed intervals are
the runs' own paired differences' seed_ci, and it counts a seed as RL earning its keep only when both comparisons win."""
import json
from pathlib import Path

import papermill as pm
import pytest

from pixrl.pix.agent_loop import LoopConfig, check_reviser_run
from pixrl.pix.harvest import attempt_iou
from pixrl.stats import seed_ci

NBS = Path(__file__).resolve().parents[1] / "nbs"
RUNS = NBS.parent / "runs"
RUN = "reviser_train_move_shared_kl"          # a committed reviser_train run, copied below as three made-up seeds
UNTRAINED = "agent_loop_mover"


def _seeds(root: Path, shift: dict[int, float], verdicts: dict[int, tuple[str, str]], untrained_seed=lambda s: s,
           untrained_config: dict | None = None) -> str:
    """RUN copied under `root` at seeds 0, 1, 2 (r0, r1, r2), each with its untrained loop (u0, u1, u2, a copy of
    UNTRAINED at seed `untrained_seed(s)`); seed s's three differences moved by shift[s], its verdicts against the
    benchmark and the untrained loop set to verdicts[s]; `untrained_config` overrides fields of the untrained loops' configs."""
    for s in (0, 1, 2):
        summ = json.loads((RUNS / RUN / "summary.json").read_text())
        summ["record"]["seed"] = s
        summ["vs_plain"]["diff"] += shift[s]
        (vs_base,) = [v for v in summ["vs_records"].values() if v["other_kind"] == "pixrl.bench"]
        vs_base["diff"] += shift[s]
        vs_base["verdict"], summ["vs_untrained"]["verdict"] = verdicts[s]
        summ["vs_untrained"]["diff"] += shift[s]
        summ["vs_untrained"]["compare_to"] = f"u{s}"
        (root / f"r{s}").mkdir()
        (root / f"r{s}" / "summary.json").write_text(json.dumps(summ))
        trained = json.loads((RUNS / RUN / "loop.json").read_text())
        trained["config"]["seed"] = s                                     # a run's loop samples at the run's seed
        (root / f"r{s}" / "loop.json").write_text(json.dumps(trained))
        loop = json.loads((RUNS / UNTRAINED / "loop.json").read_text())
        loop["config"]["seed"] = untrained_seed(s)
        loop["config"].update(untrained_config or {})
        (root / f"u{s}").mkdir()
        (root / f"u{s}" / "loop.json").write_text(json.dumps(loop))
    return "r2,r0,r1"                                                     # any order: sorted by seed


def _text(out) -> str:
    return "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))


MOVER_12 = {"model": "pixrl-base-mover", "feedback": "regions", "revision": "move", "n_rounds": 12, "n_revisions": 1}
UNTRIED_C32 = {"distinct_draws": 16, "untried": True, "revision_max_new_tokens": 32}   # the one-untried-move search, capped


def _refused_by_reviser_train(tmp_path, match: str, params: dict):
    "reviser_train with `params` stops with an error matching `match` before its run folder is made."
    with pytest.raises(pm.PapermillExecutionError, match=match):
        pm.execute_notebook(str(NBS / "reviser_train.ipynb"), str(tmp_path / "out.ipynb"), cwd=str(NBS), kernel_name="python3",
                            progress_bar=False, parameters={**params, "run_name": "never_made", "allow_dirty": True})
    assert not (RUNS / "never_made").exists()


def _run(tmp_path, runs, **params):
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "reviser_seeds.ipynb"), str(out), cwd=str(NBS), kernel_name="python3",
                        progress_bar=False, parameters={"runs": runs, **params})
    return _text(out)


def test_refuses_runs_of_different_recipes(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="differ in more than seed"):
        _run(tmp_path, "reviser_train_move_gain_kl,reviser_train_move_shared_kl", allow_dirty=True)


def test_refuses_seeds_trained_on_different_attempts(tmp_path):
    "A run recorded before train_on existed trained on its own attempts: set beside a train_on 'writer' run, refused."
    runs = _seeds(tmp_path, {0: 0, 1: 0, 2: 0}, {s: ("improved", "improved") for s in (0, 1, 2)})
    summ = json.loads((tmp_path / "r1" / "summary.json").read_text())
    assert "train_on" not in summ                                        # the committed run predates the field
    summ["train_on"] = "writer"
    (tmp_path / "r1" / "summary.json").write_text(json.dumps(summ))
    with pytest.raises(pm.PapermillExecutionError, match=r"differ in more than seed and name.*'train_on': 'writer'"):
        _run(tmp_path, runs, runs_root=str(tmp_path))
    summ["train_on"] = "own"                                             # the same recipe, said explicitly: accepted
    (tmp_path / "r1" / "summary.json").write_text(json.dumps(summ))
    assert "recipe: " in _run(tmp_path, runs, runs_root=str(tmp_path))


def test_refuses_an_untrained_loop_at_another_seed(tmp_path):
    runs = _seeds(tmp_path, {0: 0, 1: 0, 2: 0}, {s: ("improved", "improved") for s in (0, 1, 2)},
                  untrained_seed=lambda s: 0)
    with pytest.raises(pm.PapermillExecutionError, match=r"r2 \(seed 2\) was compared with u2 \(seed 0\)"):
        _run(tmp_path, runs, runs_root=str(tmp_path))


@pytest.mark.parametrize("other", [{"n_rounds": 12, "n_revisions": 1}, {"distinct_draws": 16}, {"distinct_draws": 16, "untried": True}])
def test_refuses_an_untrained_loop_of_another_shape(tmp_path, other):
    runs = _seeds(tmp_path, {0: 0, 1: 0, 2: 0}, {s: ("improved", "improved") for s in (0, 1, 2)}, untrained_config=other)
    with pytest.raises(pm.PapermillExecutionError, match=r"r2 \(a loop of shape .*was compared with u2 \(shape .*accepted: the untrained loop spending"):
        _run(tmp_path, runs, runs_root=str(tmp_path))


def test_refuses_an_untrained_loop_sampling_otherwise(tmp_path):
    runs = _seeds(tmp_path, {0: 0, 1: 0, 2: 0}, {s: ("improved", "improved") for s in (0, 1, 2)},
                  untrained_config={"revision_max_new_tokens": 32})
    with pytest.raises(pm.PapermillExecutionError, match=r"r2 \(sampling with .*'revision_max_new_tokens': None\}\) was compared with "
                                                           r"u2 \(sampling with .*'revision_max_new_tokens': 32\}\); accepted: the untrained loop sampling"):
        _run(tmp_path, runs, runs_root=str(tmp_path))


def test_over_seeds_is_the_runs_differences_seed_ci(tmp_path):
    shift = {0: 0.0, 1: 0.004, 2: -0.002}
    verdicts = {0: ("improved", "no difference detected"), 1: ("improved", "improved"), 2: ("no difference detected", "improved")}
    text = _run(tmp_path, _seeds(tmp_path, shift, verdicts), runs_root=str(tmp_path))
    summ = json.loads((RUNS / RUN / "summary.json").read_text())
    diffs = []
    for s in (0, 1, 2):                                                   # by a plain loop over the made-up seeds
        diffs.append(summ["vs_untrained"]["diff"] + shift[s])
    ci = seed_ci(diffs)
    assert (f"trained loop − untrained loop: mean over 3 seeds {ci.mean:+.4f} (95% t-interval {ci.lo:+.4f} … "
            f"{ci.hi:+.4f}): {ci.verdict}; improved at 2 of 3 seeds") in text
    assert "RL earns its keep (beats pixrl-base (../runs/bench_base/bench.json) and the untrained loop, each 95% CI above 0) at 1 of 3 seeds" in text
    plain = summ["vs_plain"]["verdict"] == "improved"                    # each made-up seed keeps RUN's verdict against plain
    writer = json.loads((RUNS / RUN / "loop.json").read_text())["model"]
    assert (f"at the same budget (beats the first attempts' writer's best of {summ['vs_plain']['budget']} plain — {writer} — and "
            f"the untrained loop, each 95% CI above 0): {2 if plain else 0} of 3 seeds") in text
    # the untrained loop against the benchmark, computed by the notebook: every made-up seed's untrained loop is the
    # committed agent_loop_mover, so each seed has its paired difference and the interval has no width
    bench = json.loads((RUNS / "bench_base" / "bench.json").read_text())
    untrained = json.loads((RUNS / UNTRAINED / "loop.json").read_text())
    mine = {r["task_id"]: attempt_iou(r["champion"]) for r in untrained["tasks"]}
    best = {t["task_id"]: max(attempt_iou(s) for s in t["samples"]) for t in bench["tasks"]}
    d = sum(mine[t] - best[t] for t in mine) / len(mine)
    assert (f"untrained loop − pixrl-base (../runs/bench_base/bench.json): mean over 3 seeds {d:+.4f} (95% t-interval "
            f"{d:+.4f} … {d:+.4f}): above 0; improved at 3 of 3 seeds") in text


def test_reviser_train_refuses_an_untrained_loop_of_another_shape_before_training(tmp_path):
    "reviser_train's compare_to loop is checked against the run's loop shape before any model loads or folder is made."
    _refused_by_reviser_train(tmp_path, r"compare_to 'agent_loop_mover' is a loop of shape .*'n_rounds': 3"
                                        r".*accepted: an untrained loop of this run's shape .*'n_rounds': 12",
                              {**MOVER_12, "compare_to": "agent_loop_mover"})


def _refused_by_check(match: str, params: dict, error=ValueError):
    "`check_reviser_run`, which reviser_train calls before anything loads, refuses `params` (the notebook's names)."
    p = {"model": "pixrl-base-reviser", "n_rounds": 3, "n_revisions": 4, "feedback": "global", "revision": "program",
         "attempts_from": "trained", "attempts_model": "", "train_on": "own", "compare_to": "agent_loop_reviser",
         "distinct_draws": 0, "untried": False, "revision_max_new_tokens": 0, **params}   # the notebook's defaults
    cfg = LoopConfig(n_rounds=p["n_rounds"], n_revisions=p["n_revisions"], feedback=p["feedback"], revision=p["revision"],
                     distinct_draws=p["distinct_draws"], untried=p["untried"],
                     revision_max_new_tokens=p["revision_max_new_tokens"] or None)
    with pytest.raises(error, match=match):
        check_reviser_run(p["model"], cfg, attempts_from=p["attempts_from"], attempts_model=p["attempts_model"],
                          train_on=p["train_on"], compare_to=p["compare_to"])


def test_reviser_train_refuses_an_untrained_loop_sampling_otherwise_before_training():
    "A capped trained loop against an uncapped untrained one (same shape) is refused before any model loads."
    _refused_by_check(r"compare_to 'agent_loop_mover_r12u' samples with .*'revision_max_new_tokens': None"
                      r".*accepted: an untrained loop sampling as this run does, .*'revision_max_new_tokens': 32",
                      {**MOVER_12, **UNTRIED_C32, "compare_to": "agent_loop_mover_r12u"})


def test_reviser_train_refuses_a_missing_untrained_loop_by_name():
    _refused_by_check(r"compare_to 'no_such_loop': loop record .*no_such_loop/loop.json does not exist",
                      {"compare_to": "no_such_loop"}, FileNotFoundError)


def _all_text(out) -> str:
    "Printed text and the plain-text form of displayed tables."
    cells = json.loads(out.read_text())["cells"]
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for c in cells
                   for o in c.get("outputs", []))


def _champions_plain(loop: dict) -> dict[str, list[float]]:
    "By a plain loop: each task's champion IoU after each round (first best reward in a round; replaced only if strictly better)."
    out = {}
    for row in loop["tasks"]:
        champ = None
        seen = []
        for rd in row["rounds"]:
            top = None
            for a in rd["attempts"]:
                if top is None or a["reward"] > top["reward"]:
                    top = a
            if champ is None or top["reward"] > champ["reward"]:
                champ = top
            seen.append(attempt_iou(champ))
        out[row["task_id"]] = seen
    return out


def test_by_round_is_the_paired_champion_difference(tmp_path):
    runs = _seeds(tmp_path, {0: 0, 1: 0, 2: 0}, {s: ("improved", "improved") for s in (0, 1, 2)})
    out = tmp_path / "out.ipynb"
    pm.execute_notebook(str(NBS / "reviser_seeds.ipynb"), str(out), cwd=str(NBS), kernel_name="python3",
                        progress_bar=False, parameters={"runs": runs, "runs_root": str(tmp_path)})
    text = _all_text(out)
    trained = _champions_plain(json.loads((RUNS / RUN / "loop.json").read_text()))
    untrained = _champions_plain(json.loads((RUNS / UNTRAINED / "loop.json").read_text()))
    n_rounds = len(next(iter(trained.values())))
    d = [sum(trained[t][k] - untrained[t][k] for t in trained) / len(trained) for k in range(n_rounds)]
    assert abs(d[-1]) > 1e-4                                              # the loops differ by the end: the check can fail
    for k in range(n_rounds):                                             # seed 0's column: the mean, then its bootstrap CI
        assert f"{d[k]:+.4f} [" in text, (k, d[k])
    last = d[-1]                                                          # three identical seeds: an interval of no width
    assert (f"after the last round ({n_rounds - 1}): trained − untrained {last:+.4f} (95% t-interval {last:+.4f} … "
            f"{last:+.4f})") in text


def test_by_round_refuses_seeds_whose_loops_differ_in_shape(tmp_path):
    runs = _seeds(tmp_path, {0: 0, 1: 0, 2: 0}, {s: ("improved", "improved") for s in (0, 1, 2)})
    for name in ("r2", "u2"):                                             # seed 2's pair agrees with itself, not with seeds 0, 1
        loop = json.loads((tmp_path / name / "loop.json").read_text())
        loop["config"]["distinct_draws"] = 16
        (tmp_path / name / "loop.json").write_text(json.dumps(loop))
    with pytest.raises(pm.PapermillExecutionError, match=r"the runs' loops spend their budget differently.*accepted: one loop shape"):
        _run(tmp_path, runs, runs_root=str(tmp_path))


def test_reviser_train_refuses_attempts_model_with_attempts_from_trained():
    _refused_by_check(r"attempts_model='pixrl-base' with attempts_from='trained'; accepted: "
                      r"attempts_model with attempts_from 'untrained'",
                      {"attempts_model": "pixrl-base", "attempts_from": "trained", "compare_to": ""})


def test_reviser_train_refuses_an_untrained_loop_whose_attempts_another_model_wrote():
    "Trained revisions of pixrl-base's attempts set against a loop of the mover's own attempts: refused before training."
    _refused_by_check(r"compare_to 'agent_loop_mover_r12u_c32': first attempts by 'pixrl-base-mover', "
                      r"revisions by 'pixrl-base-mover'; accepted: first attempts by 'pixrl-base' "
                      r"and revisions by the untrained 'pixrl-base-mover'",
                      {**MOVER_12, **UNTRIED_C32, "attempts_from": "untrained", "attempts_model": "pixrl-base",
                       "compare_to": "agent_loop_mover_r12u_c32"})


def test_reviser_train_refuses_training_on_the_writer_without_one():
    "train_on 'writer' revises attempts_model's attempts in GRPO: with no attempts_model there is none, refused before training."
    _refused_by_check(r"train_on='writer' with attempts_model=''; accepted: train_on 'writer' with an attempts_model",
                      {"train_on": "writer", "attempts_from": "untrained", "compare_to": ""})


def test_reviser_train_refuses_an_unknown_train_on():
    _refused_by_check(r"train_on='mine'; accepted: \('own', 'writer'\)", {"train_on": "mine", "compare_to": ""})
