"""pixrl.pix.reward: the guarantees of the hardened `shaped_v3c` and of the default `shaped_v3d` over all 400
validation tasks (issues: reward integrity, rounds 2 and 3). Target-blind programs — one of every class in
`target_blind_programs` — score at most 0.07 on average and beat the task's bounding rectangle on at most 10% of
tasks; under `shaped_v3d` so does every program of the outline class (frames, rings, skeletons, dotted and dashed
edges, a dot) wherever its IoU is below the rectangle's; a program with IoU < 0.05 on a degenerate target scores at
most 0.10; an edit that loses >= 0.02 IoU beats the program it edits on at most 5% of tasks; the ground truth
scores 1.0 everywhere, the bounding rectangle the floor on ordinary targets; the reward is monotone along growing
ground-truth prefixes; `shaped_v3b` is still the pinned reward and still pays the hacks; extracting a program from a
completion is linear in its length."""
import ast

import numpy as np
import pytest

from pixrl.pix import tasks
from pixrl.pix import reward as rw
from pixrl.pix.evaluator import evaluate_many, EvalResult, Status

BLIND_CLASSES = ["hatch rect(2i, 0, 1, 1e5)", "vertical stripes pitch 1 duty 0.5", "horizontal stripes pitch 3 duty 0.75",
                 "diagonal / pitch 2", "grid pitch 2", "checkerboard pitch 1", "full canvas", "half canvas",
                 "scatter 1000 squares seed 0", "scatter 300 discs seed 1", "rings around (40, 40)", "centred disc"]


@pytest.fixture(scope="module")
def val():
    return tasks.load_split("validation")


HARDENED = ("shaped_v3c", "shaped_v3d")


def scores(policy, results, val):
    "(n_tasks,) rewards of `policy` for one result per validation task."
    return np.array([rw.shaped_breakdown(r, rw.rect_baseline(t), policy=policy)["reward"] for r, t in zip(results, val)])


@pytest.fixture(scope="module")
def blind_scores(val):
    "{name: {policy: (400,)}} plus the rectangle's rewards, over all validation tasks."
    library = [t.program for t in tasks.load_split("train")[::100]]
    progs = rw.target_blind_programs(library)
    names = BLIND_CLASSES + [f"union of {len(library)} programs"]
    jobs = [(t, progs[n]) for t in val for n in names] + [(t, rw.rect_baseline_program(t)) for t in val]
    res = evaluate_many(jobs, workers=2)
    out = {}
    for j, n in enumerate(names):
        rs = [res[i * len(names) + j] for i in range(len(val))]
        out[n] = {p: scores(p, rs, val) for p in rw.SHAPED_POLICIES}
    rect = res[len(val) * len(names):]
    out["rect"] = {p: scores(p, rect, val) for p in rw.SHAPED_POLICIES}
    return out


@pytest.mark.parametrize("policy", HARDENED)
def test_target_blind_programs_score_at_most_007(val, blind_scores, policy):
    means = {n: s[policy].mean() for n, s in blind_scores.items() if n != "rect"}
    assert len(val) == 400 and len(means) == len(BLIND_CLASSES) + 1
    assert max(means.values()) <= 0.07, means


@pytest.mark.parametrize("policy", HARDENED)
def test_target_blind_programs_beat_the_rectangle_on_at_most_10pct_of_tasks(blind_scores, policy):
    rect = blind_scores["rect"][policy]
    beats = {n: float((s[policy] > rect + 1e-9).mean()) for n, s in blind_scores.items() if n != "rect"}
    assert max(beats.values()) <= 0.10, beats


def test_v3b_still_pays_the_hatch(blind_scores):
    "The measurement behind the hardening: the pinned shaped_v3b pays the red team's hatch 0.17+ on average."
    v3b = blind_scores["hatch rect(2i, 0, 1, 1e5)"]["shaped_v3b"]
    assert v3b.mean() > 0.15 and (v3b > blind_scores["rect"]["shaped_v3b"] + 1e-9).mean() > 0.5


