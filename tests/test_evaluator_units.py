"""Units of pixrl.pix.evaluator / pixrl.pix.reward: pinned constants, hand-computed metric fixtures,
vectorised metrics vs a plain-loop reference, strict JSON, and bad input (clear errors or
statuses, never an exception that would take down a training step)."""
import json
import math

import numpy as np
import pytest

from pixrl.pix import evaluator as ev
from pixrl.pix import geometry, metrics, reward as rw, sandbox, tasks
from pixrl.pix.evaluator import EvalResult, Limits, Status


class FixtureTask:
    def __init__(self, program, footprint_um=(64.0, 32.0), tid="fixture"):
        self.id, self.program, self.footprint_um = tid, program, footprint_um
        self.target_mask = geometry.render(program, footprint_um, tasks.CAL_SHAPE)
        self.target_image_sha256 = geometry.mask_sha256(self.target_mask)


def test_constants_pinned():
    assert rw.SHAPED_V3B == {"floor": 0.05, "w_iou": 0.40, "w_dice": 0.15, "w_teacher": 0.40,
                             "degenerate_iou_rect": 0.95}
    assert ev.STATUSES == ("OK", "SOURCE_REJECTED", "RUNTIME_ERROR", "TIMEOUT", "RESOURCE_LIMIT", "EMPTY", "INFRA_FAULT")
    assert tasks.CAL_SHAPE == (128, 128)


def test_two_offset_squares_by_hand():
    a = np.zeros((10, 10), bool)
    a[2:6, 2:6] = True
    b = np.zeros((10, 10), bool)
    b[2:6, 3:7] = True
    m = ev.mask_metrics(a, b, ev.mean_axis_scale((20.0, 20.0), (10, 10)))   # 2 um / px
    assert m["iou"] == pytest.approx(0.6) and m["dice"] == pytest.approx(0.75)
    assert m["extra_um"] == pytest.approx(1.0) and m["missing_um"] == pytest.approx(1.0)
    assert m["chamfer_um"] == pytest.approx(1.0)


def test_mean_axis_scale_and_anisotropy():
    assert ev.mean_axis_scale((100.0, 50.0), (10, 10)) == pytest.approx(7.5)
    # a one-pixel horizontal shift on an anisotropic grid is measured in mean-axis um
    a = np.zeros((8, 8), bool)
    a[2:6, 2:5] = True
    b = np.zeros((8, 8), bool)
    b[2:6, 3:6] = True
    m = ev.mask_metrics(a, b, ev.mean_axis_scale((80.0, 8.0), (8, 8)))     # sx 10, sy 1 -> s 5.5
    px = ev.mask_metrics(a, b, 1.0)
    assert m["chamfer_um"] == pytest.approx(px["chamfer_um"] * 5.5)


def _loop_metrics(c, t, s):
    def bnd(m):
        ny, nx = m.shape
        return [(i, j) for i in range(ny) for j in range(nx) if m[i, j] and any(
            not (0 <= i + di < ny and 0 <= j + dj < nx) or not m[i + di, j + dj]
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)))]
    def directed(P, Q):
        return sum(min(math.hypot(p[0] - q[0], p[1] - q[1]) for q in Q) for p in P) / len(P)
    inter = int((c & t).sum())
    a, b = int(c.sum()), int(t.sum())
    e, mi = directed(bnd(c), bnd(t)) * s, directed(bnd(t), bnd(c)) * s
    return {"iou": inter / (a + b - inter), "dice": 2 * inter / (a + b), "extra_um": e, "missing_um": mi,
            "chamfer_um": (e + mi) / 2}


def test_vectorised_matches_loop_reference():
    rng = np.random.default_rng(1)
    for trial in range(30):
        shape = tuple(int(v) for v in rng.integers(5, 24, size=2))
        c = rng.random(shape) < rng.uniform(0.1, 0.8)
        t = rng.random(shape) < rng.uniform(0.1, 0.8)
        c[0, 0] = t[-1, -1] = True
        got, ref = ev.mask_metrics(c, t, 0.37), _loop_metrics(c, t, 0.37)
        for k in ref:
            assert got[k] == pytest.approx(ref[k], abs=1e-5), (trial, k)


