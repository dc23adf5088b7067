"""pix campaign config (nbs/pix/09c_campaign_config): the knobs the campaign shares with TRL's GRPOConfig carry TRL's
names (`num_generations`, `learning_rate`; the LoRA rank `lora_r`, peft's `r`); a record written under the old names
(`rollouts`, `lr`, `lora_rank`) reads as the new ones with its fingerprint unchanged; a new config, a papermill
parameter or a flag under an old name is refused, naming the new one. No training, no model load."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pixrl.pix.campaign import (RENAMED, CampaignConfig, _parser, cli_main, config_fingerprint, current_names,
                                load_state, recipe, refuse_renamed)

ROOT = Path(__file__).parents[1]
RECORDED = {"rollouts": 8, "lr": 5e-4, "lora_rank": 16}      # runs/b's, under the names it was recorded with
# CampaignConfig's knobs that are TRL GRPOConfig fields of the same meaning
TRL_NAMES = ("num_generations", "learning_rate", "temperature", "beta", "num_iterations", "loss_type", "scale_rewards")


def test_the_shared_knobs_carry_trl_and_peft_names():
    from peft import LoraConfig
    from trl import GRPOConfig
    fields = {f.name for f in dataclasses.fields(CampaignConfig)}
    assert set(TRL_NAMES) <= fields and not set(RENAMED) & fields
    assert set(TRL_NAMES) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    assert "r" in {f.name for f in dataclasses.fields(LoraConfig)} and "lora_r" in fields


@pytest.mark.parametrize("old,new", RENAMED.items())
def test_a_new_config_under_an_old_name_is_refused(old, new):
    with pytest.raises(TypeError, match=f"{old}=4 is now {new}=4 .*; accepted: {new}$"):
        CampaignConfig(**{old: 4})
    assert getattr(CampaignConfig(**{new: 4}), new) == 4
    assert getattr(dataclasses.replace(CampaignConfig(), **{new: 4}), new) == 4


@pytest.mark.parametrize("old,new", RENAMED.items())
def test_an_old_flag_is_refused_naming_the_new_one(old, new, tmp_path, capsys):
    flag, new_flag = "--" + old.replace("_", "-"), "--" + new.replace("_", "-")
    with pytest.raises(SystemExit) as e:
        cli_main(["run", "--runs-root", str(tmp_path / "runs"), flag, "4"])
    assert e.value.code == 2
    assert f"{flag} 4 is now {new_flag} 4" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()                          # refused before anything was written
    assert getattr(_parser().parse_args(["run", new_flag, "4"]), new) == 4


def test_an_old_flag_is_refused_by_the_module_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pixrl.pix.campaign", "run", "--runs-root", str(tmp_path), "--rollouts", "4"],
                       env={**os.environ, "PIXRL_CACHE": str(tmp_path / "cache")}, capture_output=True, text=True)
    assert r.returncode == 2
    assert "--rollouts 4 is now --num-generations 4" in r.stderr, r.stderr


def _train_config(injected: str) -> dict:
    "train.ipynb's parameters, a line papermill injects, then its config cell up to `validate` (nothing is run)."
    nb = json.loads((ROOT / "nbs" / "train.ipynb").read_text())
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    config = next(c for c in nb["cells"] if "cfg = CampaignConfig(" in "".join(c["source"]))
    head = "".join(config["source"]).split("plan = validate(cfg)")[0]
    namespace = {}
    exec("".join(params["source"]) + "\n" + injected + "\n" + head, namespace)
    return namespace


def test_a_papermill_parameter_under_an_old_name_is_refused():
    "`papermill nbs/train.ipynb ... -p rollouts 4` is refused, not ignored (the config reads today's names only)."
    assert _train_config("num_generations = 4")["cfg"].num_generations == 4
    with pytest.raises(TypeError, match="rollouts=4 is now num_generations=4"):
        _train_config("rollouts = 4")
    with pytest.raises(TypeError, match="lr=0.001 is now learning_rate=0.001"):
        refuse_renamed({"arm": "B", "lr": 1e-3})
    refuse_renamed({"arm": "B", "learning_rate": 1e-3})


def test_a_record_under_the_old_names_reads_as_the_new():
    state = json.loads((ROOT / "runs" / "b" / "state.json").read_text())
    config = json.loads((ROOT / "runs" / "b" / "config.json").read_text())
    assert {k: config[k] for k in RECORDED} == {k: state["config"][k] for k in RECORDED} == RECORDED
    now = current_names(config)
    assert list(now) == [RENAMED.get(k, k) for k in config]         # each in its place
    assert {new: now[new] for new in RENAMED.values()} == {RENAMED[k]: v for k, v in RECORDED.items()}
    assert config_fingerprint(config) == config_fingerprint(now) == state["fingerprint"]
    assert CampaignConfig(**now).fingerprint() == state["fingerprint"]
    assert recipe(config) == recipe({**now, "allow_dirty": False})   # seed_gain and arm_compare match across the rename
    loaded = load_state(ROOT / "runs" / "b")
    assert not set(RENAMED) & set(loaded["config"]) and loaded["config"]["lora_r"] == 16


def test_a_record_with_both_names_of_a_field_is_refused():
    with pytest.raises(ValueError, match="both names of lr/learning_rate; accepted: one name per field"):
        current_names({"lr": 1e-3, "learning_rate": 5e-4})