@pytest.mark.parametrize("policy", HARDENED)
def test_ground_truth_scores_one_and_rectangle_the_floor(val, blind_scores, policy):
    res = evaluate_many([(t, t.program) for t in val], workers=2)
    gt = scores(policy, res, val)
    assert gt.min() >= 1.0 - 1e-9, [t.id for t, g in zip(val, gt) if g < 1 - 1e-9][:5]
    ordinary = np.array([not rw.rect_baseline(t).degenerate for t in val])
    assert np.allclose(blind_scores["rect"][policy][ordinary], 0.05)


@pytest.fixture(scope="module")
def copies(val):
    "(the band copy's result, its frame/slit variants' results) per validation task, through the real sandbox."
    from pixrl.pix.base import band_program
    progs = []
    for t in val:
        copy = band_program(t)
        px = t.footprint_um[0] / np.shape(t.target_mask)[1]
        progs.append([copy, *rw.band_variants(copy, px).values()])
    res = evaluate_many([(t, p) for t, ps in zip(val, progs) for p in ps], workers=2)
    k = len(progs[0])
    return [res[i * k] for i in range(len(val))], {name: [res[i * k + 1 + j] for i in range(len(val))]
                                                   for j, name in enumerate(["frame per run", "slits 1/4 cell"])}


@pytest.fixture(scope="module")
def outline_class(val, copies):
    "{name: [EvalResult per task]}: the red team's frame per run, and every mask of `area_hack_masks`."
    copy_res, variants = copies
    out = {"frame per run": variants["frame per run"]}
    for t, c in zip(val, copy_res):
        for name, m in rw.area_hack_masks(t, c.mask).items():
            out.setdefault(name, []).append(rw.mask_result(t, m))
    return out


def test_outlines_below_the_rectangle_earn_the_floor_under_v3d(val, outline_class):
    "Round 3: area-blind boundary credit. Outlines, rings, skeletons, dotted edges: <= 0.07, beating the rectangle <= 10%."
    bases = [rw.rect_baseline(t) for t in val]
    report = {}
    for name, rs in outline_class.items():
        below = np.array([r.ok and r.iou < b.iou_rect and not b.degenerate for r, b in zip(rs, bases)])
        if below.sum() < 20:
            continue
        v3d = scores("shaped_v3d", rs, val)[below]
        report[name] = (round(float(v3d.mean()), 4), round(float((v3d > 0.05 + 1e-9).mean()), 3), int(below.sum()))
    assert len(report) >= 10, report
    assert all(mean <= 0.07 and beats <= 0.10 for mean, beats, _ in report.values()), report


def test_v3c_pays_the_outlines_the_measurement_behind_v3d(val, outline_class):
    bases = [rw.rect_baseline(t) for t in val]
    rs = outline_class["ring inside target 1 px"]
    below = np.array([r.ok and r.iou < b.iou_rect and not b.degenerate for r, b in zip(rs, bases)])
    v3c = scores("shaped_v3c", rs, val)[below]
    assert below.sum() > 200 and v3c.mean() > 0.3 and (v3c > 0.05 + 1e-9).mean() > 0.9


