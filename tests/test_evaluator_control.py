"""Ground-truth positive control over the whole validation split, through the real sandbox tier
(evaluate_many with 2 workers): every GT program scores shaped_v3b >= 0.99; the bbox-rectangle
program scores the 0.05 floor on non-degenerate targets (the raw branch on degenerate ones);
an empty program and a rejected one score 0.0; every result is strict JSON."""
import json
import time

import pytest

from pixrl.pix import tasks
from pixrl.pix.evaluator import Status, evaluate_many
from pixrl.pix.reward import rect_baseline, rect_baseline_program, shaped_breakdown, shaped_v3b


@pytest.fixture(scope="module")
def control():
    val = tasks.load_split("validation")
    t0 = time.monotonic()
    progs = lambda t: (t.program, rect_baseline_program(t), "", "import os\nos.system('id')")
    res = evaluate_many([(t, p) for t in val for p in progs(t)], workers=2)
    print(f"{len(res)} candidates over {len(val)} validation tasks in {time.monotonic() - t0:.1f} s")
    return val, [res[4 * i: 4 * i + 4] for i in range(len(val))]


def test_every_gt_program_scores_one(control):
    val, res = control
    bad = [(t.id, r[0].status, r[0].iou, shaped_v3b(r[0], rect_baseline(t))) for t, r in zip(val, res)
           if shaped_v3b(r[0], rect_baseline(t)) < 0.99]
    assert not bad, bad[:5]
    assert len(val) >= 100


def test_rectangle_scores_floor_or_raw_branch(control):
    val, res = control
    n_deg = 0
    for t, r in zip(val, res):
        b = rect_baseline(t)
        bd = shaped_breakdown(r[1], b)
        assert r[1].ok, (t.id, r[1])
        if b.degenerate:
            n_deg += 1
            assert bd["degenerate"] and bd["reward"] >= 0.05 + 0.4 * 0.95, (t.id, bd)
        else:
            assert abs(bd["reward"] - 0.05) < 1e-9, (t.id, bd, b)
            assert abs(r[1].iou - b.iou_rect) < 1e-12     # the program renders exactly the bbox rectangle
    assert n_deg < len(val)
    print(f"{n_deg} of {len(val)} validation targets are rectangle-degenerate")


def test_empty_and_rejected_score_zero(control):
    val, res = control
    for t, r in zip(val, res):
        assert r[2].status == Status.EMPTY and shaped_v3b(r[2], rect_baseline(t)) == 0.0
        assert r[3].status == Status.SOURCE_REJECTED and shaped_v3b(r[3], rect_baseline(t)) == 0.0


def test_all_results_strict_json(control):
    _, res = control
    for group in res:
        for r in group:
            d = json.loads(r.to_json())
            json.dumps(d, allow_nan=False)
            assert d["status"] in {s.value for s in Status}
