"""Every setting of `CampaignConfig` and `MemTrainConfig` is declared (`pixrl.core.setting`) and enforced: for each
field, bad values are refused with a message naming the field and the value, before any model is loaded; the
defaults pass. Includes the red-team issue's 18 values that `validate` used to accept. No training, no model load."""
import dataclasses
from pathlib import Path

import pytest

from conftest import notebook_parameters
from pixrl.pix.campaign import CampaignConfig, validate, cli_main, _parser
from pixrl.core import Accepts, check_fields, field_accepts, setting, undeclared
from pixrl.mem.train import MemTrainConfig, GPU_DEFAULTS, PlateauRule
from pixrl.pix.reward import REWARD_POLICIES

NAN, INF = float("nan"), float("inf")
NBS = Path(__file__).parents[1] / "nbs"



@dataclasses.dataclass(frozen=True)
class Parsed:
    "A bad value the config parses before validate sees it (levels 9 -> (9,)): the message shows `shown`."
    value: object
    shown: str


# field -> bad values (every field of the dataclass, in order)
CAMPAIGN_BAD = {
    "arm": ["X", "", 5, None],
    "model": ["", 5, None],
    "runs_root": ["", None, 3],
    "name": ["", 7],
    "levels": [Parsed(9, "(9,)"), "", Parsed("0,9", "(0, 9)"), Parsed(-1, "(-1,)"), Parsed("0,0", "(0, 0)"), "0,x", (), (0.5,), None, True],
    "steps_per_level": [0, -1, 1.5, "20", True],
    "num_generations": [1, 0, 2.0],
    "groups_per_step": [0, -2, 1.5],
    "learning_rate": [-1, 0, NAN, "abc", INF, True, None],
    "lora_r": [-4, 1.5, "16"],
    "temperature": [0, -0.5, NAN, "1"],
    "max_new_tokens": [-5, 0, 1.5, "512"],
    "reward": ["iou", "", None],
    "reward_best_of": [0, 2.0, True, "8"],
    "scale_rewards": ["std", 1],
    "loss_type": ["ppo", None],
    "beta": [-1.0, NAN, "0"],
    "num_iterations": [0, 1.0, True],
    "steps_per_generation": [0, -4, 2.0, True, "4"],
    "fast_rollouts": ["yes", 1, None],
    "shared_prefix": ["yes", 1, None],
    "vllm_mode": ["on", "vllm", "", None, 1],
    "replay_share": [5, 1, -0.1, NAN, "0.5"],
    "sft_levels": [Parsed("0,9", "(0, 9)"), Parsed("1,1", "(1, 1)"), "x", Parsed(5, "(5,)"), 0.5],
    "sft_epochs": [-1, 0, NAN],
    "sft_lr": [0, -1e-3, "1e-3"],
    "sft_batch": [0, 16.0],
    "fork_from": ["", 3],
    "fork_through": [-1, 1.5],
    "exec_slack": [-0.01, 1.5, NAN],
    "smoke": ["no", "yes", "True", 1, None],
    "seed": [-1, 1.5, "0", True],
    "probe_k": [0, 2.5],
    "probe_per_level": [0, -16],
    "save_steps": [0, 5.0],
    "preflight_control_n": [0, "40"],
    "report_to": ["wandb", "", None],
    "num_processes": [0, -1, 1.5, True],
    "allow_dirty": ["yes", 1, None],
}

MEM_BAD = {
    "model": ["", None],
    "alpha": [1.5, -0.1, NAN, True, "0.9"],
    "advantage": ["gae", None],
    "omega": [-1.0, INF],
    "gamma": [-0.1, 1.5, NAN, True, "0.95"],
    "std_norm": ["no", 0, None],
    "steps": [0, 2.5],
    "groups_per_step": [0, True],
    "num_generations": [1, 8.0],
    "mini_batch_questions": [0, 3, 1.0],
    "num_iterations": [0, "1"],
    "epsilon": [0, 1, -0.2, NAN],
    "beta": [-0.001, NAN],
    "learning_rate": [0, -1, NAN, "2e-3"],
    "warmup_steps": [-1, 0.5],
    "weight_decay": [-0.1, INF],
    "max_grad_norm": [0, -1.0, NAN],
    "lora_r": [0, 16.0],
    "lora_alpha": [0, 32.5],
    "lora_dropout": [1, -0.1, NAN],
    "lora_targets": [(), ("q_proj", "q_proj"), ("",), ["q_proj"], "q_proj", (1,)],
    "temperature": [0, -1, NAN],
    "top_p": [0, 1.5, NAN],
    "val_temperature": [0, "1"],
    "val_top_p": [0, 1.01],
    "max_prompt_tokens": [7, 512.0],
    "max_response_tokens": [3, None],
    "chunk_words": [0, 6.0],
    "chunks_per_doc": [(4, 3), (0, 4), (3,), (3, 4, 5), [3, 4], 3],
    "kinds": [(), ("direct", "rumour"), ("direct", "direct"), "direct", ["direct"], (1,)],
    "val_every": [-1, 5.0],
    "val_questions": [0, None],
    "micro_batch_rows": [0, 64.5],
    "turn_header": ["", None],
    "answer_header": ["", 1],
    "backend": ["cuda", None],
    "threads": [0, 1.5],
    "seed": [-1, "0"],
    "report_to": ["wandb", None],
}

