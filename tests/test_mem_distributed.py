"""The mem trainer (`pixrl.mem.train.MemGRPOTrainer`) under `accelerate launch` with 2 CPU processes (gloo), started
as a user starts it: each rank rolls out its share of every step's questions, the global batch per optimizer step
is the config's (groups_per_step · num_generations episodes), and the two ranks hold identical weights that moved.
The script ends as a launched script must (`pixrl.core.exit_launched_rank`): without it about 1 launch in 10 aborted
at interpreter exit, after both ranks had written their records."""
import json, os, socket, subprocess, sys
import pytest
from pixrl.pix.campaign import process_capacity

STEPS, QUESTIONS, GROUP = 2, 4, 2

SCRIPT = """
import json, sys
from pixrl.core import rank, exit_launched_rank
from pixrl.mem.train import MemTrainConfig, MemGRPOTrainer, cpu_corpus
from pixrl.mem.model import VAL_FRACTION
from pixrl.mem.corpus import split_by_project
cfg = MemTrainConfig(model="pixrl-mem-tiny", steps={steps}, groups_per_step={questions}, num_generations={group}, val_every=1, val_questions=4)
train, val = split_by_project(cpu_corpus(cfg)[0], VAL_FRACTION, 0)
trainer = MemGRPOTrainer(cfg, train, val)
hist = trainer.train()
rec = dict(trainer.rank_record(), history=hist)
open(f"{{sys.argv[1]}}/rank_{{rank()}}.json", "w").write(json.dumps(rec, default=float))
exit_launched_rank(0)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if process_capacity()[0] < 2:
        pytest.skip("needs 2 CPU cores")
    d = tmp_path_factory.mktemp("mem_ddp")
    (d / "train.py").write_text(SCRIPT.format(steps=STEPS, questions=QUESTIONS, group=GROUP))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           str(d / "train.py"), str(d)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [json.loads((d / f"rank_{r}.json").read_text()) for r in (0, 1)]


def test_mem_trainer_shares_and_global_batch(ranks):
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    for step in range(STEPS):
        mine = [r["questions"][step] for r in ranks]
        assert [len(q) for q in mine] == [QUESTIONS // 2] * 2               # each rank rolled out its share
    assert ranks[0]["questions"] != ranks[1]["questions"]                   # different shares, not one list twice
    for r in ranks:
        assert r["global_batch"] == QUESTIONS * GROUP and r["steps"] == STEPS
        assert [h["step"] for h in r["history"]] == list(range(1, STEPS + 1))
    for a, b in zip(ranks[0]["history"], ranks[1]["history"]):              # metrics gathered over both ranks' episodes:
        for k in ("reward/traj", "gate/acc_free", "resp/mean_tokens", "val/reward"):   # every rank logs the same values
            assert a[k] == b[k], (k, a[k], b[k])


def test_mem_trainer_ranks_hold_identical_weights(ranks):
    assert ranks[0]["params_digest"] == ranks[1]["params_digest"]
    assert ranks[0]["params_digest"] != ranks[0]["params_digest_start"]      # the steps moved them
    assert ranks[0]["params_digest_start"] == ranks[1]["params_digest_start"]


def test_mem_trainer_refuses_unsplittable_questions(monkeypatch):
    from pixrl.mem.train import MemTrainConfig, MemGRPOTrainer
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="groups_per_step=3 does not split over 2 processes"):
        MemGRPOTrainer(MemTrainConfig(model="pixrl-mem-tiny", groups_per_step=3), [object()])
