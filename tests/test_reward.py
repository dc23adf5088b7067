"""pixrl.reward: the guarantees of the hardened `shaped_v3c` over all 400 validation tasks (issue: reward
integrity). Target-blind programs — one of every class in `target_blind_programs` — score at most 0.07 on
average and beat the task's bounding rectangle on at most 10% of tasks; the ground truth scores 1.0 everywhere,
the bounding rectangle the floor on ordinary targets; the reward is monotone along growing ground-truth prefixes;
`shaped_v3b` is still the pinned reward and still pays the hack (the measurement the hardening answers)."""
import ast

import numpy as np
import pytest

from pixrl import tasks
from pixrl import reward as rw
from pixrl.evaluator import evaluate_many, EvalResult, Status

BLIND_CLASSES = ["hatch rect(2i, 0, 1, 1e5)", "vertical stripes pitch 1 duty 0.5", "horizontal stripes pitch 3 duty 0.75",
                 "diagonal / pitch 2", "grid pitch 2", "checkerboard pitch 1", "full canvas", "half canvas",
                 "scatter 1000 squares seed 0", "scatter 300 discs seed 1", "rings around (40, 40)", "centred disc"]


@pytest.fixture(scope="module")
def val():
    return tasks.load_split("validation")


@pytest.fixture(scope="module")
def blind_scores(val):
    "{name: (v3b (400,), v3c (400,))} plus the rectangle's rewards, over all validation tasks."
    library = [t.program for t in tasks.load_split("train")[::100]]
    progs = rw.target_blind_programs(library)
    names = BLIND_CLASSES + [f"union of {len(library)} programs"]
    jobs = [(t, progs[n]) for t in val for n in names] + [(t, rw.rect_baseline_program(t)) for t in val]
    res = evaluate_many(jobs, workers=2)
    out = {}
    for j, n in enumerate(names):
        rs = [res[i * len(names) + j] for i in range(len(val))]
        out[n] = (np.array([rw.shaped_v3b(r, rw.rect_baseline(t)) for r, t in zip(rs, val)]),
                  np.array([rw.shaped_v3c(r, rw.rect_baseline(t)) for r, t in zip(rs, val)]))
    rect = res[len(val) * len(names):]
    out["rect"] = (np.array([rw.shaped_v3b(r, rw.rect_baseline(t)) for r, t in zip(rect, val)]),
                   np.array([rw.shaped_v3c(r, rw.rect_baseline(t)) for r, t in zip(rect, val)]))
    return out


def test_target_blind_programs_score_at_most_007_under_v3c(val, blind_scores):
    means = {n: v3c.mean() for n, (v3b, v3c) in blind_scores.items() if n != "rect"}
    assert len(val) == 400 and len(means) == len(BLIND_CLASSES) + 1
    assert max(means.values()) <= 0.07, means


def test_target_blind_programs_beat_the_rectangle_on_at_most_10pct_of_tasks(blind_scores):
    rect_c = blind_scores["rect"][1]
    beats = {n: float((v3c > rect_c + 1e-9).mean()) for n, (v3b, v3c) in blind_scores.items() if n != "rect"}
    assert max(beats.values()) <= 0.10, beats


def test_v3b_still_pays_the_hatch(blind_scores):
    "The measurement behind the hardening: the pinned shaped_v3b pays the red team's hatch 0.17+ on average."
    v3b, _ = blind_scores["hatch rect(2i, 0, 1, 1e5)"]
    assert v3b.mean() > 0.15 and (v3b > blind_scores["rect"][0] + 1e-9).mean() > 0.5


def test_ground_truth_scores_one_and_rectangle_the_floor_under_v3c(val, blind_scores):
    res = evaluate_many([(t, t.program) for t in val], workers=2)
    gt = np.array([rw.shaped_v3c(r, rw.rect_baseline(t)) for r, t in zip(res, val)])
    assert gt.min() >= 1.0 - 1e-9, [t.id for t, g in zip(val, gt) if g < 1 - 1e-9][:5]
    ordinary = np.array([not rw.rect_baseline(t).degenerate for t in val])
    assert np.allclose(blind_scores["rect"][1][ordinary], 0.05)


def test_v3c_is_monotone_along_ground_truth_prefixes(val):
    seqs = []
    for t in val:
        body = ast.parse(t.program).body
        seqs.append(["\n".join(ast.get_source_segment(t.program, s) for s in body[:k]) + "\n" for k in range(1, len(body) + 1)])
    res = iter(evaluate_many([(t, p) for t, seq in zip(val, seqs) for p in seq], workers=2))
    steps, bad = 0, []
    for t, seq in zip(val, seqs):
        rs = [rw.shaped_v3c(next(res), rw.rect_baseline(t)) for _ in seq]
        for a, b in zip(rs, rs[1:]):
            steps += 1
            if b < a - 1e-9:
                bad.append((t.id, a, b))
    assert steps > 600 and not bad, bad[:5]


def test_v3c_gate_is_one_for_ink_on_the_target_and_zero_for_chance():
    base = rw.RectBaseline(0.5, 2 / 3, 4.0, 100.0, False, target_px=20, canvas_px=100)
    on = EvalResult(Status.OK, 0.4, 4 / 7, 2.0, 0.0, 4.0, 1, mask=np.ones(8, bool))           # 8 px, all on T
    assert rw.precision_gate(on, base) == pytest.approx(1.0)
    spread = EvalResult(Status.OK, 0.2, 2 * 20 / 120, 1.0, 2.0, 0.0, 1, mask=np.ones(100, bool))  # the whole canvas
    assert rw.ink_precision(spread, base) == pytest.approx(0.2) and rw.precision_gate(spread, base) == 0.0
    assert rw.shaped_v3c(spread, base) == pytest.approx(0.05) and rw.shaped_v3b(spread, base) > 0.3


def test_v3c_refuses_what_it_cannot_score():
    base = rw.RectBaseline(0.5, 2 / 3, 4.0, 100.0, False, target_px=20, canvas_px=100)
    with pytest.raises(ValueError, match="EvalResult.mask"):
        rw.shaped_v3c(EvalResult(Status.OK, 0.5, 2 / 3, 1.0, 1.0, 1.0, 1), base)
    with pytest.raises(ValueError, match="target_px=0"):
        rw.shaped_v3c(EvalResult(Status.OK, 0.5, 2 / 3, 1.0, 1.0, 1.0, 1, mask=np.ones(4, bool)),
                      rw.RectBaseline(0.5, 2 / 3, 4.0, 100.0, False))
    with pytest.raises(ValueError, match="shaped_v9"):
        rw.make_reward_fn([], policy="shaped_v9")


def test_reward_fn_defaults_to_v3c_and_logs_both_rewards(val):
    t = val[0]
    fn = rw.make_reward_fn([t])
    logged = {}
    hatch = rw.target_blind_programs()["hatch rect(2i, 0, 1, 1e5)"]
    out = fn(prompts=["p"] * 2, completions=[t.program, hatch], task_id=[t.id] * 2,
             log_metric=lambda k, v: logged.__setitem__(k, v))
    assert fn.__name__ == rw.DEFAULT_REWARD == "shaped_v3c"
    assert out[0] == pytest.approx(1.0) and out[1] == pytest.approx(rw.shaped_v3c(evaluate_many([(t, hatch)])[0], rw.rect_baseline(t)))
    assert logged["pix/reward_v3c"] == pytest.approx(sum(out) / 2) and logged["pix/reward_v3b"] >= logged["pix/reward_v3c"]