# the red-team issue's list (item 11), verbatim but for its lr and lora_rank, now learning_rate and lora_r: each used
# to pass validate
ISSUE_18 = [("learning_rate", -1), ("learning_rate", 0), ("learning_rate", NAN), ("learning_rate", "abc"),
            ("levels", 9), ("levels", ""), ("levels", "0,9"), ("levels", -1),
            ("temperature", 0), ("temperature", -1.0), ("groups_per_step", 0), ("lora_r", -4),
            ("max_new_tokens", -5), ("replay_share", 5), ("sft_epochs", -1), ("steps_per_level", 1.5),
            ("smoke", "no"), ("smoke", "False")]


def _cases(table):
    for name, values in table.items():
        for v in values:
            bad, shown = (v.value, v.shown) if isinstance(v, Parsed) else (v, repr(v))
            yield pytest.param(name, bad, shown, id=f"{name}={bad!r}")


def _refusal(name, bad, tmp_path) -> str:
    "The message `validate` refuses CampaignConfig(name=bad) with (model and run root point nowhere: never read)."
    kw = {"runs_root": str(tmp_path / "runs"), "model": str(tmp_path / "no-model-here"), name: bad}
    with pytest.raises(ValueError) as e:
        validate(CampaignConfig(**kw))
    return str(e.value)


def test_every_field_declares_what_it_accepts():
    "A new field without a `setting` fails here (and check_fields refuses to pass it unchecked)."
    for cls in (CampaignConfig, MemTrainConfig):
        missing = [f.name for f in dataclasses.fields(cls) if field_accepts(f) is None]
        assert missing == [] and undeclared(cls) == [], (cls.__name__, missing)


def test_every_field_has_bad_values_in_the_tables():
    assert list(CAMPAIGN_BAD) == [f.name for f in dataclasses.fields(CampaignConfig)]
    assert list(MEM_BAD) == [f.name for f in dataclasses.fields(MemTrainConfig)]


def test_defaults_are_accepted(tmp_path):
    assert check_fields(CampaignConfig()) == CampaignConfig()
    assert MemTrainConfig().validate() == MemTrainConfig()
    assert GPU_DEFAULTS.validate() is GPU_DEFAULTS
    validate(CampaignConfig(runs_root=str(tmp_path)))          # the whole validate, with the default model


@pytest.mark.parametrize("name,bad,shown", list(_cases(CAMPAIGN_BAD)))
def test_campaign_field_refused(name, bad, shown, tmp_path):
    msg = _refusal(name, bad, tmp_path)
    assert name in msg and shown in msg and "accepted" in msg, msg
    assert not (tmp_path / "runs").exists()                    # nothing written


@pytest.mark.parametrize("name,bad,shown", list(_cases(MEM_BAD)))
def test_mem_field_refused(name, bad, shown):
    with pytest.raises(ValueError) as e:
        MemTrainConfig(**{name: bad}).validate()
    msg = str(e.value)
    assert name in msg and shown in msg and "accepted" in msg, msg


PLATEAU_BAD = {"window": [0, 2.5], "min_delta": [-0.01, NAN], "patience": [0, -1, 1.5, True], "min_steps": [-1, "0"],
               "metric": ["val/loss", 2]}


def test_every_plateau_field_has_bad_values():
    assert list(PLATEAU_BAD) == [f.name for f in dataclasses.fields(PlateauRule)] and undeclared(PlateauRule) == []


@pytest.mark.parametrize("name,bad,shown", list(_cases(PLATEAU_BAD)))
def test_plateau_rule_field_refused(name, bad, shown):
    "A stopping rule that cannot work (a patience below 1, a window of 0, ...) is refused naming the field and value."
    with pytest.raises(ValueError) as e:
        PlateauRule(**{name: bad}).validate()
    msg = str(e.value)
    assert name in msg and shown in msg and "accepted" in msg, msg


@pytest.mark.parametrize("name,bad", ISSUE_18, ids=[f"{n}={v!r}" for n, v in ISSUE_18])
def test_red_team_values_refused_before_the_model(name, bad, tmp_path):
    msg = _refusal(name, bad, tmp_path)
    assert msg.startswith(f"{name}="), msg                     # the field's own refusal, not the missing model's
    assert "no-model-here" not in msg and "accepted: " in msg, msg


