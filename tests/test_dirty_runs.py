"""A recorded run refuses a dirty tree before anything runs (`pixrl.core.require_clean`, called by `run_record` and by
`run_campaign`), naming the changed files and the two ways on; `allow_dirty=True` runs it anyway and the record says
`dirty: true, allow_dirty: true`; a run that is not recorded (nbdev_test, a temporary directory, a smoke campaign) is
never refused; `allow_dirty` is not in a campaign's fingerprint; the results table marks an answer from such a run
provisional; every evidence notebook has the parameter and passes it on.

The checkout here is a temporary git repository that `pixrl.core` takes for the repository (its `repo_root`)."""
import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

import pixrl.core as core
from pixrl.pix import campaign
from pixrl.pix.campaign import CampaignConfig, clean_tree_required, recipe, validate
from pixrl.core import DirtyTree, recorded_run, require_clean, run_record, run_record_of
from pixrl.results import PROVISIONAL, results_table

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"


def _git(root: Path, *args) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    "A git checkout with code.py, data/m.txt and runs/b.ipynb committed, taken by pixrl.core for the repository."
    root = tmp_path / "repo"
    for name in ("code.py", "data/m.txt", "runs/b.ipynb"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("v1\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(core, "repo_root", lambda: root)
    monkeypatch.setattr(core, "IN_TEST", False)          # as under papermill, not nbdev_test
    return root


def test_a_dirty_tracked_file_is_refused_by_name(checkout):
    (checkout / "code.py").write_text("v2\n")
    with pytest.raises(DirtyTree) as e:
        run_record(seed=0, evidence=checkout / "runs" / "b")
    message = str(e.value)
    assert "code.py" in message and "1 tracked file(s) outside runs/" in message
    assert "Commit them" in message and "-p allow_dirty True" in message
    assert isinstance(e.value, ValueError)


def test_the_refusal_names_the_first_files_and_counts_the_rest(checkout):
    names = [f"f{k}.py" for k in range(7)]
    for n in names:
        (checkout / n).write_text("v1\n")
    _git(checkout, "add", *names)                          # staged: uncommitted changes to tracked files
    with pytest.raises(DirtyTree, match=r"7 tracked file\(s\) outside runs/: f0.py, f1.py, f2.py, f3.py, f4.py and 2 more"):
        require_clean(False, checkout / "runs" / "b")


def test_allow_dirty_records_dirty_and_allow_dirty(checkout):
    (checkout / "code.py").write_text("v2\n")
    rec = run_record(seed=0, allow_dirty=True, evidence=checkout / "runs" / "b")
    assert rec["dirty"] is True and rec["allow_dirty"] is True
    assert json.loads(json.dumps(rec))["allow_dirty"] is True


def test_a_clean_tree_passes(checkout):
    rec = run_record(seed=0, evidence=checkout / "runs" / "b")
    assert rec["dirty"] is False and rec["allow_dirty"] is False
    (checkout / "runs" / "b.ipynb").write_text("v2\n")    # a campaign rewriting its own evidence notebook
    assert run_record(seed=0, evidence=checkout / "runs" / "b")["dirty"] is False


def test_a_run_that_is_not_recorded_is_not_refused(checkout, tmp_path, monkeypatch):
    (checkout / "code.py").write_text("v2\n")
    for evidence in (None, tmp_path / "scratch", checkout / "elsewhere"):
        assert not recorded_run(evidence)
        rec = run_record(seed=0, evidence=evidence)
        assert rec["dirty"] is True and rec["allow_dirty"] is False      # recorded as dirty, not refused
    assert recorded_run(checkout / "runs" / "b") and recorded_run(checkout / "data" / "models" / "m")
    monkeypatch.setattr(core, "IN_TEST", True)            # nbdev_test: never a recorded run
    assert not recorded_run(checkout / "runs" / "b")
    assert run_record(seed=0, evidence=checkout / "runs" / "b")["dirty"] is True


@pytest.mark.parametrize("bad", ["yes", "True", 1, None])
def test_allow_dirty_is_a_bool(checkout, bad):
    with pytest.raises(ValueError, match=re.escape(f"allow_dirty={bad!r}; accepted: True or False")):
        run_record(seed=0, allow_dirty=bad, evidence=checkout / "runs" / "b")


def test_outside_a_checkout_nothing_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(core, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(core, "IN_TEST", False)
    assert run_record(seed=0, evidence=tmp_path / "runs" / "b")["commit"] is None


def test_campaign_allow_dirty_validates_and_keeps_the_fingerprint(tmp_path):
    validate(CampaignConfig(runs_root=str(tmp_path), allow_dirty=True))
    assert CampaignConfig(allow_dirty=True).fingerprint() == CampaignConfig().fingerprint()
    recorded = json.loads((ROOT / "runs" / "b" / "state.json").read_text())
    assert recorded["fingerprint"] == CampaignConfig(runs_root="../runs", allow_dirty=True).fingerprint()
    assert "allow_dirty" not in recipe(dataclasses.asdict(CampaignConfig(allow_dirty=True)))   # seed_gain, arm_compare
    with pytest.raises(ValueError, match=re.escape("allow_dirty='no'; accepted: True or False")):
        validate(CampaignConfig(runs_root=str(tmp_path), allow_dirty="no"))


def test_a_recorded_campaign_on_a_dirty_tree_is_refused_before_its_run_directory(checkout, tmp_path):
    (checkout / "code.py").write_text("v2\n")
    cfg = CampaignConfig(runs_root=str(checkout / "runs"), name="c")
    with pytest.raises(DirtyTree, match="code.py"):
        campaign.run_campaign(cfg, verbose=False)
    assert not cfg.run_dir.exists()
    config = dataclasses.asdict(cfg)
    assert clean_tree_required(config, cfg.run_dir)                              # the preflight's git check too
    assert not clean_tree_required({**config, "allow_dirty": True}, cfg.run_dir)
    assert not clean_tree_required({**config, "smoke": True}, cfg.run_dir)       # a smoke campaign: no result
    assert not clean_tree_required(config, tmp_path / "scratch" / "c")           # runs_root outside the checkout's runs/
    assert not clean_tree_required({k: v for k, v in config.items() if k != "allow_dirty"}, tmp_path / "c")
    assert CampaignConfig(smoke=True).evidence_dir is None


def _claims_checkout(root: Path, record: dict, answer: str) -> Path:
    "runs/x.ipynb printing `record` and a number, registered current, with one claim on it."
    (root / "runs").mkdir(parents=True, exist_ok=True)
    cell = {"cell_type": "code", "source": "", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": json.dumps(record) + "\ngain +0.10\n"}]}
    (root / "runs" / "x.ipynb").write_text(json.dumps({"cells": [cell]}))
    entry = dict(name="x", line="pix", status="current", why="a test run", command="papermill nbs/x.ipynb runs/x.ipynb",
                 model=None, record=run_record_of(root / "runs" / "x.ipynb"))
    (root / "runs" / "registry.json").write_text(json.dumps([entry]))
    claim = dict(question="Does x gain?", answer=answer, seeds=1, run="x", prints="gain +0.10", seed_claim="n/a: a test")
    (root / "runs" / "claims.json").write_text(json.dumps([claim]))
    return root


@pytest.mark.parametrize("record", [{"commit": "0123abcd", "dirty": True, "allow_dirty": True},
                                    {"commit": "0123abcd", "dirty": False, "allow_dirty": True},
                                    {"commit": "0123abcd", "dirty": True}])
def test_an_answer_from_a_dirty_or_allow_dirty_run_is_provisional(tmp_path, record):
    root = _claims_checkout(tmp_path, record, "+0.10")
    with pytest.raises(ValueError, match=re.escape(f"accepted: an answer that begins {PROVISIONAL!r}")):
        results_table(root)
    _claims_checkout(tmp_path, record, f"{PROVISIONAL}: +0.10")
    assert f"| {PROVISIONAL}: +0.10 |" in results_table(root)
    _claims_checkout(tmp_path, {"commit": "0123abcd", "dirty": False, "allow_dirty": False}, "+0.10")
    assert "| +0.10 |" in results_table(root)


def _evidence_notebooks():
    "(name, cells) of the notebooks under nbs/ that are no library notebook and write a run record."
    for p in sorted(NBS.glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        text = "".join("".join(c["source"]) for c in cells)
        if "#| default_exp" not in text and "run_record(" in text:
            yield p.stem, cells


EVIDENCE = list(_evidence_notebooks())


def test_there_are_evidence_notebooks():
    assert {"train", "seed_gain", "arm_compare", "bench", "probe"} <= {n for n, _ in EVIDENCE}


@pytest.mark.parametrize("name, cells", EVIDENCE, ids=[n for n, _ in EVIDENCE])
def test_every_evidence_notebook_passes_allow_dirty_on(name, cells):
    "An `allow_dirty: bool = False` parameter, passed to run_record, which checks the run (evidence=) or follows require_clean."
    params = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    assert re.search(r"^allow_dirty: bool = False\s", "".join(params["source"]), re.M), name
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    call = code[code.index("run_record("):]
    assert call.startswith("run_record(allow_dirty=allow_dirty"), name
    assert call.startswith("run_record(allow_dirty=allow_dirty, evidence=") or "require_clean(allow_dirty, " in code, name
