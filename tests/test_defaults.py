"""One source of every pix campaign default: `CampaignConfig`'s fields. Each entry point is compared with
`dataclasses.fields(CampaignConfig)`: `build_plan` and the library functions that take campaign knobs (`run_sft`,
`run_probe`, `probe_tasks`, and every keyword parameter named like a field), the command lines (`pixrl campaign run`,
each flag typed as its field; the internal `stage`; `pixrl preflight`), train.ipynb's parameters and 07_grpo's
`GRPO_KNOBS`. `test_drift_is_caught` shows each comparison failing on a drifted copy. No training, no model load."""
import dataclasses
import functools
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import notebook_parameters
from pixrl.pix.campaign import ARMS, CampaignConfig, _parser, build_plan

NBS = Path(__file__).parents[1] / "nbs"
DEFAULTS = {f.name: f.default for f in dataclasses.fields(CampaignConfig)}
MODULES = ("pixrl.pix.campaign", "pixrl.pix.campaign_plan", "pixrl.pix.campaign_config", "pixrl.pix.grpo", "pixrl.pix.probe",
           "pixrl.pix.harvest", "pixrl.cli", "pixrl.pix.preflight")
# keyword parameters named like a field whose default is a different thing on purpose: (function, parameter) -> why
NOT_THE_CAMPAIGN_KNOB = {
    ("pixrl.pix.grpo.run_grpo", "replay_share"): "the stage's resolved share (0.0: no replay), not the arm-default knob",
    ("pixrl.pix.probe.run_probe", "temperature"): "the probe samples at T 1 in every campaign; the field is the rollouts' T",
    ("pixrl.pix.harvest.harvest", "temperature"): "the harvest's sampling temperature, not the GRPO rollouts'",
    ("pixrl.pix.harvest.sample_and_verify", "temperature"): "the harvest's and the benchmark's sampling, not the rollouts'",
}


def drift(values: dict, reference: dict = DEFAULTS) -> dict:
    "name -> (value, the reference's) for each name whose value differs from the reference's (kind included: 0 is no False)."
    missing = "<not a CampaignConfig field>"
    return {k: (v, reference.get(k, missing)) for k, v in values.items()
            if k not in reference or v != reference[k] or type(v) is not type(reference[k])}


def plan_drift(plan_fn) -> dict:
    "arm -> True for each arm whose plan under `plan_fn(arm)` (no knob given) is not a default campaign's plan."
    return {a: True for a in ARMS if plan_fn(a) != CampaignConfig(arm=a).plan()}


def named_knob_defaults() -> dict:
    """(function, parameter) -> default for every keyword parameter of a function of MODULES that is named like a
    CampaignConfig field and has a default other than None (None: the function reads CampaignConfig itself)."""
    import importlib
    out = {}
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for fn_name, fn in vars(mod).items():
            if not inspect.isfunction(fn) or fn.__module__ != mod_name:
                continue
            for p in inspect.signature(fn).parameters.values():
                if p.name in DEFAULTS and p.default is not p.empty and p.default is not None:
                    out[(f"{mod_name}.{fn_name}", p.name)] = p.default
    return out


class Captured(Exception):
    "Raised by a stand-in to stop a library function where its resolved knobs are visible."


def run_sft_knobs(monkeypatch, tmp_path) -> dict:
    "The SFT knobs `run_sft` resolves when given none, as CampaignConfig fields (the trainer is a stand-in: nothing trains)."
    import pixrl.pix.grpo as grpo
    monkeypatch.setattr(grpo, "load_policy", lambda *a, **kw: SimpleNamespace(model=None, processor=None, tokenizer=None))
    monkeypatch.setattr(grpo, "sft_dataset", lambda policy, tasks: None)
    monkeypatch.setattr(grpo, "SFTConfig", lambda **kw: kw)

    def trainer(**kw):
        raise Captured(kw)
    monkeypatch.setattr(grpo, "PixSFTTrainer", trainer)
    with pytest.raises(Captured) as e:
        grpo.run_sft("no-model", [], tmp_path)
    kw = e.value.args[0]
    args = kw["args"]
    return {"sft_epochs": args["num_train_epochs"], "sft_lr": args["learning_rate"], "save_steps": args["save_steps"],
            "sft_batch": args["per_device_train_batch_size"] * grpo.world_size(), "lora_r": kw["peft_config"].r}


