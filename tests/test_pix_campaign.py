"pix training: RunPlans of every arm, gate rules, bad-input refusals, prompt identity SFT = RL = probe."
import json
import pytest
from pixrl.pix.campaign import (ARMS, LEVELS, build_plan, gate_absolute, gate_relative, validate, CampaignConfig,
                            stage_input, STANDARD_REPLAY)
from conftest import cache_with_data


def _probe(exec_rate, iou, reward, level):
    return {"overall": {"exec_rate": exec_rate}, "per_level": {str(level): {"iou": iou, "reward": reward}}}


@pytest.mark.parametrize("arm", ARMS)
def test_runplan_every_arm(arm):
    plan = build_plan(arm, steps_per_level=7)
    names = [s.name for s in plan.stages]
    expected = {
        "A": ["sft-L0"] + [f"rl-L{L}" for L in LEVELS],
        "B": [f"rl-L{L}" for L in LEVELS],
        "C": [f"rl-L{L}" for L in LEVELS],
        "D": ["sft-L0"] + [f"rl-L{L}" for L in LEVELS],
        "E": ["sft-L0", "rl-L0", "sft-L1", "rl-L1", "rl-L2", "rl-L3", "rl-L4"],
        "F": ["sft-L0", "rl-L0", "rl-L1", "rl-L2", "rl-L3", "rl-L4"],
        "G": [x for L in LEVELS for x in (f"sft-L{L}", f"rl-L{L}")],
        "I": ["rl-L4"],
    }[arm]
    assert names == expected
    assert all(s.steps == 7 for s in plan.stages if s.kind == "rl")
    assert plan.needs_thinking == (arm in ("C", "D"))
    sft = [s for s in plan.stages if s.kind == "sft"]
    if sft:  # first SFT of a lineage is absolute, later insertions relative
        assert sft[0].gate == "absolute" and all(s.gate == "relative" for s in sft[1:])
    if arm in ("E", "F"):
        assert plan.fork_through == 1
    if arm == "F":
        assert all(s.replay_share == 0.5 for s in plan.stages[2:])
    if arm == "I":
        s = plan.stages[0]
        assert s.replay_share == STANDARD_REPLAY and s.canary_every == 5 and not sft
    smoke = build_plan(arm, steps_per_level=50, smoke=True)
    assert all(s.steps == 2 for s in smoke.stages if s.kind == "rl")


def test_knobs():
    assert [s.name for s in build_plan("A", sft_levels=(0, 2)).stages][:5] == ["sft-L0", "rl-L0", "rl-L1", "sft-L2", "rl-L2"]
    assert all(s.replay_share == 0.3 for s in build_plan("B", replay_share=0.3).stages)
    assert [s.name for s in build_plan("B", levels=(0, 1)).stages] == ["rl-L0", "rl-L1"]
    with pytest.raises(ValueError, match="fork_through"):
        build_plan("E", fork_through=9)


def test_gate_absolute_pass_and_fail():
    assert gate_absolute(_probe(.5, .3, .31, 0), _probe(.5, .2, .30, 0))[0]
    ok, why = gate_absolute(_probe(.5, .3, .30, 0), _probe(.5, .2, .30, 0))
    assert not ok and "<=" in why


def test_gate_relative_pass_and_fail():
    ref = _probe(.80, .30, 0, 1)
    assert gate_relative(_probe(.76, .31, 0, 1), ref, 1)[0]                    # within slack, IoU gain
    assert not gate_relative(_probe(.70, .50, 0, 1), ref, 1)[0]                # exec loss beyond slack
    assert not gate_relative(_probe(.90, .30, 0, 1), ref, 1)[0]                # no IoU gain
    assert gate_relative(_probe(.70, .50, 0, 1), ref, 1, exec_slack=0.2)[0]    # slack is a knob


def test_failed_gate_never_poisons_lineage():
    st = {"model_path": "BASE", "stages": [{"status": "gate_failed", "final_dir": "SFT"}, {"status": "pending"}]}
    assert stage_input(st, 1) == "BASE"


