"""pix campaign stages under `accelerate launch` (CampaignConfig.num_processes): arm A's sft-L0 and rl-L0 in 2 CPU
(gloo) processes, and the same campaign in 1 process, both started by the campaign CLI as users start them — through
nbs/ddp_smoke.ipynb run by papermill (arm A, pixrl-tiny, into a scratch folder), the notebook that records the
side-by-side run; nbdev_test skips it so that make test runs the two campaigns once.

Checked: each rank generated its share of every batch, the global batch per optimizer step is the config's
(groups_per_step · num_generations = per device × processes, as TRL computes it), both ranks end with identical trainable
weights that moved during training, and the 2-process stage's probe is within the paired bootstrap CI
(`pixrl.stats.paired_bootstrap`, per-task reward) of the 1-process one. A too-large `num_processes` is refused
before anything trains. The SFT stage runs under the same launcher: each rank trains on its
shard of every batch (sft_batch / num_processes examples), and the ranks end with identical moved weights.
The mem trainer's 2-process run is in tests/test_mem_distributed.py. Not covered here: GPUs/NCCL, DeepSpeed, vLLM."""
import json
from pathlib import Path

import papermill as pm
import pytest
from pixrl.pix.campaign import CampaignConfig, validate, process_capacity
from pixrl.stats import paired_bootstrap, per_task_means
from conftest import cache_with_data

pytestmark = pytest.mark.slow      # 2-process stages under accelerate (minutes)

GROUPS, GENERATIONS, STEPS = 2, 4, 2
SFT, RL = 0, 1                     # arm A's stages at level 0: sft-L0, rl-L0
SFT_EPOCHS = 0.2                   # of L0's 400 examples: 5 optimizer steps of CampaignConfig().sft_batch (16), 8 per rank


NBS = Path(__file__).resolve().parents[1] / "nbs"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """nbs/ddp_smoke.ipynb with arm A: the campaign in 1 process, then in 2 (one after the other: side by side, with
    the other test worker busy, four processes would share the 2 cores); {num_processes: run directory}."""
    if process_capacity()[0] < 2:
        pytest.skip("needs 2 CPU cores or 2 CUDA devices")
    root = tmp_path_factory.mktemp("ddp")
    env = {"PIXRL_CACHE": cache_with_data(root / "cache"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    params = dict(arm="A", model="pixrl-tiny", levels="0", steps=STEPS, groups_per_step=GROUPS, num_generations=GENERATIONS,
                  probe_per_level=2, probe_k=2, preflight_control_n=10, max_new_tokens=48, lora_r=8, sft_epochs=SFT_EPOCHS,
                  runs_root=str(root / "runs"), allow_dirty=True)
    with pytest.MonkeyPatch.context() as mp:                   # the kernel, and the campaigns it starts, inherit these
        for k, v in env.items():
            mp.setenv(k, v)
        pm.execute_notebook(str(NBS / "ddp_smoke.ipynb"), str(root / "ddp_smoke.ipynb"), cwd=str(NBS), kernel_name="python3",
                            progress_bar=False, parameters=params, execution_timeout=900)
    out = root / "runs" / "ddp_smoke"
    assert json.loads((out / "summary.json").read_text())["config"]["arm"] == "A"
    return {n: out / f"p{n}" for n in (1, 2)}


def _stage(run_dir, k=RL) -> dict:
    return json.loads((run_dir / "state.json").read_text())["stages"][k]


def test_two_process_sft_stage(runs):
    sft_run = runs[2]
    st = _stage(sft_run, SFT)
    assert st["name"] == "sft-L0" and st["status"] in ("done", "gate_failed"), st
    ranks = st["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    for r in ranks:
        assert r["global_batch"] == CampaignConfig().sft_batch                # the config's batch, split over the ranks
        assert r["per_device_batch"] * 2 == CampaignConfig().sft_batch
        assert 0 < r["seen"] <= r["per_device_batch"] * r["global_step"]     # this rank trained on its shard only
    assert ranks[0]["seen"] == ranks[1]["seen"]                              # equal shares
    assert sum(r["seen"] for r in ranks) == ranks[0]["global_batch"] * st["global_step"] == SFT_EPOCHS * st["n_rows"]   # together: the global batch, every step
    assert ranks[0]["params_digest"] == ranks[1]["params_digest"] != ranks[0]["params_digest_start"]
    assert "accelerate.commands.launch --num_processes 2" in (sft_run / "campaign.log").read_text()


def test_two_process_stage_ran_under_accelerate(runs):
    log = (runs[2] / "campaign.log").read_text()
    assert "accelerate.commands.launch --num_processes 2" in log
    assert "accelerate.commands.launch" not in (runs[1] / "campaign.log").read_text()   # 1 process: plain python
    assert _stage(runs[1])["ranks"] is None and _stage(runs[1], SFT)["ranks"] is None
    assert _stage(runs[2])["status"] == "done" and _stage(runs[2])["global_step"] == STEPS


def test_global_batch_and_shares(runs):
    ranks = _stage(runs[2])["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    for r in ranks:
        assert r["global_batch"] == GROUPS * GENERATIONS                       # what the config says, as TRL computes it
        assert r["per_device_batch"] * r["world_size"] == GROUPS * GENERATIONS
        assert r["generated"] == r["per_device_batch"] * STEPS              # each rank generated its share, every step
    assert sum(r["generated"] for r in ranks) == GROUPS * GENERATIONS * STEPS


def test_ranks_hold_identical_weights(runs):
    ranks = _stage(runs[2])["ranks"]
    assert ranks[0]["params_digest"] == ranks[1]["params_digest"]
    assert ranks[0]["params_digest"] != ranks[0]["params_digest_start"]     # training moved them: not a vacuous match


def test_probe_within_ci_of_one_process(runs):
    probes = {n: json.loads((runs[n] / _stage(runs[n])["probe"]).read_text()) for n in (1, 2)}
    ids = sorted({s["task_id"] for s in probes[1]["samples"]})
    assert ids == sorted({s["task_id"] for s in probes[2]["samples"]})    # the same fixed probe set
    a = per_task_means(probes[1]["samples"], "reward", ids)
    b = per_task_means(probes[2]["samples"], "reward", ids)
    ci = paired_bootstrap(a, b)
    assert ci.lo <= 0 <= ci.hi, str(ci)                                    # no difference detected between 1 and 2 processes


def test_too_many_processes_refused(tmp_path):
    cap, what = process_capacity()
    with pytest.raises(ValueError, match=f"num_processes={cap + 1}: this machine has {cap} {what}"):
        validate(CampaignConfig(runs_root=str(tmp_path), model="pixrl-tiny", num_processes=cap + 1))
    if cap >= 2:
        with pytest.raises(ValueError, match="num_processes=2 does not divide the batch of 9 completions"):
            validate(CampaignConfig(runs_root=str(tmp_path), model="pixrl-tiny", groups_per_step=3, num_generations=3,
                                    num_processes=2))
        with pytest.raises(ValueError, match="num_processes=2 does not divide the batch of 15 SFT examples"):
            validate(CampaignConfig(runs_root=str(tmp_path), model="pixrl-tiny", arm="A", sft_batch=15, num_processes=2))