def run_probe_k() -> int:
    "The samples per task `run_probe` draws when given no `k` (the policy is a stand-in that stops at sampling)."
    from pixrl.pix.probe import run_probe

    class Policy:
        def prompt(self, task):
            return ""

        def images(self, tasks):
            return None

        def sample(self, prompts, n, **kw):
            raise Captured(n)
    with pytest.raises(Captured) as e:
        run_probe(Policy(), [])
    return e.value.args[0]


def grpo_knobs() -> dict:
    "07_grpo's GRPO_KNOBS (its hidden setup cell, run alone): grpo_config's knob names, which are CampaignConfig fields."
    nb = json.loads((NBS / "pix" / "07_grpo.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "GRPO_KNOBS =" in "".join(c["source"]))
    namespace = {}
    exec("".join(cell["source"]), namespace)
    return dict(namespace["GRPO_KNOBS"])


def test_build_plan_defaults_are_the_config():
    assert plan_drift(build_plan) == {}
    assert all(s.steps == CampaignConfig.steps_per_level for s in build_plan("B").stages)
    assert [s.epochs for s in build_plan("A").stages if s.kind == "sft"] == [CampaignConfig.sft_epochs]


def test_build_plan_reads_the_config_at_call_time(monkeypatch):
    monkeypatch.setattr(CampaignConfig, "steps_per_level", 7)
    monkeypatch.setattr(CampaignConfig, "sft_epochs", 0.5)
    plan = build_plan("A")
    assert [s.steps for s in plan.stages if s.kind == "rl"] == [7] * 5
    assert [s.epochs for s in plan.stages if s.kind == "sft"] == [0.5]


def test_named_keyword_defaults_are_the_config():
    "A keyword parameter named like a field defaults to None (read from the config) or to the field's own default."
    found = named_knob_defaults()
    assert ("pixrl.pix.campaign_plan.gate_relative", "exec_slack") in found          # the scan sees the modules' functions
    kept = {key: v for key, v in found.items() if key not in NOT_THE_CAMPAIGN_KNOB}
    wrong = {key: (v, DEFAULTS[key[1]]) for key, v in kept.items() if drift({key[1]: v}) != {}}
    assert wrong == {}
    assert set(NOT_THE_CAMPAIGN_KNOB) <= set(found)                          # no stale exception


def test_run_sft_defaults_are_the_config(monkeypatch, tmp_path):
    assert drift(run_sft_knobs(monkeypatch, tmp_path)) == {}


def test_probe_defaults_are_the_config():
    from pixrl.pix.probe import probe_tasks
    from pixrl.pix.tasks import LEVELS
    assert drift({"probe_k": run_probe_k()}) == {}
    assert drift({"probe_per_level": len(probe_tasks()) // len(LEVELS)}) == {}


def test_preflight_control_default_is_the_config():
    "13_preflight's sample size of the ground-truth positive control (typed there; asserted equal here)."
    from pixrl.pix.preflight import check_positive_control, control_sample, run_preflight
    values = [inspect.signature(control_sample).parameters["n"].default,
              inspect.signature(check_positive_control).parameters["n"].default,
              inspect.signature(run_preflight).parameters["positive_control_n"].default]
    assert [drift({"preflight_control_n": v}) for v in values] == [{}, {}, {}]


def test_cli_defaults_are_the_config():
    "`pixrl campaign run` (pixrl.cli dispatches to pixrl.pix.campaign.cli_main, which parses with _parser): one flag per field."
    from pixrl.cli import COMMANDS
    assert COMMANDS["campaign"][0] == "pixrl.pix.campaign"
    args = vars(_parser().parse_args(["run"]))
    assert set(args) - {"cmd"} == set(DEFAULTS)
    assert drift({k: v for k, v in args.items() if k != "cmd"}) == {}
    bools = [n for n, v in DEFAULTS.items() if isinstance(v, bool)]
    assert bools and all(type(args[n]) is bool for n in bools)             # --x / --no-x, defaulting to the config's


# a value of each kind as the command line gives it, and the type the flag must turn it into
CLI_SAMPLE = {"int": ("3", int), "float": ("0.5", float), "str": ("x", str), "tuple": ("0,1", tuple)}


def test_cli_reads_each_field_as_its_type():
    "Every `run` flag turns its text into the field's kind (`int | None` an int, a level list a tuple), a bool flag into True/False."
    for f in dataclasses.fields(CampaignConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = f.type.split(" | ")[0]
        if kind == "bool":
            on, off = (vars(_parser().parse_args(["run", x]))[f.name] for x in (flag, "--no-" + flag[2:]))
            assert (on, off) == (True, False), f.name
            continue
        text, typ = CLI_SAMPLE[kind]
        value = vars(_parser().parse_args(["run", flag, text]))[f.name]
        assert type(value) is typ, (f.name, f.type, value)


def test_stage_and_preflight_command_defaults_are_the_config(monkeypatch):
    "The internal `stage` command reports where the config's default says; `pixrl preflight` (13_preflight) controls as many tasks."
    stage = _parser().parse_args(["stage", "--run-dir", "r", "--stage", "0"])
    assert drift({"report_to": stage.report_to}) == {}
    import pixrl.pix.preflight as preflight

    def stop(**kw):
        raise Captured(kw)
    monkeypatch.setattr(preflight, "run_preflight", stop)
    with pytest.raises(Captured) as e:
        preflight.cli_main([])
    kw = e.value.args[0]
    assert drift({"preflight_control_n": kw["positive_control_n"], "seed": kw["seed"]}) == {}


def test_train_notebook_defaults_are_the_config():
    "train.ipynb runs in nbs/, so its runs_root is ../runs; every other parameter is the field's default."
    params = notebook_parameters(NBS / "train.ipynb")
    assert list(params) == list(DEFAULTS)
    assert params["runs_root"] == "../" + CampaignConfig.runs_root
    assert drift({**params, "runs_root": CampaignConfig.runs_root}) == {}


def test_grpo_knobs_are_the_config():
    "GRPO_KNOBS holds every knob grpo_config requires (max_new_tokens apart), each at CampaignConfig's default."
    from pixrl.pix.grpo import grpo_config
    knobs = grpo_knobs()
    required = {p.name for p in inspect.signature(grpo_config).parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.default is p.empty}
    assert set(knobs) == required - {"max_new_tokens"}
    assert drift(knobs) == {}


def test_drift_is_caught(monkeypatch, tmp_path):
    "Each comparison above fails on a drifted copy of what it compares."
    assert drift({"learning_rate": 1e-3}) == {"learning_rate": (1e-3, CampaignConfig.learning_rate)}
    assert drift({"smoke": 0}) and drift({"steps_per_level": 54.0}) and drift({"no_such_field": 1})
    # build_plan with its former typed defaults (20 steps, 2 SFT epochs): every arm's plan differs
    old_build_plan = functools.partial(build_plan, steps_per_level=20, sft_epochs=2.0)
    assert set(plan_drift(old_build_plan)) == set(ARMS)
    # run_sft's former defaults (2 epochs, lr 5e-4, save every 20 steps) against its resolved knobs
    old_sft = {**run_sft_knobs(monkeypatch, tmp_path), "sft_epochs": 2.0, "sft_lr": 5e-4, "save_steps": 20}
    assert set(drift(old_sft)) == {"sft_epochs", "sft_lr", "save_steps"}
    assert drift({"probe_k": 4}) == {"probe_k": (4, CampaignConfig.probe_k)}  # run_probe's former k
    # the CLI, the train notebook and GRPO_KNOBS, each with one value changed
    args = {k: v for k, v in vars(_parser().parse_args(["run"])).items() if k != "cmd"}
    assert set(drift({**args, "fast_rollouts": not args["fast_rollouts"]})) == {"fast_rollouts"}
    params = {**notebook_parameters(NBS / "train.ipynb"), "runs_root": CampaignConfig.runs_root}
    assert set(drift({**params, "steps_per_level": params["steps_per_level"] + 1})) == {"steps_per_level"}
    assert set(drift({**grpo_knobs(), "learning_rate": 1e-3})) == {"learning_rate"}   # GRPO_KNOBS' lr, drifted
    # a typed default in a library function named like a field
    def typed(policy, tasks=None, probe_k=3):
        "A probe whose k is typed in its signature, not read from the config."
    typed.__module__ = "pixrl.pix.probe"
    monkeypatch.setattr("pixrl.pix.probe.typed_probe", typed, raising=False)
    found = named_knob_defaults()
    assert drift({"probe_k": found[("pixrl.pix.probe.typed_probe", "probe_k")]}) == {"probe_k": (3, CampaignConfig.probe_k)}
