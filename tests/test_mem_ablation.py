"""mem ablation (`pixrl.mem.ablation`): the committed `runs/mem_ablation/` arm-seeds were saved before `MemTrainConfig`
took TRL GRPOConfig's names (`group_size`, `lr`, …) and before `gamma`; they still read as finished records for the
settings that run executed with, so a re-run of that ablation skips every arm-seed instead of refusing the folder."""
import json
import shlex
from pathlib import Path

from conftest import notebook_parameters
from pixrl.mem.train import MemTrainConfig, PlateauRule, RENAMED, upgrade_saved_config
from pixrl.mem.ablation import parse_arms, parse_seeds, parse_chunks, arm_seed_dir, _done_record, heldout_spec, check_heldout
from pixrl.mem.corpus import split_by_project
from pixrl.mem.model import VAL_FRACTION
from pixrl.mem.train import cpu_corpus

ROOT = Path(__file__).parents[1]
RUNS = ROOT / "runs" / "mem_ablation"


def test_committed_arm_seeds_are_finished_records_under_the_new_names():
    "The committed ablation's records, written under the earlier names and before `gamma`, read as finished under the run's own settings."
    p = upgrade_saved_config(notebook_parameters(ROOT / "runs" / "mem_ablation.ipynb"))   # the run's settings, today's names
    base = MemTrainConfig(model=p["model"], steps=p["steps"], learning_rate=p["learning_rate"],
                          groups_per_step=p["groups_per_step"], num_generations=p["num_generations"],
                          val_every=p["val_every"], val_questions=p["val_questions"]).validate()   # the notebook's base_cfg
    arms, seeds = parse_arms(p["arms"]), parse_seeds(p["seeds"])
    for arm in arms:
        for seed in seeds:
            saved = json.loads((arm_seed_dir(RUNS, arm, seed) / "final.json").read_text())
            assert set(RENAMED) <= set(saved["config"]), (arm.name, seed)     # written under the earlier names
            rec = _done_record(RUNS, arm, seed, base)                         # read: not refused as another config
            assert rec["steps_done"] == p["steps"] and not set(RENAMED) & set(rec["config"])
            assert rec["config"]["learning_rate"] == saved["config"]["lr"] == p["learning_rate"]


def _all_arm_seeds_done(p: dict) -> None:
    """Every arm-seed of the ablation run with notebook parameters `p` is a finished record under its config and rule,
    measured (as its warm start) on the notebook's held-out records and rollouts."""
    base = MemTrainConfig(model=p["model"], kinds=tuple(k.strip() for k in p["kinds"].split(",")),
                          chunks_per_doc=parse_chunks(p["chunks_per_doc"]), steps=p["steps"], learning_rate=p["learning_rate"],
                          warmup_steps=p["warmup_steps"], beta=p["beta"], groups_per_step=p["groups_per_step"],
                          num_generations=p["num_generations"], val_every=p["val_every"],
                          val_questions=p["val_questions"]).validate()              # the notebook's base_cfg
    plateau = PlateauRule(window=p["plateau_window"], min_delta=p["plateau_min_delta"],
                          patience=p["plateau_patience"], min_steps=p["min_steps"],
                          metric=p["plateau_metric"]).validate()
    out = ROOT / "runs" / p["out"]
    records, _ = cpu_corpus(MemTrainConfig(seed=0, kinds=base.kinds, chunks_per_doc=base.chunks_per_doc))
    val = split_by_project(records, VAL_FRACTION, 0)[1]
    val = val[:p["heldout_questions"]] if p["heldout_questions"] else val          # the notebook's held-out records
    heldout = heldout_spec(val, p["final_rollouts"])
    warm = json.loads((out / "warm_start.json").read_text())
    check_heldout(warm.get("heldout"), warm["n_episodes"], heldout, out / "warm_start.json")   # the warm start is reused
    arms, seeds = parse_arms(p["arms"]), parse_seeds(p["seeds"])
    for arm in arms:
        for seed in seeds:
            rec = _done_record(out, arm, seed, base, plateau, heldout)
            assert rec is not None, (arm.name, seed)                          # finished, not to be retrained
            assert rec["stop_reason"].startswith("validation plateau") or rec["steps_done"] == p["steps"]


def test_make_mem_ablation_skips_every_committed_arm_seed():
    """`make mem-ablation` (nbs/mem_ablation.ipynb's own parameters) over its committed run (runs/<out>) finds every
    arm-seed finished for its configuration and stopping rule, and every one and the warm start measured on its held-out
    records and rollouts: a re-run trains nothing, and a changed default would be
    refused here before it mixes two recipes in one folder."""
    _all_arm_seeds_done(notebook_parameters(ROOT / "nbs" / "mem_ablation.ipynb"))


def test_registry_commands_of_earlier_mem_ablations_still_match_their_runs():
    """The registry's command of each mem ablation that is not make mem-ablation (the notebook's defaults overlaid
    with its `-p` values) names the configuration its committed arm-seeds were trained with: re-running the command
    retrains nothing (runs/mem_ablation_dw_gates: 3-4 chunks, KL 0.01, 150 steps, five arms)."""
    defaults = notebook_parameters(ROOT / "nbs" / "mem_ablation.ipynb")
    entries = [r for r in json.loads((ROOT / "runs" / "registry.json").read_text())
               if r["command"].startswith("papermill nbs/mem_ablation.ipynb")]
    assert "mem_ablation_dw_gates" in [r["name"] for r in entries]
    for r in entries:
        argv = shlex.split(r["command"].split("#")[0])
        given = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-p"}
        p = {k: type(v)(given[k]) if k in given and not isinstance(v, str) else given.get(k, v) for k, v in defaults.items()}
        assert p["out"] == r["name"], r["name"]
        _all_arm_seeds_done(p)
