"""After-training line: harvest (train-only sampling, winner gate, dedupe, caps, winner labels)."""
import json

import pytest

from pixrl.pix.harvest import (apply_winner_labels, harvest, load_winner_tasks, load_winners, save_winners,
                           select_winners, train_tasks_only)
from pixrl.pix.tasks import load_split


class ScriptedPolicy:
    "Test double for `generate`: per task, sample 0 = the ground truth, sample 1 = a quarter rect, sample 2 rejected."
    name = "scripted"

    def __init__(self, tasks):
        self.tasks = tasks

    def generate(self, prompts, n, temperature=1.0, max_new_tokens=256, seed=0):
        assert len(prompts) == len(self.tasks)
        out = []
        for t in self.tasks:
            w, h = t.footprint_um
            out.append([t.program, f"rect(0, 0, {w / 4}, {h / 4})", "import os"][:n])
        return out


@pytest.mark.parametrize("split", ["validation", "test"])
def test_harvest_refuses_non_train_ids(split):
    other = load_split(split)[3]
    train = load_split("train")[:2]
    for bad in ([other.id], [other], [train[0].id, other.id]):
        with pytest.raises(ValueError) as e:
            harvest(ScriptedPolicy(train), bad, n=1)
        assert other.id in str(e.value) and split in str(e.value)
    with pytest.raises(ValueError, match=other.id):
        apply_winner_labels([other], [{"task_id": other.id, "representation": "py", "code": "x"}])


def _cand(task_id, reward, iou_n, code, rep="py", status="OK", degenerate=False):
    return {"task_id": task_id, "representation": rep, "reward": reward, "iou_n": iou_n, "code": code,
            "status": status, "executable": status == "OK", "degenerate": degenerate}


def test_dedupe_and_caps_fixture():
    fix = [
        _cand("t1", 0.70, 0.60, "rect(1,1,2,2)"), _cand("t1", 0.90, 0.80, "rect(0,0,2,2)"),   # best reward wins
        _cand("t2", 0.80, 0.70, "circle(1,1,1)  "), _cand("t2", 0.80, 0.70, "circle(1,1,1)"),  # tie -> shorter
        _cand("t3", 0.55, 0.49, "rect(0,0,1,1)"),                                             # below the gate
        _cand("t3", 0.95, 0.99, "rect(0,0,3,3)", status="RUNTIME_ERROR"),                     # not executable
        _cand("t4", 0.60, 0.50, "rect(0,0,9,9)", degenerate=True),                            # gate is inclusive
        _cand("t5", 0.85, 0.90, "ring(1,1,1,1)"),
        _cand("t1", 0.60, 0.60, "<svg a/>", rep="svg"), _cand("t2", 0.70, 0.90, "<svg b/>", rep="svg"),
        _cand("t2", 0.65, 0.90, "<svg c/>", rep="svg"),
    ]
    w = select_winners(fix)
    assert [(x["representation"], x["task_id"], x["code"]) for x in w] == [
        ("py", "t1", "rect(0,0,2,2)"), ("py", "t2", "circle(1,1,1)"), ("py", "t4", "rect(0,0,9,9)"),
        ("py", "t5", "ring(1,1,1,1)"), ("svg", "t1", "<svg a/>"), ("svg", "t2", "<svg b/>")]
    capped = select_winners(fix, caps={"py": 2, "svg": 1})
    # py keeps the two highest rewards (t1 0.90, t5 0.85); svg keeps t2 (0.70 > 0.60)
    assert [(x["representation"], x["task_id"]) for x in capped] == [("py", "t1"), ("py", "t5"), ("svg", "t2")]
    assert select_winners(fix, min_iou_n=0.95) == []  # only t3 reaches it, and t3 did not execute
    assert select_winners([]) == []
    with pytest.raises(ValueError, match="caps"):
        select_winners(fix, caps={"py": -1})


def test_harvest_end_to_end_and_winner_labels(tmp_path):
    train = load_split("train")[:6]
    cands = harvest(ScriptedPolicy(train), [t.id for t in train], n=3, seed=0)
    assert len(cands) == 18 and {c["task_id"] for c in cands} == {t.id for t in train}
    assert all(c["reward"] == 0.0 for c in cands if c["status"] != "OK")
    winners = select_winners(cands)
    # the ground-truth sample is the winner of every task (iou_n ~ 1 beats the quarter rectangle)
    assert [w["task_id"] for w in winners] == sorted(t.id for t in train)
    assert all(w["code"] == next(t.program for t in train if t.id == w["task_id"]) for w in winners)
    path = save_winners(tmp_path / "winners.json", winners, checkpoint="scripted")
    json.loads(path.read_text())
    assert load_winners(path) == winners
    labelled = load_winner_tasks(path, train)
    assert [t.id for t in labelled] == sorted(t.id for t in train)
    # a corpus with fewer winners only labels those tasks
    part = apply_winner_labels(train, winners[:2])
    assert [t.id for t in part] == [w["task_id"] for w in winners[:2]]


def test_empty_winner_corpus_is_an_error(tmp_path):
    train = load_split("train")[:2]
    with pytest.raises(ValueError, match="empty winner corpus"):
        apply_winner_labels(train, [])
    with pytest.raises(ValueError, match="empty winner corpus"):
        apply_winner_labels(train, [_cand(train[0].id, 0.9, 0.9, "<svg/>", rep="svg")], representation="py")
    bogus = tmp_path / "x.json"
    bogus.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(ValueError, match="not a winner corpus"):
        load_winners(bogus)


def test_train_tasks_only_accepts_train():
    train = load_split("train")[:3]
    assert [t.id for t in train_tasks_only([t.id for t in train])] == [t.id for t in train]


def test_winner_label_sft_end_to_end_cpu_default(tmp_path):
    """harvest -> winners -> saved corpus -> apply_winner_labels -> the pix SFT path (pixrl.pix.grpo.run_sft) on
    pixrl-tiny: the SFT rows carry the WINNER programs, training runs, and the result loads as a policy.
    (The winners here come from a scripted sampler so the corpus is non-empty whatever pixrl-tiny's weights.)"""
    from pixrl.pix.grpo import run_sft, sft_dataset
    from pixrl.pix.policy import format_answer, load_policy, resolve_model
    train = [t for t in load_split("train") if t.level == 0][:4]

    class Shifted(ScriptedPolicy):  # the winner is a reformatted GT program (distinct from the canon label)
        def generate(self, prompts, n, **kw):
            return [["# own program\n" + t.program] * n for t in self.tasks]
    winners = select_winners(harvest(Shifted(train), train, n=1))
    assert len(winners) == 4
    path = save_winners(tmp_path / "winners.json", winners)
    tasks = load_winner_tasks(path, train)
    base = load_policy("pixrl-tiny")
    rows = sft_dataset(base, tasks)
    assert rows["completion"] == [format_answer(w["code"]) for w in winners]
    assert all(c.startswith("```python\n# own program") for c in rows["completion"])
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for a 0.8 M-parameter model on a shared CPU; restored below
    try:
        res = run_sft(resolve_model("pixrl-tiny"), tasks, tmp_path / "sft", max_steps=2, batch_size=4, save_steps=100)
    finally:
        torch.set_num_threads(threads)
    assert res["global_step"] == 2 and res["n_rows"] == 4
    pol = load_policy(res["final_dir"])
    assert pol.prompt_spec == base.prompt_spec
    assert len(pol.generate([pol.prompt(train[0])], n=1, max_new_tokens=8)[0]) == 1