def test_target_side_cache_is_keyed_by_sha():
    t = FixtureTask("rect(10, 5, 20, 10)")
    s1 = ev.cached_target_side(t)
    s2 = ev.cached_target_side(t)
    assert s1 is s2 and s1.area == int(t.target_mask.sum())


def test_shaped_v3b_hand_fixture():
    base = rw.RectBaseline(0.5, 0.6, 4.0, 100.0, False)
    r = EvalResult(Status.OK, 0.75, 0.8, 1.0, 1.0, 1.0, 3)
    bd = rw.shaped_breakdown(r, base)
    assert (bd["iou_n"], bd["dice_n"], bd["teacher_nb"]) == pytest.approx((0.5, 0.5, 0.75))
    assert bd["reward"] == pytest.approx(0.625)
    deg = rw.RectBaseline(0.97, 0.98, 0.5, 50.0, True)
    assert rw.shaped_v3b(EvalResult(Status.OK, 0.9, 0.95, 5.0, 5.0, 5.0, 1), deg) == pytest.approx(0.05 + 0.36 + 0.1425 + 0.36)
    assert rw.raw_iou(r) == 0.75


def test_rect_baseline_on_fixture():
    t = FixtureTask("rect(0, 0, 10, 10)\nrect(54, 22, 10, 10)")      # two opposite squares: far from a rectangle
    b = rw.rect_baseline(t)
    assert not b.degenerate and 0 < b.iou_rect < 0.2 and b.ch_rect > 0
    assert b.diag_um == pytest.approx(math.hypot(64, 32))
    sq = FixtureTask("rect(8, 4, 16, 8)", tid="square")
    assert rw.rect_baseline(sq).degenerate and rw.rect_baseline(sq).iou_rect == 1.0
    res = ev.evaluate_many([(t, rw.rect_baseline_program(t)), (t, t.program)])
    assert rw.shaped_v3b(res[0], b) == pytest.approx(0.05) and rw.shaped_v3b(res[1], b) == pytest.approx(1.0)


def test_bad_input_is_a_status_or_a_clear_error():
    t = FixtureTask("circle(32, 16, 10)")
    res = ev.evaluate_many([(t, None), (t, b"rect(0,0,1,1)"), (t, 42), (t, ""), (t, "rect(")], workers=2)
    assert [r.status for r in res] == [Status.SOURCE_REJECTED] * 3 + [Status.EMPTY, Status.SOURCE_REJECTED]
    assert "str" in res[0].reason
    with pytest.raises(ValueError, match="representation"):
        ev.evaluate(t, "rect(0,0,1,1)", representation="png")
    with pytest.raises(ValueError, match="representation"):
        ev.check_source("x", "png")
    with pytest.raises(ValueError, match="Task"):
        ev.evaluate(object(), "rect(0,0,1,1)")
    with pytest.raises(ValueError, match="rect_baseline"):
        rw.shaped_v3b(res[0], None)
    with pytest.raises(ValueError, match="Limits|timeout"):
        Limits(timeout_s=-1)


def test_task_without_cached_baseline_is_computed_on_demand():
    t = FixtureTask("ring(32, 16, 10, 3)", tid="fresh")
    rw._BASELINES.clear()
    metrics._TARGET_CACHE.clear()
    fn = rw.make_reward_fn({t.id: t})
    assert fn(prompts=["p"], completions=["ring(32, 16, 10, 3)"], task_id=["fresh"]) == [pytest.approx(1.0)]


