"""Attack suite for pixrl.evaluator: hostile programs through the full gate + sandbox path, and
the sandbox layer on its own (un-gated, real builtins) so that rlimits, uid drop, chroot,
timeouts and output caps are proven rather than assumed.

Every attack must end in a clear non-OK status; afterwards no file exists that an attack tried to
create, no worker process survives, and the evaluator still scores a normal program correctly."""
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from pixrl import evaluator as ev
from pixrl import geometry, tasks
from pixrl.evaluator import Limits, Status

LIM = Limits(timeout_s=2.0)            # short wall timeout keeps the suite fast (2 s: margin on a loaded box)
MARK = f"pixrl_attack_{os.getpid()}"   # every file/dir an attack tries to create carries this tag
TARGETS = [Path("/tmp") / MARK, Path.cwd() / MARK, Path.home() / MARK, Path("/tmp") / (MARK + "_dir")]


class FixtureTask:
    "A minimal Task: what the evaluator reads (id, footprint_um, target_mask, target_image_sha256)."
    def __init__(self, program, footprint_um=(100.0, 80.0)):
        self.id, self.program, self.footprint_um = "fixture", program, footprint_um
        self.target_mask = geometry.render(program, footprint_um, tasks.CAL_SHAPE)
        self.target_image_sha256 = geometry.mask_sha256(self.target_mask)


TASK = FixtureTask("for i in range(3):\n    rect(10 + 30 * i, 10, 15, 50)\ncut(circle(17, 35, 4))\n")

# (name, source, accepted statuses) — through the gate + sandbox (the production path)
ATTACKS = [
    ("import", "import os\nos.system('touch /tmp/%s')" % MARK, {"SOURCE_REJECTED"}),
    ("from-import", "from os import system", {"SOURCE_REJECTED"}),
    ("__import__", "__import__('os').system('id')", {"SOURCE_REJECTED"}),
    ("dunder-class", "x = ().__class__", {"SOURCE_REJECTED"}),
    ("subclasses", "x = ().__class__.__bases__[0].__subclasses__()", {"SOURCE_REJECTED"}),
    ("popen-hunt", "p = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen']", {"SOURCE_REJECTED"}),
    ("func-globals", "g = rect.__globals__", {"SOURCE_REJECTED"}),
    ("code-object", "c = (lambda: 0).__code__", {"SOURCE_REJECTED"}),
    ("generator-frame", "f = (x for x in range(1)).gi_frame", {"SOURCE_REJECTED"}),
    ("builtins-dict", "o = __builtins__['open']", {"SOURCE_REJECTED"}),
    ("open-read", "s = open('/etc/passwd').read()", {"SOURCE_REJECTED"}),
    ("open-write", "open('/tmp/%s', 'w').write('x')" % MARK, {"SOURCE_REJECTED"}),
    ("eval", "eval('1 + 1')", {"SOURCE_REJECTED"}),
    ("exec", "exec('import os')", {"SOURCE_REJECTED"}),
    ("compile", "c = compile('1', 'x', 'eval')", {"SOURCE_REJECTED"}),
    ("getattr", "g = getattr(rect, '__globals__')", {"SOURCE_REJECTED"}),
    ("globals-vars", "globals()['x'] = vars()", {"SOURCE_REJECTED"}),
    ("fstring", "s = f'{rect.__globals__}'", {"SOURCE_REJECTED"}),
    ("format-escape", "s = '{0.__globals__}'.format(rect)", {"SOURCE_REJECTED"}),
    ("attribute-store", "x = [1]\nx.append = 3", {"SOURCE_REJECTED"}),
    ("socket", "import socket\nsocket.create_connection(('10.0.0.1', 80))", {"SOURCE_REJECTED"}),
    ("fork-bomb", "import os\nwhile True:\n    os.fork()", {"SOURCE_REJECTED"}),
    ("thread-bomb", "import threading\nwhile True:\n    threading.Thread(target=len).start()", {"SOURCE_REJECTED"}),
    ("kill-parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", {"SOURCE_REJECTED"}),
    ("ctypes", "import ctypes\nctypes.CDLL(None).system(b'id')", {"SOURCE_REJECTED"}),
    ("environ", "import os\nt = os.environ.get('HOME')", {"SOURCE_REJECTED"}),
    ("try-swallow", "try:\n    rect(0, 0, 1, 1)\nexcept BaseException:\n    pass", {"SOURCE_REJECTED"}),
    ("class-def", "class A:\n    pass", {"SOURCE_REJECTED"}),
    ("print-output", "print('x' * 10**8)", {"SOURCE_REJECTED"}),
    ("nul-byte", "rect(0, 0, 1, 1)\x00", {"SOURCE_REJECTED"}),
    ("too-long", "x = 1\n" * 5000, {"SOURCE_REJECTED"}),
    ("deep-nesting", "x = " + "(" * 500 + "1" + ")" * 500, {"SOURCE_REJECTED"}),
    ("memory-bomb-list", "x = [0] * 10**10", {"RESOURCE_LIMIT"}),
    ("memory-bomb-str", "s = 'ab' * 10**10", {"RESOURCE_LIMIT"}),
    ("memory-bomb-grow", "x = [0]\nwhile True:\n    x = x + x", {"RESOURCE_LIMIT", "TIMEOUT"}),
    ("bigint-cpu", "x = 10 ** 10 ** 9", {"TIMEOUT", "RESOURCE_LIMIT"}),
    ("infinite-loop", "while True:\n    pass", {"TIMEOUT"}),
    ("deep-recursion", "def f(n):\n    return f(n + 1)\nf(0)", {"RESOURCE_LIMIT"}),
    ("million-shapes", "for i in range(10**7):\n    rect(0, 0, 1, 1)", {"RESOURCE_LIMIT"}),
    ("million-vertices", "polygon([(1, 2), (3, 4), (5, 1)] * 10**6)", {"RESOURCE_LIMIT"}),
    ("nan-coordinate", "rect(0, 0, float('nan'), 10)", {"RUNTIME_ERROR"}),
    ("inf-coordinate", "circle(50, 40, 1e308 * 10)", {"RUNTIME_ERROR"}),
    ("1e300-coordinate", "rect(1e300, 0, 10, 10)", {"RUNTIME_ERROR"}),
    ("huge-int-coordinate", "rect(10**400, 0, 10, 10)", {"RUNTIME_ERROR"}),
    ("type-confusion", "rect('a', 0, 1, 1)", {"RUNTIME_ERROR"}),
    ("slow-legal-at-limit", "x = 0\nfor i in range(10**9):\n    x = x + i\nrect(0, 0, 10, 10)", {"TIMEOUT"}),
]


