"""mem line: reward and advantage maths (assertions a1–a6 and a8 of the mem specification, docs/mem.md §assertions).

Each test has its own hand-computed fixture. a7 (α = 1 degenerates) and a9 (adapter loads) belong to the
trainer/serving tests. Run: `pytest tests/test_mem_rewards.py -v`.
"""
import numpy as np
import pytest

from pixrl.advantage import (final_turn_advantage, group_advantage, trajectory_advantage, turn_advantage,
                             two_baseline_advantage, two_baseline_advantage_reference)
from pixrl.mem.rewards import r_exit, r_format, r_outcome, r_traj, r_update


def test_a1_r_update_signs():
    # matching label +1, mismatching -1, unparsed turn (check=None) counts as wrong
    assert r_update(True, True) == 1.0
    assert r_update(False, False) == 1.0
    assert r_update(True, False) == -1.0
    assert r_update(False, True) == -1.0
    assert r_update(None, True) == -1.0
    assert r_update(None, False) == -1.0
    with pytest.raises(ValueError, match="'yes'"):
        r_update("yes", True)


def test_a2_r_exit_bands():
    # last evidence at chunk 2 of 5: exact 0, early -0.75, late -0.5
    assert r_exit(2, 2) == 0.0
    assert [r_exit(t, 2) for t in range(5)] == [-0.75, -0.75, 0.0, -0.5, -0.5]
    assert r_exit(4, 4) == 0.0  # never emitted `end`, last evidence is the last chunk -> exact
    with pytest.raises(ValueError, match="exit_turn"):
        r_exit(-1, 2)


def test_a3_r_format_strict():
    assert r_format([True, True, True, True]) == 1.0
    # any unparsed turn zeroes the whole trajectory: no partial credit
    assert r_format([True, True, False, True]) == 0.0
    assert r_format([False, True, True, True]) == 0.0
    with pytest.raises(ValueError):
        r_format([])
    # r_traj = r_outcome + r_exit + r_format
    assert r_traj(r_outcome(" Orbix-Auth ", "orbix-auth"), r_exit(3, 2), r_format([True, False])) == 0.5


def test_a4_traj_baseline():
    # group of 4 rollouts of one question; mean = (2 + 1 - 0.75 + 0.5) / 4 = 0.6875
    r = np.array([2.0, 1.0, -0.75, 0.5])
    want = np.array([1.3125, 0.3125, -1.4375, -0.1875])
    np.testing.assert_allclose(trajectory_advantage(r), want)
    np.testing.assert_allclose(final_turn_advantage(r), want)
    # every turn of a rollout gets the same trajectory term, even with ragged lengths (alpha = 1)
    adv = two_baseline_advantage(r, [[1.0], [1.0, -1.0], [-1.0, -1.0, 1.0], [1.0, 1.0]], alpha=1.0)
    for g, a in enumerate(adv):
        np.testing.assert_allclose(a, np.full(len(a), want[g]))


# rollout 1 exited after one turn, rollout 2 after two: G_0 = 3, G_1 = 2, G_2 = 1
R_UPDATE = [[1.0, -1.0, 1.0], [-1.0], [1.0, 1.0]]
TURN_WANT = [[2 / 3, -1.0, 0.0], [-4 / 3], [2 / 3, 1.0]]


def _whole_batch_turn(r_update):  # the false pass (docs/mem.md §advantage): one baseline for the whole batch
    flat = np.concatenate([np.asarray(r) for r in r_update])
    return [np.asarray(r) - flat.mean() for r in r_update]


def test_a5_turn_baseline_at_step_t():
    got = turn_advantage(R_UPDATE)
    assert [len(a) for a in got] == [3, 1, 2]
    for a, want in zip(got, TURN_WANT):
        np.testing.assert_allclose(a, want, atol=1e-12)
    # the same fixture rejects whole-batch normalisation (it would give g=0,t=2 +2/3 instead of 0)
    wrong = _whole_batch_turn(R_UPDATE)
    assert not all(np.allclose(a, w) for a, w in zip(wrong, TURN_WANT))
    # vectorised == plain loop on random ragged inputs
    rng = np.random.default_rng(1)
    for trial in range(100):
        G = int(rng.integers(1, 8))
        rt = rng.normal(size=G)
        ru = [rng.choice([-1.0, 1.0], size=int(rng.integers(1, 6))) for _ in range(G)]
        alpha = float(rng.uniform())
        for a, b in zip(two_baseline_advantage(rt, ru, alpha, bool(trial % 2)),
                        two_baseline_advantage_reference(rt, ru, alpha, bool(trial % 2))):
            np.testing.assert_allclose(a, b, atol=1e-9)


def test_a6_alpha_mix():
    r = np.array([2.0, -0.75, 0.25])  # mean 0.5 -> A_traj = [1.5, -1.25, -0.25]
    a_traj = [1.5, -1.25, -0.25]
    pure_traj = two_baseline_advantage(r, R_UPDATE, alpha=1.0)
    pure_turn = two_baseline_advantage(r, R_UPDATE, alpha=0.0)
    for g in range(3):
        np.testing.assert_allclose(pure_traj[g], np.full(len(R_UPDATE[g]), a_traj[g]))
        np.testing.assert_allclose(pure_turn[g], TURN_WANT[g], atol=1e-12)
    mixed = two_baseline_advantage(r, R_UPDATE)  # default alpha 0.9
    np.testing.assert_allclose(mixed[0], [0.9 * 1.5 + 0.1 * 2 / 3, 0.9 * 1.5 - 0.1, 0.9 * 1.5])
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            two_baseline_advantage(r, R_UPDATE, alpha=bad)


