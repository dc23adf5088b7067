"""pixrl.pix.tasks (depth-v1): ground truth reproduces every target, sizes, de-duplication, sealing,
tamper detection, cache rebuild, bad input (foundation area)."""
import json
import os

import numpy as np
import pytest

import pixrl.pix.tasks as T
from pixrl.pix.geometry import Grid, RenderError, check_footprint, mask_sha256, rasterize, render, run_program
from conftest import release_copy


@pytest.fixture(scope="module")
def release():
    "All splits from the default cache (built and verified on first use)."
    return {s: T.load_split(s) for s in T.SPLITS}


def test_ground_truth_programs_reproduce_every_target_exactly(release):
    n = 0
    for split, tasks in release.items():
        for t in tasks:
            scene = run_program(t.program)
            target = rasterize(scene, Grid(t.footprint_um, T.CAL_SHAPE))
            assert np.array_equal(target, t.target_mask), (split, t.id)  # IoU = 1.0
            assert np.array_equal(rasterize(scene, Grid(t.footprint_um, T.MODEL_IMAGE_SHAPE)), t.model_image), t.id
            assert target.any() and t.target_image_sha256 == mask_sha256(t.target_mask)
            assert T._resolvable(scene, t.footprint_um), t.id  # every feature >= 2 calibration pixels
            n += 1
    assert n == 2800
    # render() (the public path) agrees too, on a sample
    t = release["test"][0]
    assert np.array_equal(render(t.program, t.footprint_um, T.CAL_SHAPE), t.target_mask)


