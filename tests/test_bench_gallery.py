"""After-training line: the fixed benchmark and the gallery regenerated from committed records."""
import copy, hashlib, json
from pathlib import Path

import pytest

from pixrl.pix.bench import (BENCH_FAMILIES, BENCH_PER_FAMILY, benchmark_tasks, load_record, run_benchmark,
                         summarise)
from pixrl.pix.gallery import GalleryError, gallery_png, save_gallery
from pixrl.pix.tasks import load_split

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "runs" / "bench_base"


def test_benchmark_set_is_fixed():
    tasks = benchmark_tasks()
    assert len(tasks) == BENCH_FAMILIES * BENCH_PER_FAMILY
    assert all(t.split == "test" for t in tasks) and len({t.id for t in tasks}) == len(tasks)
    fams = list(dict.fromkeys(t.family for t in tasks))
    assert [t.family for t in tasks] == [f for f in fams for _ in range(BENCH_PER_FAMILY)]  # grouped by family
    levels = [next(t.level for t in tasks if t.family == f) for f in fams]
    assert levels == [0, 1, 2, 3, 4, 0, 1, 2]  # round-robin over the curriculum
    by_fam = {}
    for t in load_split("test"):
        by_fam.setdefault(t.family, []).append(t.id)
    for f in fams:
        assert [t.id for t in tasks if t.family == f] == sorted(by_fam[f])[:BENCH_PER_FAMILY]
    with pytest.raises(ValueError, match="test split"):
        benchmark_tasks(split="validation")
    with pytest.raises(ValueError, match="families"):
        benchmark_tasks(n_families=10_000)


def test_run_benchmark_refuses_non_test_tasks():
    class P:
        def generate(self, prompts, n, **kw):
            return [["rect(0,0,1,1)"] * n for _ in prompts]
    with pytest.raises(ValueError, match="test split"):
        run_benchmark(P(), load_split("train")[:1], n=1)


def test_committed_base_record_is_consistent():
    rec = load_record(BASE / "bench.json")
    assert rec["kind"] == "pixrl.bench" and rec["config"]["task_ids"] == [t.id for t in benchmark_tasks()]
    again = summarise(rec["tasks"])
    assert again["overall"] == rec["overall"] and again["per_family"] == rec["per_family"]
    assert all(len(r["samples"]) == rec["config"]["n"] for r in rec["tasks"])


@pytest.mark.parametrize("record", ["bench_base/bench.json", "agent_loop_base/loop.json", "bench_b/bench.json"])
def test_gallery_regenerates_byte_identically_from_committed_record(tmp_path, record):
    "The committed gallery PNG is re-made from the committed JSON alone, byte for byte."
    rec = ROOT / "runs" / record
    committed = (rec.parent / "gallery.png").read_bytes()
    sha = save_gallery(rec, tmp_path / "g.png")
    assert sha == hashlib.sha256(committed).hexdigest()
    assert (tmp_path / "g.png").read_bytes() == committed


def _gt_record():
    "A one-task record from the committed base record whose champion is the verified ground-truth program."
    from pixrl.pix.harvest import verify
    from pixrl.pix.tasks import get_task
    rec = load_record(BASE / "bench.json")
    row = copy.deepcopy(rec["tasks"][0])
    task = get_task(row["task_id"])
    (gt,), = verify([task], [[task.program]])
    row["champion"] = {**gt, "attempt": 0}
    return {**rec, "tasks": [row]}, task.id


def test_gallery_draws_non_executable_champions_blank_and_ok_ones():
    rec = load_record(BASE / "bench.json")
    small = {**rec, "tasks": rec["tasks"][:2]}
    assert gallery_png(small) == gallery_png(copy.deepcopy(small))
    good, _ = _gt_record()
    gallery_png(good)


def test_gallery_refuses_stale_or_broken_records():
    good, tid = _gt_record()
    bad = copy.deepcopy(good)
    bad["tasks"][0]["champion"]["code"] = "rect(0, 0, 1/0, 1)"
    with pytest.raises(GalleryError, match=tid):
        gallery_png(bad)
    bad = copy.deepcopy(good)
    bad["tasks"][0]["champion"]["iou"] -= 0.05
    with pytest.raises(GalleryError, match="scores IoU"):
        gallery_png(bad)
    bad = copy.deepcopy(good)
    bad["data_digest"] = "0" * 64
    with pytest.raises(GalleryError, match="digest"):
        gallery_png(bad)
    bad = copy.deepcopy(good)
    del bad["tasks"][0]["champion"]["code"]
    with pytest.raises(GalleryError, match="no code"):
        gallery_png(bad)


def test_load_record_refuses_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"kind": "other"}))
    with pytest.raises(ValueError, match="not a pixrl"):
        load_record(p)


def test_bench_notebook_refuses_a_compare_to_of_other_tasks_before_sampling(tmp_path):
    "A compare_to record of other tasks (or another n) is refused naming it, before the model samples anything."
    import papermill as pm
    rec = json.loads((BASE / "bench.json").read_text())
    rec["tasks"] = rec["tasks"][1:]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(rec))
    run = tmp_path / "run"
    with pytest.raises(pm.PapermillExecutionError, match=r"compare_to '.*other\.json' scored other tasks or another n"):
        pm.execute_notebook(str(ROOT / "nbs" / "bench.ipynb"), str(tmp_path / "out.ipynb"), cwd=str(ROOT / "nbs"),
                            kernel_name="python3", progress_bar=False,
                            parameters={"model": "pixrl-base", "run_name": str(run), "allow_dirty": True,
                                        "compare_to": f"../runs/bench_base/bench.json,{other}"})
    assert (run / "config.json").exists() and not (run / "bench.json").exists()
