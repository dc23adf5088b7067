"""Arms E and F end to end: a tiny (non-smoke) arm-A campaign on levels 0,1, then E and F forked from it through
stage 1. The fork copies A's finished stages (records, probes, base probe) instead of retraining them, the forked
tail starts from A's stage-1 weights, F's RL stage mixes 50% backward replay, E's L1-SFT is judged by the relative gate."""
import json, os, subprocess, sys
from pathlib import Path

import pytest
from conftest import cache_with_data

REPO = Path(__file__).resolve().parents[1]
COMMON = ["--levels", "0,1", "--steps-per-level", "1", "--sft-epochs", "0.04", "--probe-per-level", "1",
          "--probe-k", "2", "--groups-per-step", "1", "--num-generations", "4", "--max-new-tokens", "32", "--lora-r", "8"]


def _run(tmp_path, arm, name, *extra):
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", arm, "--runs-root", str(tmp_path / "runs"),
           "--name", name, *COMMON, *extra]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((tmp_path / "runs" / name / "state.json").read_text())


@pytest.mark.slow
def test_arms_e_and_f_fork_a_finished_a_campaign(tmp_path):
    a = _run(tmp_path, "A", "a")
    assert [s["name"] for s in a["stages"]] == ["sft-L0", "rl-L0", "rl-L1"]
    assert all(s["status"] in ("done", "gate_failed") for s in a["stages"])
    a_dir = str(tmp_path / "runs" / "a")

    f = _run(tmp_path, "F", "f", "--fork-from", a_dir)
    assert [s["name"] for s in f["stages"]] == ["sft-L0", "rl-L0", "rl-L1"]
    for k in (0, 1):                      # copied, not retrained: same weights path and global step as A's
        assert f["stages"][k]["forked_from"] == a_dir
        assert f["stages"][k].get("final_dir") == a["stages"][k].get("final_dir")
        assert f["stages"][k]["global_step"] == a["stages"][k]["global_step"]
    assert f["stages"][1]["status"] == "forked" and f["stages"][0]["status"] in ("forked", "gate_failed")
    tail = f["stages"][2]
    assert tail["status"] == "done" and tail["input"] == a["stages"][1]["final_dir"]
    assert f["plan"][2]["replay_share"] == 0.5 and tail["n_rows"] == 2 * 400   # 400 L1 rows + as many L0 replay rows
    # the base probe and the forked stages' probes are A's, byte for byte
    run_a, run_f = tmp_path / "runs" / "a", tmp_path / "runs" / "f"
    for name in (a["base_probe"], a["stages"][1]["probe"]):
        assert (run_f / name).read_bytes() == (run_a / name).read_bytes()

    e = _run(tmp_path, "E", "e", "--fork-from", a_dir)
    assert [s["name"] for s in e["stages"]] == ["sft-L0", "rl-L0", "sft-L1", "rl-L1"]
    sft = e["stages"][2]
    assert sft["input"] == a["stages"][1]["final_dir"] and sft["gate"]["rule"] == "relative"
    assert sft["status"] in ("done", "gate_failed")
    rl = e["stages"][3]                   # a failed gate skips the SFT: RL continues from A's stage-1 weights
    assert rl["status"] == "done"
    assert rl["input"] == (sft["final_dir"] if sft["status"] == "done" else a["stages"][1]["final_dir"])