@pytest.mark.parametrize("kw,msg", [
    (dict(arm="X"), "unknown arm 'X'"),
    (dict(model="/definitely/not/a/model"), "/definitely/not/a/model"),
    (dict(smoke=True, fork_from="runs/a"), "cannot fork"),
    (dict(arm="F"), "fork_from"),
    (dict(arm="D"), "cannot think"),
])
def test_bad_input_refused_before_training(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        validate(CampaignConfig(runs_root=str(tmp_path), **kw))


def test_runs_root_with_other_campaign(tmp_path):
    other = CampaignConfig(arm="A", runs_root=str(tmp_path), name="x")
    other.run_dir.mkdir(parents=True)
    (other.run_dir / "state.json").write_text(json.dumps({"fingerprint": other.fingerprint(), "config": {"arm": "A"}}))
    validate(other)  # same campaign: fine (resume)
    with pytest.raises(ValueError, match="different campaign"):
        validate(CampaignConfig(arm="B", runs_root=str(tmp_path), name="x"))


def test_prompt_identity_sft_rl_probe():
    from pixrl.pix.policy import load_policy, format_answer
    from pixrl.pix.grpo import rl_dataset, sft_dataset
    from pixrl.pix.probe import probe_tasks
    from pixrl.pix.prompt import build_prompt
    from pixrl.pix.tasks import load_split
    pol = load_policy("pixrl-tiny")
    train = [t for t in load_split("train") if t.level == 0][:3] + [t for t in load_split("train") if t.level == 4][:2]
    rl, sft = rl_dataset(pol, train), sft_dataset(pol, train)
    assert rl["prompt"] == sft["prompt"] == [build_prompt(t, pol.prompt_spec) for t in train]
    assert sft["completion"] == [format_answer(t.program) for t in train]
    probe = probe_tasks(1)
    assert [pol.prompt(t) for t in probe] == [build_prompt(t, pol.prompt_spec) for t in probe]
    # token level: prompt ids are a prefix of prompt+completion ids (what SFTTrainer and GRPO both feed the model)
    tok = pol.tokenizer
    p, c = sft["prompt"][0], sft["completion"][0]
    ids_p = tok(p, add_special_tokens=False)["input_ids"]
    assert tok(p + c, add_special_tokens=False)["input_ids"][:len(ids_p)] == ids_p


def test_replay_mix_from_the_package():
    "The backward-replay mix as arms F/I use it (imported from the package, not the notebook namespace)."
    from pixrl.pix.grpo import replay_mix
    from pixrl.pix.tasks import load_split
    tr = load_split("train")
    l2 = [t for t in tr if t.level == 2][:9]
    lower = [t for t in tr if t.level < 2]
    mix = replay_mix(l2, lower, 0.25, seed=0)
    assert len(mix) == 12 and sum(t.level < 2 for t in mix) == 3
    assert [t.id for t in mix] == [t.id for t in replay_mix(l2, lower, 0.25, seed=0)]


def test_reward_policy_is_a_campaign_setting(tmp_path):
    from pixrl.pix.campaign import _parser
    from pixrl.pix.reward import DEFAULT_REWARD
    assert CampaignConfig().reward == DEFAULT_REWARD == "shaped_v3d"
    assert CampaignConfig(reward="shaped_v3b").fingerprint() != CampaignConfig().fingerprint()
    with pytest.raises(ValueError, match="unknown reward 'iou'; accepted: .*shaped_v3c, shaped_v3b, raw_iou"):
        validate(CampaignConfig(reward="iou", runs_root=str(tmp_path)))
    assert _parser().parse_args(["run", "--reward", "raw_iou"]).reward == "raw_iou"


@pytest.mark.slow
def test_the_campaign_reward_reaches_trl_and_the_probe(tmp_path):
    "A smoke stage under shaped_v3b: TRL logs that reward function, the probe and the state name it."
    import os, subprocess, sys
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "B", "--runs-root", str(tmp_path), "--name", "v3b",
           "--levels", "0", "--smoke", "--probe-per-level", "1", "--probe-k", "2", "--groups-per-step", "1",
           "--max-new-tokens", "48", "--lora-r", "8", "--reward", "shaped_v3b"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rd = tmp_path / "v3b"
    state = json.loads((rd / "state.json").read_text())
    assert state["config"]["reward"] == "shaped_v3b"
    steps = [row for row in json.loads((rd / "metrics_0.json").read_text()) if "rewards/shaped_v3b/mean" in row]
    assert steps and all("pix/reward_v3c" in row and "pix/teacher_gate" in row for row in steps)
    assert all(row["pix/teacher_gate"] == 1.0 for row in steps)                  # shaped_v3b: the teacher is ungated
    for name in ("probe_base.json", "probe_0.json"):
        assert json.loads((rd / name).read_text())["config"]["reward"] == "shaped_v3b"


@pytest.mark.slow
def test_a_failed_preflight_stops_the_first_stage_before_anything_trains(tmp_path):
    """The preflight runs in the first stage's process: a prompt budget too small for the prompts (1024 positions −
    900 completion tokens) fails its token audit there, the campaign exits naming the preflight and the check, and
    no probe, checkpoint or stage record was written; the state does not say the preflight passed."""
    import os, subprocess, sys
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "B", "--model", "pixrl-tiny", "--runs-root",
           str(tmp_path / "runs"), "--name", "budget", "--levels", "0", "--smoke", "--max-new-tokens", "900"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "preflight failed in the process of 0, before anything trained: check(s) ['token_audit']" in r.stderr
    rd = tmp_path / "runs" / "budget"
    assert json.loads((rd / "preflight.json").read_text())["failed"] == ["token_audit"]
    assert not list(rd.glob("probe_*.json")) and not (rd / "stage_0.json").exists() and not (rd / "stage_base.json").exists()
    state = json.loads((rd / "state.json").read_text())
    assert "preflight_passed" not in state and state["base_probe"] is None
    assert not (tmp_path / "cache" / "campaigns" / state["campaign_id"] / "stage_0").exists()