def test_reward_fn_survives_weird_completions():
    t = FixtureTask("circle(32, 16, 10)", tid="c")
    fn = rw.make_reward_fn([t])
    logged = {}
    comps = [None, 17, {"role": "assistant", "content": None}, [{"role": "user", "content": "x"}],
             [{"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "circle(32, 16, 10)"}]}],
             "```python\ncircle(32, 16, 10)", "```svg\n<svg viewBox='0 0 64 32'><circle cx='32' cy='16' r='10'/></svg>\n```"]
    out = fn(prompts=["p"] * len(comps), completions=comps, task_id=["c"] * len(comps),
             representation=["py"] * 6 + ["svg"], log_metric=lambda k, v: logged.__setitem__(k, v))
    assert out[:4] == [0.0] * 4 and out[4] == pytest.approx(1.0) and out[5] == pytest.approx(1.0)
    assert out[6] == pytest.approx(1.0)
    assert fn.__name__ == rw.DEFAULT_REWARD and logged["pix/ok"] == pytest.approx(3 / 7)
    assert set(logged) >= {"pix/executable", "pix/iou_n", "pix/dice_n", "pix/teacher_nb", "pix/degenerate"}
    with pytest.raises(ValueError, match="task_id"):
        fn(prompts=["p"], completions=["x"])


def test_worker_death_is_retried_not_zeroed(monkeypatch):
    "A worker killed from outside is INFRA_FAULT in the server; the parent retries it and gets OK."
    t = FixtureTask("circle(32, 16, 10)", tid="c")
    calls = {"n": 0}
    real = sandbox._ForkServer.run
    def flaky(self, jobs, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            return {i: ("INFRA_FAULT", 0, "worker killed from outside (SIGKILL)", None, 0.0) for i in jobs}
        return real(self, jobs, *a, **k)
    monkeypatch.setattr(sandbox._ForkServer, "run", flaky)
    r = ev.evaluate(t, t.program)
    assert r.ok and calls["n"] == 2


def test_svg_gate():
    for bad in ['<!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]><svg>&b;</svg>',
                '<svg xmlns:xlink="x"><use/></svg>', '<svg viewBox="0 0 1 1"><rect width="1e999" height="1"/></svg>',
                '<svg viewBox="0 0 1 1"><rect width="1" height="1" style="x"/></svg>', "<svg><svg/></svg>", "not xml"]:
        assert ev.check_source(bad, "svg") is not None, bad
    t = FixtureTask("rect(8, 4, 16, 8)", tid="square")
    wrong_box = '<svg viewBox="0 0 100 100"><rect x="8" y="20" width="16" height="8"/></svg>'
    assert ev.evaluate(t, wrong_box, "svg").status == Status.SOURCE_REJECTED
    ok = '<svg viewBox="0 0 64 32"><rect x="8" y="20" width="16" height="8"/></svg>'   # y-down: 32 - 4 - 8 = 20
    assert ev.evaluate(t, ok, "svg").iou == 1.0


def test_isolation_mode_or_clear_refusal(monkeypatch):
    monkeypatch.setenv("PIXRL_REQUIRE_ISOLATION", "1")
    t = FixtureTask("circle(32, 16, 10)", tid="c")
    try:
        r = ev.evaluate(t, t.program)
    except ev.IsolationUnavailable as e:
        assert "PIXRL_REQUIRE_ISOLATION" in str(e)
    else:
        assert r.ok and r.iou == 1.0
        st, _, reason, _ = sandbox._sandbox_run_ungated("import os\nos.listdir('/')", limits=Limits(timeout_s=2))
        assert st == Status.RUNTIME_ERROR
    finally:
        ev.shutdown_servers()


def test_identical_candidates_run_once():
    t = FixtureTask("circle(32, 16, 10)", tid="dup")
    before = ev.server_stats().get("n_OK", 0)
    res = ev.evaluate_many([(t, t.program)] * 5 + [(t, "circle(32, 16, 9)")], workers=2)
    assert [r.ok for r in res] == [True] * 6 and res[0] is res[4] and res[5].iou < 1.0
    assert ev.server_stats().get("n_OK", 0) - before == 2
    res = ev.evaluate_many([(t, t.program)] * 3, workers=2, dedupe=False)
    assert ev.server_stats().get("n_OK", 0) - before == 5


def test_reward_fn_raw_iou_and_log_extra():
    t = FixtureTask("rect(0, 0, 10, 10)\nrect(54, 22, 10, 10)", tid="two")
    cols = {}
    fn = rw.make_reward_fn([t], policy="raw_iou")
    out = fn(prompts=["p"] * 2, completions=[t.program, "rect(0, 0, 10, 10)"], task_id=["two"] * 2,
             log_extra=lambda c, v: cols.__setitem__(c, v))
    assert fn.__name__ == "raw_iou" and out[0] == 1.0 and 0.4 < out[1] < 0.6
    assert cols["pix_status"] == ["OK", "OK"] and cols["pix_iou"][0] == 1.0
    with pytest.raises(ValueError, match="representation"):
        fn(prompts=["p"], completions=["x"], task_id=["two"], representation=["png"])