def test_group_advantage_matches_trl_formula():
    adv = group_advantage([1.0, 0.0, 0.0, 0.0, 2.0, 2.0], group_size=3, scale="none")
    np.testing.assert_allclose(adv, [2 / 3, -1 / 3, -1 / 3, -4 / 3, 2 / 3, 2 / 3])
    adv = group_advantage([1.0, 0.0, 0.0], group_size=3, scale="group")
    np.testing.assert_allclose(adv, np.array([2 / 3, -1 / 3, -1 / 3]) / (np.sqrt(1 / 3) + 1e-4))


def test_unparsed_turn_has_defined_reward():
    from pixrl.mem.env import MemEpisode, format_turn, parse_turn
    rec = dict(id="t", project="p", question="What is the port of a-auth?", answer="8443",
               chunks=[dict(text="a-auth port 8443.", evidence=True), dict(text="b-ledger port 1.", evidence=False)],
               last_evidence=0)
    for garbage in ["", "<check>maybe</check>", "<check>yes</check><update>x</update><next>end</next>!!"]:
        assert parse_turn(garbage) is None
        ep = MemEpisode(rec)
        log = ep.step(garbage)
        assert not log.parsed and log.check is None and log.r_update == -1.0 and log.memory_after == ""
        ep.step(format_turn(False, "", "continue"))
        ep.answer("8443")
        rw = ep.rewards()
        assert rw["r_update"].tolist() == [-1.0, 1.0]
        assert (rw["r_format"], rw["r_exit"], rw["r_outcome"], rw["r_traj"]) == (0.0, -0.5, 1.0, 0.5)


# ---------------------------------------------------------------- corpus (a8 and bad input)
from pixrl.mem.corpus import (Chunk, KappaError, Record, export_corpus, fixture_corpus, load_corpus,  # noqa: E402
                              split_by_project, validate_record)


def _rec(rid, project):
    return Record(rid, project, f"What is the port of {project}-auth?", "8443",
                  (Chunk(f"{project}-ledger sets port to 9021.", False), Chunk(f"{project}-auth sets port to 8443.", True)),
                  1, "direct")


def test_a8_validation_split_by_project():
    # 5 projects with 3, 1, 2, 2, 2 records; val_fraction 0.4 -> exactly 2 whole projects in validation
    layout = {"alpha": 3, "bravo": 1, "carol": 2, "delta": 2, "echo": 2}
    records = [_rec(f"{p}-{i}", p) for p, n in layout.items() for i in range(n)]
    for seed in range(10):
        train, val = split_by_project(records, val_fraction=0.4, seed=seed)
        train_p, val_p = {r.project for r in train}, {r.project for r in val}
        assert not train_p & val_p, (seed, train_p & val_p)
        assert len(val_p) == 2 and train_p | val_p == set(layout)
        assert len(val) == sum(layout[p] for p in val_p) and len(train) + len(val) == len(records)
    assert split_by_project(records, 0.4, seed=3) == split_by_project(records, 0.4, seed=3)
    # the generated corpus too
    recs, _ = fixture_corpus()
    train, val = split_by_project(recs, 0.25, seed=0)
    assert not {r.project for r in train} & {r.project for r in val} and val
    with pytest.raises(ValueError, match="val_fraction"):
        split_by_project(records, 1.0)
    with pytest.raises(ValueError, match="at least 2 projects"):
        split_by_project(records[:3], 0.5)


def test_corpus_without_kappa_is_refused(tmp_path):
    recs, meta = fixture_corpus()
    for kappa in (None, float("nan"), 0.5):
        with pytest.raises(KappaError):
            export_corpus(tmp_path / "c.jsonl", recs, kappa=kappa)
        assert not (tmp_path / "c.jsonl").exists()
    p = export_corpus(tmp_path / "c.jsonl", recs, kappa=meta["kappa"], meta=meta)
    lines = p.read_text().splitlines()
    (tmp_path / "nometa.jsonl").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(KappaError, match="metadata"):
        load_corpus(tmp_path / "nometa.jsonl")
    import json
    head = json.loads(lines[0])
    head["meta"].pop("kappa")
    (tmp_path / "nokappa.jsonl").write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    with pytest.raises(KappaError, match="never measured"):
        load_corpus(tmp_path / "nokappa.jsonl")
    with pytest.raises(KappaError, match="below the threshold"):
        load_corpus(p, min_kappa=1.5)


def test_bad_records_are_rejected(tmp_path):
    from dataclasses import replace
    from pixrl.mem.env import MemEpisode
    good = _rec("x-0", "x")
    disagree = replace(good, last_evidence=0)
    empty = replace(good, chunks=())
    for bad, needle in [(disagree, "last_evidence=0 disagrees"), (empty, "empty document")]:
        with pytest.raises(ValueError, match=needle):
            validate_record(bad)
        with pytest.raises(ValueError):
            export_corpus(tmp_path / "bad.jsonl", [good, bad], kappa=0.9)
        with pytest.raises(ValueError):
            MemEpisode(bad)
    # a tampered file (label flipped after export) is refused on load
    p = export_corpus(tmp_path / "ok.jsonl", [good], kappa=0.9)
    p.write_text(p.read_text().replace('"last_evidence": 1', '"last_evidence": 0'))
    with pytest.raises(ValueError, match="last_evidence=0"):
        load_corpus(p)


def test_committed_fixture_matches_generator():
    from pathlib import Path
    recs, meta = load_corpus(Path(__file__).parent.parent / "data" / "mem" / "fixture.jsonl")
    assert recs == fixture_corpus(0)[0] and meta["kappa"] >= 0.8