def test_sizes_levels_ids_and_no_duplicates(release):
    for split, tasks in release.items():
        assert len(tasks) == T.SPLIT_SIZES[split]
        assert np.bincount([t.level for t in tasks], minlength=5).tolist() == [T.SPLIT_SIZES[split] // 5] * 5
        assert [t.id for t in tasks] == sorted(t.id for t in tasks) and all(t.split == split for t in tasks)
        assert {t.family for t in tasks} == {f.name for fs in T.FAMILIES.values() for f in fs}
    ids = [t.id for ts in release.values() for t in ts]
    targets = [t.target_image_sha256 for ts in release.values() for t in ts]
    images = [mask_sha256(t.model_image) for ts in release.values() for t in ts]
    assert len(set(ids)) == len(set(targets)) == len(set(images)) == 2800  # within and across splits


def test_no_near_duplicates_across_splits(release):
    "Held-out model images stay below IoU 0.9 against every same-level task of an earlier split."
    def bank(tasks, level):
        return np.stack([t.model_image.ravel() for t in tasks if t.level == level]).astype(np.float32)
    for later, earlier in [("validation", ["train"]), ("test", ["train", "validation"])]:
        for level in T.LEVELS:
            A = bank(release[later], level)
            B = np.concatenate([bank(release[s], level) for s in earlier])
            inter = A @ B.T
            iou = inter / (A.sum(1)[:, None] + B.sum(1)[None, :] - inter)
            assert iou.max() < T.NEAR_DUPLICATE_IOU, (later, level, iou.max())


def test_program_structure_by_level(release):
    draws = ("rect(", "circle(", "ring(", "polygon(", "path(")
    for t in release["train"]:
        calls = sum(t.program.count(d) for d in draws)
        if t.level == 0:
            assert calls == 1 and "for " not in t.program, t.program
        elif t.level == 1:
            assert 2 <= calls <= 4 and "for " not in t.program, t.program
        else:
            assert "for " in t.program, t.program
        # every literal sits on the 0.25 um lattice
        for tok in t.program.replace("(", " ").replace(")", " ").replace(",", " ").split():
            try:
                v = float(tok)
            except ValueError:
                continue
            assert v * 4 == int(v * 4), (t.id, tok)


def test_anisotropy_spread(release):
    a = np.array([max(t.footprint_um) / min(t.footprint_um) for t in release["train"]])
    lv = np.array([t.level for t in release["train"]])
    assert 0.4 <= (a > 1.6).mean() <= 0.65 and 3.5 <= np.quantile(a, 0.9) <= 7
    assert (a[lv == 4] > 1.6).mean() >= 0.6 and a[lv == 4].max() >= 20


def test_make_task_is_deterministic():
    a, b = T.make_task("validation", 3, 777), T.make_task("validation", 3, 777)
    assert a["program"] == b["program"] and a["footprint_um"] == b["footprint_um"]
    assert np.array_equal(a["target_mask"], b["target_mask"]) and np.array_equal(a["model_image"], b["model_image"])


def test_manifest_is_sealed_and_small():
    m = T.read_manifest()
    assert m["release_digest"] == T.release_digest()
    assert T.manifest_path().stat().st_size < 1_000_000
    assert {s: m["splits"][s]["n"] for s in T.SPLITS} == T.SPLIT_SIZES


def test_tampered_target_byte_names_task_and_split(tmp_path, monkeypatch):
    d = release_copy(tmp_path, monkeypatch)
    meta = json.loads((d / "validation.json").read_text())["tasks"]
    k = 17
    path = d / "validation.targets.npy"
    with open(path, "r+b") as fh:
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        off = fh.tell() + k * (128 * 128 // 8) + 700
        fh.seek(off)
        byte = fh.read(1)[0]
        fh.seek(off)
        fh.write(bytes([byte ^ 0x10]))  # flip one bit of one target
    with pytest.raises(T.DatasetIntegrityError) as e:
        T.load_split("validation")
    assert meta[k]["id"] in str(e.value) and "validation" in str(e.value)
    T.load_split("train")  # other splits still verify


def test_tampered_program_names_task(tmp_path, monkeypatch):
    d = release_copy(tmp_path, monkeypatch)
    doc = json.loads((d / "test.json").read_text())
    doc["tasks"][3]["program"] += "rect(0, 0, 1, 1)\n"
    (d / "test.json").write_text(json.dumps(doc))
    with pytest.raises(T.DatasetIntegrityError, match=doc["tasks"][3]["id"]) as e:
        T.load_split("test")
    assert "test" in str(e.value)


def test_missing_cache_is_rebuilt_and_verified(tmp_path, monkeypatch, release):
    before = T.manifest_path().stat().st_mtime_ns
    d = release_copy(tmp_path, monkeypatch)
    (d / "train.targets.npy").unlink()  # one artefact missing: the whole cache is rebuilt
    tasks = T.load_split("train")
    assert [t.id for t in tasks] == [t.id for t in release["train"]]
    assert all(np.array_equal(a.target_mask, b.target_mask) for a, b in zip(tasks, release["train"]))
    assert (d / "train.targets.npy").exists()
    assert T.manifest_path().stat().st_mtime_ns == before  # nothing writes inside data/ at run time


def test_manifest_mismatch_names_task(tmp_path, monkeypatch):
    m = json.loads(T.manifest_path().read_text())
    tid = sorted(m["splits"]["test"]["tasks"])[5]
    m["splits"]["test"]["tasks"][tid] = "0" * 64
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(m))
    monkeypatch.setattr(T, "manifest_path", lambda release=T.RELEASE: bad)
    # inconsistent manifest (release digest no longer matches the per-task digests)
    with pytest.raises(T.DatasetIntegrityError, match="release digest"):
        T.load_split("test")
    # consistent but different manifest: a fresh cache is generated, then refused naming the task
    m["release_digest"] = T._release_digest({s: m["splits"][s]["tasks"] for s in T.SPLITS})
    bad.write_text(json.dumps(m))
    monkeypatch.setenv("PIXRL_CACHE", str(tmp_path / "empty"))
    with pytest.raises(T.DatasetIntegrityError) as e:
        T.load_split("validation")
    assert tid in str(e.value) and "test" in str(e.value)
    assert not (tmp_path / "empty" / T.RELEASE / "test.json").exists()  # nothing unverified was written


def test_get_task_matches_load_split(release):
    t = release["validation"][42]
    g = T.get_task(t.id)
    assert g.id == t.id and g.program == t.program and np.array_equal(g.target_mask, t.target_mask)
    assert not g.target_mask.flags.writeable


@pytest.mark.parametrize("call,needle", [
    (lambda: T.load_split("dev"), "'dev'"), (lambda: T.load_split("Train"), "'Train'"),
    (lambda: T.load_split("train", release="depth-v2"), "'depth-v2'"), (lambda: T.release_digest("v0"), "'v0'"),
    (lambda: T.get_task("d1ffffffffff"), "'d1ffffffffff'"),
    (lambda: render("rect(0, 0, 1, 1)", (0, 5), T.CAL_SHAPE), "(0, 5)"),
    (lambda: render("rect(0, 0, 1, 1)", (float("inf"), 5), T.CAL_SHAPE), "inf"),
    (lambda: render("rect(0, 0, 1, 1)", (5, 5, 5), T.CAL_SHAPE), "(5, 5, 5)"),
    (lambda: render("rect(0, 0, 1, 1)", (5, 5), (0, 5)), "(0, 5)"),
    (lambda: render("for i in range(3):\n    rect(0, 0, 1, [1][i])", (5, 5), T.CAL_SHAPE), "IndexError"),
])
def test_bad_input_raises_naming_the_value(call, needle):
    with pytest.raises(ValueError) as e:
        call()
    assert needle in str(e.value)