@pytest.fixture(scope="module")
def attack_results():
    for p in TARGETS: assert not p.exists()
    t0 = time.monotonic()
    res = ev.evaluate_many([(TASK, src) for _, src, _ in ATTACKS], workers=2, limits=LIM)
    print(f"{len(ATTACKS)} attacks in {time.monotonic() - t0:.1f} s")
    return res


def test_attack_count():
    assert len(ATTACKS) >= 30


@pytest.mark.parametrize("k", range(len(ATTACKS)), ids=[a[0] for a in ATTACKS])
def test_attack_is_stopped(attack_results, k):
    name, src, accepted = ATTACKS[k]
    r = attack_results[k]
    assert not r.ok and r.status.value in accepted, (name, r.status, r.reason)
    assert r.reason, name                                    # a clear reason, always
    json.loads(r.to_json())                                  # strict JSON


def test_gate_rejections_never_run(attack_results):
    "Gate rejections (parent pre-checks or the gate in the worker) never execute: nothing was drawn."
    gated = [r for r, (_, _, acc) in zip(attack_results, ATTACKS) if acc == {"SOURCE_REJECTED"}]
    assert len(gated) >= 25 and all(r.n_shapes == 0 and r.mask is None for r in gated)
    assert ev.check_source(ATTACKS[0][1]) is not None      # the same verdicts from the public gate
    assert all(ev.check_source(src) is not None for _, src, acc in ATTACKS if acc == {"SOURCE_REJECTED"})


