"""pix campaign resumability: SIGKILL the campaign mid-stage, re-run the same command; it finishes with every stage
exactly once, the interrupted stage resumes from its Trainer checkpoint (step count continues) and the probe curve
has one point per stage. Tiny config: arm B on levels 0,1, 3 GRPO steps per stage, a 1-task-per-level probe.
And the committed `make train` campaign (runs/b, recorded before the TRL/peft rename of its knobs) resumes as the same
campaign: every stage done, nothing run again."""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

from pixrl.pix.campaign import CampaignConfig, probe_points, run_campaign
from conftest import cache_with_data

ROOT = Path(__file__).parents[1]


def _cmd(root):
    return [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "B", "--runs-root", str(root), "--name", "resume",
            "--levels", "0,1", "--steps-per-level", "3", "--probe-per-level", "1", "--probe-k", "2",
            "--groups-per-step", "1", "--max-new-tokens", "48", "--lora-r", "8", "--save-steps", "1"]


@pytest.mark.slow
def test_sigkill_mid_stage_then_resume(tmp_path):
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run_dir = tmp_path / "runs" / "resume"
    proc = subprocess.Popen(_cmd(tmp_path / "runs"), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at, deadline = None, time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None:
            st = run_dir / "state.json"
            if st.exists():
                state = json.loads(st.read_text())
                s1 = state["stages"][1]
                ck = [c for c in (tmp_path / "cache" / "campaigns" / state["campaign_id"] / "stage_1").glob("checkpoint-*")
                      if (c / "trainer_state.json").exists()]          # a complete checkpoint exists
                if s1["status"] == "running" and ck and not (run_dir / "stage_1.json").exists():
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed_at = len(ck)
                    break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert killed_at, "never caught stage 1 mid-flight with a checkpoint"
    assert json.loads((run_dir / "state.json").read_text())["stages"][1]["status"] == "running"

    r = subprocess.run(_cmd(tmp_path / "runs"), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    state = json.loads((run_dir / "state.json").read_text())
    assert [s["status"] for s in state["stages"]] == ["done", "done"]
    done = [e["stage"] for e in state["events"] if e["event"] == "done"]
    assert sorted(done) == [0, 1]                                   # every stage completed exactly once
    assert state["stages"][0]["attempts"] == 1 and state["stages"][1]["attempts"] == 2
    s1 = state["stages"][1]
    assert s1["resumed_from_step"] >= 1 and s1["global_step"] == 3  # resumed from the checkpoint, count continued
    from pixrl.pix.campaign import probe_points
    pts = probe_points(state, run_dir)
    assert [p[0] for p in pts] == ["base", "rl-L0", "rl-L1"]         # one probe point per stage (+ base)


def test_the_committed_run_resumes_with_every_stage_done(tmp_path, monkeypatch):
    """runs/b, copied with its checkpoints' folder present: `make train`'s config (runs_root ../runs) passes validate's
    fingerprint check and the runner skips every stage (no preflight, probe or stage process starts)."""
    recorded = json.loads((ROOT / "runs" / "b" / "state.json").read_text())
    assert {"rollouts", "lr", "lora_rank"} <= set(recorded["config"])        # recorded under the old names
    run_dir = tmp_path / "runs" / "b"
    shutil.copytree(ROOT / "runs" / "b", run_dir)
    monkeypatch.setenv("PIXRL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "campaigns" / recorded["campaign_id"]).mkdir(parents=True)   # its checkpoints: "on this machine"
    cfg = CampaignConfig(runs_root=str(tmp_path / "runs"))
    assert cfg.fingerprint() == recorded["fingerprint"] == CampaignConfig(runs_root="../runs").fingerprint()
    state = run_campaign(cfg, verbose=False)
    assert [s["status"] for s in state["stages"]] == ["done"] * len(recorded["stages"]) == ["done"] * 5
    assert state["campaign_id"] == recorded["campaign_id"] and state["events"] == recorded["events"]   # nothing ran
    assert (run_dir / "campaign.log").read_text() == (ROOT / "runs" / "b" / "campaign.log").read_text()   # no process
    assert {k: state["config"][k] for k in ("num_generations", "learning_rate", "lora_r")} == {
        "num_generations": 8, "learning_rate": 5e-4, "lora_r": 16}
    assert len(probe_points(state, run_dir)) == 1 + 5
