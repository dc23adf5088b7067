"""Campaign fault injection (issue 18, item 5). Each fault ends one of two ways only: the campaign resumes to the
same probe as an uninterrupted run (same completions, same entropies), or it refuses with a clear error naming the
file. Never a silent zero reward (the GRPO metrics record no INFRA_FAULT reward) and never a half-written checkpoint
resumed from. Tiny config: arm B on level 0, 4 GRPO steps of 1 group, a checkpoint every step, a 10-task probe."""
import json, os, resource, shutil, signal, subprocess, sys, threading, time, uuid
from pathlib import Path

import psutil
import pytest
from conftest import cache_with_data

STEPS = 4


def _cmd(root, name):
    return [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "B", "--runs-root", str(root), "--name", name,
            "--levels", "0", "--steps-per-level", str(STEPS), "--probe-per-level", "2", "--probe-k", "2",
            "--groups-per-step", "1", "--max-new-tokens", "48", "--lora-r", "8", "--save-steps", "1",
            "--preflight-control-n", "4"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    "A shared PIXRL_CACHE (each campaign has its own id inside it) and the uninterrupted reference run."
    root = tmp_path_factory.mktemp("faults")
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(root / "cache"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(_cmd(root / "runs", "reference"), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {"root": root, "env": env, "ref": _probe(root / "runs" / "reference")}


def _probe(run_dir) -> dict:
    p = json.loads((Path(run_dir) / "probe_0.json").read_text())
    return {"completions": [s["completion"] for s in p["samples"]], "entropy": [s["entropy"] for s in p["samples"]],
            "overall": p["overall"]}


def _state(run_dir) -> dict:
    return json.loads((Path(run_dir) / "state.json").read_text())


def _stage_dir(world, run_dir) -> Path:
    return Path(world["env"]["PIXRL_CACHE"]) / "campaigns" / _state(run_dir)["campaign_id"] / "stage_0"


def _assert_same_as_reference(world, run_dir):
    got = _probe(run_dir)
    assert got["completions"] == world["ref"]["completions"]
    assert got["entropy"] == world["ref"]["entropy"]          # equal floats: the same weights
    assert got["overall"] == world["ref"]["overall"]
    metrics = json.loads((Path(run_dir) / "metrics_0.json").read_text())
    steps = [m for m in metrics if "pix/status/INFRA_FAULT" in m]
    assert len(steps) == STEPS and all(m["pix/status/INFRA_FAULT"] == 0 for m in steps)   # no reward from a fault


def _fsize_limit(n_bytes):
    def lim():
        resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return lim


@pytest.mark.slow
@pytest.mark.parametrize("limit, resumed_from", [(500_000, 0), (2_000_000, STEPS)],
                         ids=["checkpoint-optimizer-write", "final-weights-write"])
def test_write_refused_part_way_then_resume(world, limit, resumed_from):
    """RLIMIT_FSIZE refuses a write part-way (EFBIG: the optimizer state of the first checkpoint at 0.5 MB; the
    3.2 MB merged final weights at 2 MB, after every checkpoint was written). The campaign fails loudly; the re-run
    drops the half-written checkpoint, resumes from the last complete one and ends with the reference probe."""
    name = f"fsize{limit}"
    rd = world["root"] / "runs" / name
    r = subprocess.run(_cmd(world["root"] / "runs", name), env=world["env"], capture_output=True, text=True,
                       timeout=600, preexec_fn=_fsize_limit(limit))
    assert r.returncode != 0 and f"stage 0 of {rd} failed" in r.stderr          # loud, with the log's tail
    assert _state(rd)["stages"][0]["status"] == "running"
    assert not (rd / "stage_0.json").exists() and not (rd / "probe_0.json").exists()
    cks = sorted(_stage_dir(world, rd).glob("checkpoint-*"))
    if resumed_from == 0:
        assert cks and not any((c / "trainer_state.json").exists() for c in cks)   # a half-written checkpoint
    r = subprocess.run(_cmd(world["root"] / "runs", name), env=world["env"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s0 = _state(rd)["stages"][0]
    assert s0["status"] == "done" and s0["attempts"] == 2
    assert s0["resumed_from_step"] == resumed_from and s0["global_step"] == STEPS
    _assert_same_as_reference(world, rd)


def _forkservers(tag):
    "The evaluator fork servers started under the environment tag `tag` (their environment keeps PIXRL_* names)."
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "forkserver_main" in " ".join(p.info["cmdline"] or []) and p.environ().get("PIXRL_FAULT_TAG") == tag:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def _run_with(world, name, saboteur):
    "Run a campaign while `saboteur(tag, stop_event) -> count` acts on its processes; returns (result, count)."
    tag = uuid.uuid4().hex
    env = {**world["env"], "PIXRL_FAULT_TAG": tag}
    stop, out = threading.Event(), {}
    th = threading.Thread(target=lambda: out.setdefault("n", saboteur(tag, stop)))
    th.start()
    try:
        r = subprocess.run(_cmd(world["root"] / "runs", name), env=env, capture_output=True, text=True, timeout=600)
    finally:
        stop.set()
        th.join(30)
    return r, out.get("n", 0)


@pytest.mark.slow
def test_worker_sigkilled_mid_batch(world):
    """Evaluator workers SIGKILLed while they run (an OOM killer, an operator) are INFRA_FAULTs, retried: the
    campaign ends with the reference probe and no step recorded a faulted reward."""
    def kill_workers(tag, stop):
        n = 0
        while not stop.is_set() and n < 5:
            for srv in _forkservers(tag):
                try:
                    for w in srv.children():
                        w.send_signal(signal.SIGKILL)
                        n += 1
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.001)
        return n
    r, killed = _run_with(world, "worker_kill", kill_workers)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert killed >= 1, "no evaluator worker was caught running"
    _assert_same_as_reference(world, world["root"] / "runs" / "worker_kill")


def test_fork_server_killed_between_steps(world):
    """The evaluator's fork server SIGKILLed while the trainer is between steps (after checkpoint-1): the next
    evaluation starts a new server; the campaign ends with the reference probe."""
    rd = world["root"] / "runs" / "server_kill"

    def kill_server(tag, stop):
        while not stop.is_set():
            st = rd / "state.json"
            if st.exists() and (_stage_dir(world, rd) / "checkpoint-1" / "trainer_state.json").exists():
                victims = _forkservers(tag)
                for p in victims:
                    p.send_signal(signal.SIGKILL)
                if victims:
                    return len(victims)
            time.sleep(0.01)
        return 0
    r, killed = _run_with(world, "server_kill", kill_server)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert killed >= 1, "the fork server was never caught between steps"
    _assert_same_as_reference(world, rd)


def test_two_campaigns_on_one_run_directory(world):
    "A second campaign started on a directory a running one holds is refused at once, naming the lock file."
    rd = world["root"] / "runs" / "twice"
    first = subprocess.Popen(_cmd(world["root"] / "runs", "twice"), env=world["env"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (rd / "state.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, "the first campaign ended before the second was started"
        t0 = time.time()
        second = subprocess.run(_cmd(world["root"] / "runs", "twice"), env=world["env"], capture_output=True,
                                text=True, timeout=120)
        assert second.returncode != 0 and time.time() - t0 < 60
        assert str(rd / ".lock") in second.stderr and f"pid {first.pid}" in second.stderr
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    assert [e["event"] for e in _state(rd)["events"]] == ["start", "done"]    # one writer: one start, one done
    _assert_same_as_reference(world, rd)


@pytest.mark.parametrize("record", ["state.json", "probe_0.json", "stage_base.json"])
def test_truncated_record_is_refused(world, tmp_path, record):
    """A truncated record of a finished run (state, probe, the base-probe stage record) is refused with an error
    naming the file, by the runner (state.json) or by what reads the probe curve — never read as empty."""
    rd = tmp_path / "runs" / "reference"
    shutil.copytree(world["root"] / "runs" / "reference", rd)
    st = _state(rd)
    if record == "stage_base.json":             # the runner reads it when the state does not hold the base probe yet
        st["base_probe"] = None
        (rd / "state.json").write_text(json.dumps(st))
    f = rd / record
    f.write_text(f.read_text()[: len(f.read_text()) // 2])
    if record == "probe_0.json":
        from pixrl.pix.campaign import load_state, probe_points
        from pixrl.core import CorruptRecord
        with pytest.raises(CorruptRecord, match=str(f)):
            probe_points(load_state(rd), rd)
        return
    r = subprocess.run(_cmd(tmp_path / "runs", "reference"), env=world["env"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert str(f) in r.stderr and "not valid JSON" in r.stderr, r.stderr[-2000:]