def test_degenerate_targets_pay_no_dot_under_v3d(val, outline_class):
    "Round 3: on near-rectangular targets a program with IoU < 0.05 scores <= 0.10 (v3c paid one pixel 0.38)."
    degenerate = [i for i, t in enumerate(val) if rw.rect_baseline(t).degenerate]
    progs = []
    for i in degenerate:
        t = val[i]
        (ny, nx), (W, H) = np.shape(t.target_mask), t.footprint_um
        rows, cols = np.nonzero(t.target_mask)
        r0, c0 = int(rows[len(rows) // 2]), int(cols[len(cols) // 2])
        progs.append(f"rect({c0 * W / nx!r}, {H - (r0 + 1) * H / ny!r}, {W / nx!r}, {H / ny!r})\n")   # one on-target pixel
    dots = evaluate_many([(val[i], p) for i, p in zip(degenerate, progs)], workers=2)
    assert len(degenerate) >= 20 and all(r.ok and r.iou < 0.05 for r in dots)
    low = [(r, val[i]) for name, rs in outline_class.items() for i, r in enumerate(rs)
           if i in set(degenerate) and r.ok and r.iou < 0.05] + list(zip(dots, [val[i] for i in degenerate]))
    v3d = [rw.shaped_v3d(r, rw.rect_baseline(t)) for r, t in low]
    v3c = [rw.shaped_v3c(r, rw.rect_baseline(t)) for r, t in zip(dots, [val[i] for i in degenerate])]
    assert max(v3d) <= 0.10, max(v3d)
    assert np.mean(v3c) > 0.3                                          # the break, reproduced under v3c


def test_an_edit_that_loses_iou_rarely_beats_what_it_edits_under_v3d(val, copies):
    "Round 3: precision over IoU. Edits of the copy and of the ground truth losing >= 0.02 IoU win on <= 5% of tasks."
    copy_res, variants = copies
    bases = [rw.rect_baseline(t) for t in val]
    pairs = {"copy -> slits 1/4 cell": list(zip(copy_res, variants["slits 1/4 cell"]))}
    for src, masks in (("copy", [r.mask for r in copy_res]), ("gt", [t.target_mask for t in val])):
        edits = [rw.edit_masks(m) for m in masks]
        for name in edits[0]:
            pairs[f"{src} -> {name}"] = [(rw.mask_result(t, m), rw.mask_result(t, e[name])) for t, m, e in zip(val, masks, edits)]
    report, v3c_worst = {}, 0.0
    for name, ps in pairs.items():
        lossy = [(a, b, base) for (a, b), base in zip(ps, bases) if a.iou - (b.iou if b.ok else 0.0) >= 0.02]
        if len(lossy) < 20:
            continue
        wins = [rw.shaped_v3d(b, base) > rw.shaped_v3d(a, base) + 1e-12 for a, b, base in lossy]
        v3c_worst = max(v3c_worst, np.mean([rw.shaped_v3c(b, base) > rw.shaped_v3c(a, base) + 1e-12 for a, b, base in lossy]))
        report[name] = (round(float(np.mean(wins)), 3), len(lossy))
    assert len(report) >= 10, report
    assert all(share <= 0.05 for share, _ in report.values()), report
    assert v3c_worst > 0.10                                            # the break, reproduced under v3c


@pytest.mark.parametrize("policy", HARDENED)
def test_monotone_along_ground_truth_prefixes(val, policy):
    seqs = []
    for t in val:
        body = ast.parse(t.program).body
        seqs.append(["\n".join(ast.get_source_segment(t.program, s) for s in body[:k]) + "\n" for k in range(1, len(body) + 1)])
    res = iter(evaluate_many([(t, p) for t, seq in zip(val, seqs) for p in seq], workers=2))
    steps, bad = 0, []
    for t, seq in zip(val, seqs):
        rs = [rw.shaped_breakdown(next(res), rw.rect_baseline(t), policy=policy)["reward"] for _ in seq]
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


def test_reward_fn_defaults_to_v3d_and_logs_every_reward(val):
    t = val[0]
    fn = rw.make_reward_fn([t])
    logged = {}
    hatch = rw.target_blind_programs()["hatch rect(2i, 0, 1, 1e5)"]
    out = fn(prompts=["p"] * 2, completions=[t.program, hatch], task_id=[t.id] * 2,
             log_metric=lambda k, v: logged.__setitem__(k, v))
    assert fn.__name__ == rw.DEFAULT_REWARD == "shaped_v3d"
    assert out[0] == pytest.approx(1.0) and out[1] == pytest.approx(rw.shaped_v3d(evaluate_many([(t, hatch)])[0], rw.rect_baseline(t)))
    assert logged["pix/reward_v3d"] == pytest.approx(sum(out) / 2) and logged["pix/reward_v3b"] >= logged["pix/reward_v3c"]
    assert make_fn_names() == ["shaped_v3d", "shaped_v3c", "shaped_v3b", "raw_iou"]


def make_fn_names():
    return [rw.make_reward_fn([], policy=p).__name__ for p in rw.REWARD_POLICIES]


@pytest.mark.parametrize("body", ["a", " ", "`", "py"])
def test_extract_program_is_linear_on_an_unbroken_fence(body, best_time):
    "Round 3: a completion that opens a fence and never breaks a line (a regex took 1.4 s on 64k characters)."
    short = best_time(rw.extract_program, "```" + body * 1_000)
    long = best_time(rw.extract_program, "```" + body * 100_000)
    assert long / max(short, 1e-5) < 300 and long < 0.1, (short, long)     # quadratic would be ~10^4 and seconds