def test_messages_name_field_value_and_accepted(tmp_path):
    assert _refusal("learning_rate", 0, tmp_path) == "learning_rate=0; accepted: a finite number > 0"
    assert _refusal("smoke", "no", tmp_path) == "smoke='no'; accepted: True or False"
    assert _refusal("levels", "", tmp_path) == ("levels=''; accepted: a non-empty tuple of distinct items, "
                                                "each an int in [0, 4]")
    assert _refusal("levels", "0,9", tmp_path).startswith("levels=(0, 9): item 9 is not an int in [0, 4]; accepted: ")
    assert _refusal("replay_share", 5, tmp_path) == "replay_share=5; accepted: None or a finite number in [0, 1)"
    assert _refusal("arm", "x", tmp_path) == "unknown arm 'X'; accepted: A, B, C, D, E, F, G, I"
    assert _refusal("reward", "iou", tmp_path) == f"unknown reward 'iou'; accepted: {', '.join(REWARD_POLICIES)}"


def test_good_values_still_accepted(tmp_path):
    for kw in (dict(learning_rate=1), dict(levels="0,2"), dict(levels=[1, 3]), dict(levels=4),
               dict(arm="a", sft_levels="0"), dict(replay_share=0), dict(max_new_tokens=None), dict(lora_r=0),
               dict(smoke=True, name="x"), dict(report_to="none"), dict(exec_slack=0)):
        cfg = CampaignConfig(runs_root=str(tmp_path), **kw)
        assert check_fields(cfg) is cfg, kw
    assert CampaignConfig(levels="0, 2").levels == (0, 2) and CampaignConfig(arm="a").arm == "A"
    MemTrainConfig(mini_batch_questions=1, chunks_per_doc=(4, 4), val_every=0, learning_rate=1).validate()


def test_sft_levels_outside_the_plan_refused(tmp_path):
    with pytest.raises(ValueError, match=r"sft_levels=\(2,\): level\(s\) \[2\] are not in levels=\(0, 1\)"):
        validate(CampaignConfig(arm="A", levels="0,1", sft_levels=(2,), runs_root=str(tmp_path)))


def test_reward_best_of_refused_beyond_a_group_or_across_processes(tmp_path):
    with pytest.raises(ValueError, match=r"reward_best_of=9 > num_generations=8.*accepted: 1 … 8"):
        validate(CampaignConfig(reward_best_of=9, runs_root=str(tmp_path)))
    with pytest.raises(ValueError, match=r"reward_best_of=8 with num_processes=2"):
        validate(CampaignConfig(reward_best_of=8, num_processes=2, runs_root=str(tmp_path)))


def test_cli_values_reach_validate_typed(tmp_path, capsys):
    "The CLI passes its flags typed; a bad one is refused (exit 2, the field named) before the preflight."
    a = _parser().parse_args(["run"])
    assert {f.name: getattr(a, f.name) for f in dataclasses.fields(CampaignConfig)} == dataclasses.asdict(CampaignConfig())
    assert _parser().parse_args(["run", "--no-fast-rollouts", "--smoke"]).fast_rollouts is False
    for argv, needle in ((["--levels", "0,9"], "levels=(0, 9)"), (["--levels", ""], "levels=''"),
                         (["--learning-rate", "nan"], "learning_rate=nan"), (["--learning-rate", "0"], "learning_rate=0.0"),
                         (["--steps-per-level", "0"], "steps_per_level=0"),
                         (["--sft-levels", "1,1", "--arm", "A"], "sft_levels=(1, 1)")):
        assert cli_main(["run", "--runs-root", str(tmp_path / "runs"), *argv]) == 2, argv
        assert needle in capsys.readouterr().err, argv
    assert not (tmp_path / "runs").exists()


def test_train_notebook_parameters_mirror_the_config():
    "train.ipynb's papermill parameters are CampaignConfig's fields, in order, with its defaults (runs_root: ../runs)."
    params = notebook_parameters(NBS / "train.ipynb")
    assert list(params) == [f.name for f in dataclasses.fields(CampaignConfig)]
    defaults = {**dataclasses.asdict(CampaignConfig()), "runs_root": "../runs"}
    assert params == defaults
    check_fields(CampaignConfig(**params))


def test_check_fields_kinds():
    "The generic rules: an int is no bool or float, a float is finite and no bool or str, a bool is True/False only."
    @dataclasses.dataclass
    class K:
        i: int = setting(1)
        f: float = setting(0.5)
        b: bool = setting(True)
        o: int | None = setting(None, ge=0)
        t: tuple = setting((1, 2), items=Accepts(int), max_len=3)
        s: str = setting("a", choices=("a", "b"))
    check_fields(K())
    check_fields(K(f=2, o=0, t=()))
    for kw in (dict(i=True), dict(i=1.0), dict(f=True), dict(f="0.5"), dict(f=NAN), dict(f=-INF), dict(b=0),
               dict(b="False"), dict(o=-1), dict(t=(1, 2, 3, 4)), dict(t=(1, "2")), dict(t=[1]), dict(s="c"), dict(s=None)):
        name = list(kw)[0]
        with pytest.raises(ValueError) as e:
            check_fields(K(**kw))
        assert str(e.value).startswith((f"{name}=", f"unknown {name} ")), e.value

    @dataclasses.dataclass
    class Bare:
        x: int = 1
    with pytest.raises(TypeError, match=r"\['x'\]"):
        check_fields(Bare())
