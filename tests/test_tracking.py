"""Live progress and tracking (nbs/02_tracking): a bad report_to is refused before anything trains; a tiny campaign
with report_to=trackio writes a trackio run directory under <run_dir>/tracking/ and feeds the progress display
from the stage subprocess while it runs; report_to=tensorboard writes each stage's event file there; papermill keeps one progress output (one line per stage); the mem trainer
logs through the same setting."""
import json, os, sqlite3, subprocess, sys, textwrap
from pathlib import Path

import pytest

import pixrl.pix.campaign as campaign
from pixrl.pix.campaign import CampaignConfig, validate
from pixrl.tracking import ProgressDisplay, check_report_to
from conftest import cache_with_data

TINY = dict(arm="B", model="pixrl-tiny", levels=(0,), smoke=True, probe_per_level=1, probe_k=2, groups_per_step=1,
            max_new_tokens=48, lora_r=8, preflight_control_n=10)


def test_unknown_report_to_refused_before_anything_trains(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pixrl.pix.campaign", "run", "--model", "pixrl-tiny", "--runs-root",
                        str(tmp_path), "--name", "bad", "--report-to", "wandb"],
                       env={**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache")}, capture_output=True, text=True)
    assert r.returncode == 2
    assert "unknown report_to 'wandb'; accepted: none, trackio, tensorboard" in r.stderr
    assert not (tmp_path / "bad").exists()                         # refused before a run directory exists
    from pixrl.mem.train import MemTrainConfig, MemGRPOTrainer
    with pytest.raises(ValueError, match="unknown report_to 'wandb'"):
        MemGRPOTrainer(MemTrainConfig(report_to="wandb"), train_records=[object()])   # before any model load


def test_missing_tracker_package_refused(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match="report_to='tensorboard' needs the 'tensorboard' package"):
        check_report_to("tensorboard")


def test_report_to_is_not_in_the_fingerprint():
    assert CampaignConfig(report_to="trackio").fingerprint() == CampaignConfig().fingerprint()
    recorded = json.loads((Path(__file__).parents[1] / "runs" / "b" / "state.json").read_text())
    assert recorded["fingerprint"] == CampaignConfig(runs_root="../runs").fingerprint()


class Recorder(ProgressDisplay):
    "The campaign's display with a sink that keeps every text it is given (what JupyterLab would show)."
    shown: list = []

    def __init__(self, n_stages, sink=None, min_interval=1.0):
        super().__init__(n_stages, sink=lambda text, final: Recorder.shown.append(text), min_interval=0.0)


def test_trackio_campaign_shows_progress_while_it_runs(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    monkeypatch.setenv("PIXRL_CACHE", cache_with_data(tmp_path / "cache"))
    monkeypatch.setattr(campaign, "ProgressDisplay", Recorder)
    cfg = CampaignConfig(runs_root=str(tmp_path), name="tracked", report_to="trackio", **TINY)
    state = campaign.run_campaign(cfg)
    assert [s["status"] for s in state["stages"]] == ["done"]
    run_dir = tmp_path / "tracked"
    tracked = run_dir / "tracking" / "trackio"
    db = tracked / "tracked.db"                                                # trackio's project = the run dir's name
    assert db.exists(), sorted(p.name for p in tracked.rglob("*"))
    with sqlite3.connect(db) as con:
        logged = [(run, json.loads(m)) for run, m in con.execute("select run_name, metrics from metrics")]
    assert [m["train/reward"] for run, m in logged if run == "stage_0-rl-L0" and "train/reward" in m]   # one run per stage
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [r["event"] for r in rows] == ["begin", "step", "step", "end"]
    assert all(r["reward"] is not None and r["max_steps"] == 2 for r in rows if r["event"] == "step")
    live = [t for t in Recorder.shown if "1/2" in t and "reward" in t]         # mid-stage, fed from the subprocess
    assert live, Recorder.shown
    assert Recorder.shown[-1].startswith("stage 1/1 rl-L0") and Recorder.shown[-1].endswith("(done)")
    assert "\n" not in Recorder.shown[-1]                                      # one line per stage


def test_tensorboard_campaign_writes_each_stage_steps(tmp_path, monkeypatch):
    "report_to=tensorboard on a campaign: each stage's TRL step metrics in <run_dir>/tracking/tensorboard/<stage run>."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.setenv("PIXRL_CACHE", cache_with_data(tmp_path / "cache"))
    cfg = CampaignConfig(runs_root=str(tmp_path), name="tb", report_to="tensorboard", **TINY)
    state = campaign.run_campaign(cfg)
    assert [s["status"] for s in state["stages"]] == ["done"]
    stage_dir = tmp_path / "tb" / "tracking" / "tensorboard" / "stage_0-rl-L0"
    assert list(stage_dir.glob("events.out.tfevents.*")), sorted(p.name for p in (tmp_path / "tb").rglob("*"))
    acc = EventAccumulator(str(stage_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward")] == [1, 2]              # the smoke stage's two GRPO steps
    logged = [json.loads(line) for line in (tmp_path / "tb" / "progress.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in logged if r["event"] == "step"]
    assert [e.value for e in acc.Scalars("train/reward")] == pytest.approx(rewards)   # the same numbers as the display


def test_papermill_keeps_one_progress_output(tmp_path):
    "The kernel sink under papermill: 2 stages × 30 steps leave one output of 2 lines in the saved notebook."
    import nbformat, papermill
    code = textwrap.dedent("""
        import time
        from pixrl.tracking import ProgressDisplay
        bar = ProgressDisplay(2, min_interval=0.0)
        for k in range(2):
            bar.start(k, f"rl-L{k}")
            bar.update({"event": "begin", "step": 0, "max_steps": 30, "t": time.time()})
            for j in range(1, 31):
                bar.update({"event": "step", "step": j, "max_steps": 30, "reward": j / 30, "loss": 0.0, "t": time.time()})
            bar.finish("done")
        bar.close()
    """)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False)
    outputs = nbformat.read(out, as_version=4).cells[0].outputs
    assert len(outputs) == 1 and outputs[0].output_type == "display_data", outputs
    lines = outputs[0].data["text/plain"].split("\n")
    assert len(lines) == 2 and all("30/30" in line and line.endswith("(done)") for line in lines), lines


@pytest.mark.parametrize("tracker,pattern", [("trackio", "*.db"), ("tensorboard", "**/events.out.tfevents.*")])
def test_mem_trainer_logs_through_report_to(tmp_path, tracker, pattern):
    "One mem step with report_to=<tracker> → <run_dir>/tracking/<tracker> (own process: trackio reads TRACKIO_DIR on import)."
    code = textwrap.dedent(f"""
        from pixrl.mem.train import MemTrainConfig, MemGRPOTrainer, cpu_corpus
        cfg = MemTrainConfig(model="pixrl-mem-tiny", steps=1, groups_per_step=1, num_generations=2, val_every=0, report_to={tracker!r})
        trainer = MemGRPOTrainer(cfg, cpu_corpus(cfg)[0][:4], run_dir={str(tmp_path / "mem_run")!r})
        trainer.step()
        trainer.close()
    """)
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list((tmp_path / "mem_run" / "tracking" / tracker).glob(pattern))