# ---- the sandbox layer on its own: no gate, the real builtins -------------------------------
UNGATED = [
    ("write-file", f"open('/tmp/{MARK}', 'w').write('pwned')", {"RUNTIME_ERROR"}),
    ("read-file", "open('/etc/hostname').read()", {"RUNTIME_ERROR"}),
    ("mkdir", f"import os\nos.mkdir('/tmp/{MARK}_dir')", {"RUNTIME_ERROR"}),
    ("fork", "import os\npid = os.fork()\nif pid == 0:\n    import time\n    time.sleep(60)", {"RUNTIME_ERROR"}),
    ("socket-ctypes", "import ctypes\nfd = ctypes.CDLL(None).socket(2, 1, 0)\nif fd < 0:\n    raise OSError('no socket')\nrect(0, 0, 10, 10)", {"RUNTIME_ERROR"}),
    ("memory", "b = bytearray(4 * 10**9)", {"RESOURCE_LIMIT"}),
    ("ignore-sigxcpu-loop", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass", {"TIMEOUT"}),
    ("output-flood", "import os\nwhile True:\n    os.write(3, b'x' * 65536)", {"RESOURCE_LIMIT", "RUNTIME_ERROR"}),
    ("oversized-record", "import os, struct\nos.write(3, struct.pack('<4sBIHHBH', b'PXR1', 0, 1, 32, 32, 1, 65535))\n"
                         "while True:\n    os.write(3, b'x' * 4096)", {"RESOURCE_LIMIT"}),
    ("malformed-record", "import os\nos.write(3, b'garbage' * 10)\nos._exit(0)", {"RUNTIME_ERROR"}),
    ("exit-silently", "import os\nos._exit(3)", {"RUNTIME_ERROR"}),
    ("segfault", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", {"RESOURCE_LIMIT"}),
    ("env-secret", "import os\nif 'PIXRL_ATTACK_SECRET' in os.environ or 'AWS_SECRET_ACCESS_KEY' in os.environ:\n    rect(0, 0, 10, 10)", {"EMPTY"}),
]


@pytest.mark.parametrize("k", range(len(UNGATED)), ids=[a[0] for a in UNGATED])
def test_sandbox_layer_contains(k):
    name, src, accepted = UNGATED[k]
    if name == "mkdir" and os.geteuid() != 0:
        pytest.skip("mkdir in a world-writable dir is stopped by the chroot, which needs root (or isolation)")
    st, n, reason, mask = ev._sandbox_run_ungated(src, limits=LIM)
    status = "EMPTY" if st == Status.OK and (mask is None or not mask.any()) else st.value
    assert status in accepted, (name, st, reason)


def test_sandbox_env_is_scrubbed():
    "Workers do not inherit the trainer's environment (tokens, keys)."
    os.environ["PIXRL_ATTACK_SECRET"] = "x"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "y"
    try:
        ev.shutdown_servers()   # the next server starts with the variables set in its parent
        src = "import os\nif 'AWS_SECRET_ACCESS_KEY' not in os.environ:\n    rect(0, 0, 10, 10)"
        st, _, reason, mask = ev._sandbox_run_ungated(src, limits=LIM)
        assert st == Status.OK and mask.any(), reason
    finally:
        del os.environ["AWS_SECRET_ACCESS_KEY"], os.environ["PIXRL_ATTACK_SECRET"]
        ev.shutdown_servers()


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop that protects the server needs root")
def test_sandbox_cannot_kill_server():
    pid_before = ev.server_stats()["server_pid"]
    st, _, reason, _ = ev._sandbox_run_ungated("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", limits=LIM)
    assert st == Status.RUNTIME_ERROR and "Permission" in reason, reason
    assert ev.server_stats()["server_pid"] == pid_before


def test_server_death_is_infra_fault_then_recovers():
    "Killing the fork server from outside is an infrastructure fault: retried on a fresh server."
    srv = ev._server(False)
    srv.proc.kill(); srv.proc.wait()
    r = ev.evaluate(TASK, TASK.program, limits=LIM)
    assert r.ok and r.iou == 1.0


def test_persistent_infra_fault_raises(monkeypatch):
    "A fault that survives the retries raises EvaluatorInfraError — never a silent zero."
    def broken(self, *a, **k): raise OSError("simulated broken pipe")
    monkeypatch.setattr(ev._ForkServer, "run", broken)
    with pytest.raises(ev.EvaluatorInfraError) as e:
        ev.evaluate_many([(TASK, TASK.program)], limits=LIM)
    assert e.value.results[0].status == Status.INFRA_FAULT
    monkeypatch.undo()
    res = ev.evaluate_many([(TASK, TASK.program)], limits=LIM, raise_on_infra=False)
    assert res[0].ok


def _worker_pids(server_pid):
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == server_pid: out.append(int(d.name))
    return out


def test_aftermath(attack_results):
    "No file was created, no worker survives, and a normal program still scores correctly."
    for p in TARGETS: assert not p.exists(), p
    server_pid = ev.server_stats()["server_pid"]
    deadline = time.monotonic() + 5
    while _worker_pids(server_pid) and time.monotonic() < deadline: time.sleep(0.05)
    assert _worker_pids(server_pid) == []
    r = ev.evaluate(TASK, TASK.program)
    assert r.ok and r.iou == 1.0 and r.chamfer_um == 0.0 and r.n_shapes == 4
    near = ev.evaluate(TASK, "for i in range(3):\n    rect(11 + 30 * i, 10, 15, 50)\n")
    assert near.ok and 0.8 < near.iou < 1.0 and near.chamfer_um > 0


def test_worker_killed_from_outside_is_retried():
    "A worker SIGKILLed by someone else (an OOM killer, an operator) is an INFRA_FAULT: re-run, not zeroed."
    import signal
    import threading
    slow = "x = 0\nfor i in range(4 * 10**6):\n    x = x + 1\nrect(0, 0, 30, 30)\n"
    server_pid = ev.server_stats()["server_pid"]
    deadline = time.monotonic() + 10
    while _worker_pids(server_pid) and time.monotonic() < deadline: time.sleep(0.01)   # earlier workers gone
    infra_before = ev.server_stats().get("infra", 0)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", ev.evaluate(TASK, slow, limits=Limits(timeout_s=20.0))))
    th.start()
    deadline, killed = time.monotonic() + 10, None
    while killed is None and time.monotonic() < deadline:
        pids = _worker_pids(server_pid)
        if pids:
            os.kill(pids[0], signal.SIGKILL); killed = pids[0]
        else:
            time.sleep(0.005)
    th.join(60)
    assert killed is not None
    assert out["r"].ok, out["r"]
    assert ev.server_stats().get("infra", 0) == infra_before + 1
