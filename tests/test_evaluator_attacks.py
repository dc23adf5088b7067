"""Attack suite for pixrl.pix.evaluator: hostile programs through the full gate + sandbox path, and
the sandbox layer on its own (un-gated, real builtins) so that rlimits, uid drop, chroot,
timeouts and output caps are proven rather than assumed.

Every attack must end in a clear non-OK status; afterwards no file exists that an attack tried to
create, no worker process survives, and the evaluator still scores a normal program correctly."""
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from pixrl.pix import evaluator as ev
from pixrl.pix import geometry, sandbox, tasks, worker
from pixrl.pix.evaluator import Limits, Status

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
    ("memory-bomb-str", "s = 'ab' * 10**10", {"SOURCE_REJECTED"}),        # round 3: a program holds no string
    ("memory-bomb-tuple", "x = (0, 1) * 10**10", {"RESOURCE_LIMIT"}),
    ("memory-bomb-grow", "x = [0]\nwhile True:\n    x = x + x", {"RESOURCE_LIMIT", "TIMEOUT"}),
    ("bigint-cpu", "x = 10 ** 10 ** 9", {"TIMEOUT", "RESOURCE_LIMIT"}),
    ("infinite-loop", "while True:\n    pass", {"TIMEOUT"}),
    ("deep-recursion", "def f(n):\n    return f(n + 1)\nf(0)", {"RESOURCE_LIMIT"}),
    ("million-shapes", "for i in range(10**7):\n    rect(0, 0, 1, 1)", {"RESOURCE_LIMIT"}),
    ("million-vertices", "polygon([(1, 2), (3, 4), (5, 1)] * 10**6)", {"RESOURCE_LIMIT"}),
    ("nan-coordinate", "rect(0, 0, 1e308 * 10 - 1e308 * 10, 10)", {"RUNTIME_ERROR"}),   # inf - inf
    ("inf-coordinate", "circle(50, 40, 1e308 * 10)", {"RUNTIME_ERROR"}),
    ("1e300-coordinate", "rect(1e300, 0, 10, 10)", {"RUNTIME_ERROR"}),
    ("huge-int-coordinate", "rect(10**400, 0, 10, 10)", {"RUNTIME_ERROR"}),
    ("type-confusion", "rect([1], 0, 1, 1)", {"RUNTIME_ERROR"}),
    ("slow-legal-at-limit", "x = 0\nfor i in range(10**9):\n    x = x + i\nrect(0, 0, 10, 10)", {"TIMEOUT"}),
    # red-team round 2: caps and bounds must see what is drawn, whatever iterable it came from
    ("zip-past-coordinate-bound", "polygon(zip([0, 5e8, 0], [0, 0, 5e8]))", {"RUNTIME_ERROR"}),
    ("range-point-past-bound", "polygon([range(10**8, 10**8 + 2), (0, 0), (0, 5)])", {"RUNTIME_ERROR"}),
    ("generator-vertices", "for k in range(3):\n    polygon((i % 50, i % 7) for i in range(100000))", {"RESOURCE_LIMIT"}),
    ("list-vertices-past-cap", "for k in range(2):\n    polygon([(i % 50, i % 7) for i in range(12000)])", {"RESOURCE_LIMIT"}),
    ("cut-spam", "c = circle(1, 1, 1)\nfor i in range(10**6):\n    cut(c)", {"RESOURCE_LIMIT"}),
    # ... reasons must not leak addresses or internal names, and stay short
    ("repr-leak-function", "assert False, rect", {"RUNTIME_ERROR"}),
    ("repr-leak-lambda", "assert False, (lambda: 0)", {"RUNTIME_ERROR"}),
    ("long-reason", "assert False, [1] * 10**5", {"RUNTIME_ERROR"}),
    ("long-name-reason", "x = " + "a" * 5000, {"SOURCE_REJECTED"}),
    # ... NFKC-confusable identifiers are the names they normalise to; lone surrogates are not text
    ("fullwidth-open", "\uff4f\uff50\uff45\uff4e('/tmp/%s', 'w').write('x')" % MARK, {"SOURCE_REJECTED"}),
    ("fullwidth-dunder", "x = ().\uff3f\uff3fclass\uff3f\uff3f", {"SOURCE_REJECTED"}),
    ("lone-surrogate", "s = '\ud800'\nrect(0, 0, 1, 1)", {"SOURCE_REJECTED"}),
]


@pytest.fixture(scope="module")
def attack_results():
    for p in TARGETS:
        assert not p.exists()
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
    assert_clean_reason(r.reason)


def assert_clean_reason(reason):
    "Reasons are short and name no memory address or evaluator internal."
    assert len(reason) <= 300, (len(reason), reason[:80])
    assert not re.search(r"0x[0-9a-fA-F]{4,}|<locals>|_sandbox|pixrl\.|__counts__", reason), reason


def test_gate_rejections_never_run(attack_results):
    "Gate rejections (parent pre-checks or the gate in the worker) never execute: nothing was drawn."
    gated = [r for r, (_, _, acc) in zip(attack_results, ATTACKS) if acc == {"SOURCE_REJECTED"}]
    assert len(gated) >= 25 and all(r.n_shapes == 0 and r.mask is None for r in gated)
    assert ev.check_source(ATTACKS[0][1]) is not None      # the same verdicts from the public gate
    assert all(ev.check_source(src) is not None for _, src, acc in ATTACKS if acc == {"SOURCE_REJECTED"})


def test_gate_verdict_is_the_same_everywhere(attack_results):
    "Whatever check_source rejects, evaluate rejects with the same reason (and nothing else is rejected)."
    for (name, src, _), r in zip(ATTACKS, attack_results):
        reason = ev.check_source(src, limits=LIM)
        assert (reason is not None) == (r.status == Status.SOURCE_REJECTED), (name, reason, r.status, r.reason)
        if reason is not None:
            assert r.reason == reason, (name, reason, r.reason)


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
    st, n, reason, mask = sandbox._sandbox_run_ungated(src, limits=LIM)
    status = "EMPTY" if st == Status.OK and (mask is None or not mask.any()) else st.value
    assert status in accepted, (name, st, reason)


def test_sandbox_env_is_scrubbed():
    "Workers do not inherit the trainer's environment (tokens, keys)."
    os.environ["PIXRL_ATTACK_SECRET"] = "x"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "y"
    try:
        ev.shutdown_servers()   # the next server starts with the variables set in its parent
        src = "import os\nif 'AWS_SECRET_ACCESS_KEY' not in os.environ:\n    rect(0, 0, 10, 10)"
        st, _, reason, mask = sandbox._sandbox_run_ungated(src, limits=LIM)
        assert st == Status.OK and mask.any(), reason
    finally:
        del os.environ["AWS_SECRET_ACCESS_KEY"], os.environ["PIXRL_ATTACK_SECRET"]
        ev.shutdown_servers()


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop that protects the server needs root")
def test_sandbox_cannot_kill_server():
    pid_before = ev.server_stats()["server_pid"]
    st, _, reason, _ = sandbox._sandbox_run_ungated("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", limits=LIM)
    assert st == Status.RUNTIME_ERROR and "Permission" in reason, reason
    assert ev.server_stats()["server_pid"] == pid_before


def test_server_death_is_infra_fault_then_recovers():
    "Killing the fork server from outside is an infrastructure fault: retried on a fresh server."
    srv = sandbox._server(False)
    srv.proc.kill()
    srv.proc.wait()
    r = ev.evaluate(TASK, TASK.program, limits=LIM)
    assert r.ok and r.iou == 1.0


def test_persistent_infra_fault_raises(monkeypatch):
    "A fault that survives the retries raises EvaluatorInfraError — never a silent zero."
    def broken(self, *a, **k):
        raise OSError("simulated broken pipe")
    monkeypatch.setattr(sandbox._ForkServer, "run", broken)
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
            if ppid == server_pid:
                out.append(int(d.name))
    return out


def test_aftermath(attack_results):
    "No file was created, no worker survives, and a normal program still scores correctly."
    for p in TARGETS:
        assert not p.exists(), p
    server_pid = ev.server_stats()["server_pid"]
    deadline = time.monotonic() + 5
    while _worker_pids(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
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
    while _worker_pids(server_pid) and time.monotonic() < deadline:
        time.sleep(0.01)   # earlier workers gone
    infra_before = ev.server_stats().get("infra", 0)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", ev.evaluate(TASK, slow, limits=Limits(timeout_s=20.0))))
    th.start()
    deadline, killed = time.monotonic() + 10, None
    while killed is None and time.monotonic() < deadline:
        pids = _worker_pids(server_pid)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        else:
            time.sleep(0.005)
    th.join(60)
    assert killed is not None
    assert out["r"].ok, out["r"]
    assert ev.server_stats().get("infra", 0) == infra_before + 1


# ---- red-team round 2: the svg parser, batch independence, honest non-ASCII programs ---------
SVG_HEAD = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 80">'
DIGITS = "1" * 19880
SVG_ATTACKS = [   # (name, source, accepted statuses) through evaluate_many, representation "svg"
    ("redos-rect-number", SVG_HEAD + f'<rect x="{DIGITS}x" y="0" width="1" height="1"/></svg>', {"SOURCE_REJECTED"}),
    ("redos-points", SVG_HEAD + f'<polygon points="0,0 {DIGITS}x 5,5"/></svg>', {"SOURCE_REJECTED"}),
    ("lone-surrogate-attribute", SVG_HEAD + '<rect x="1" y="1" width="9" height="9" id="\ud800"/></svg>', {"SOURCE_REJECTED"}),
    ("lone-surrogate-text", SVG_HEAD + '<rect x="1" y="1" width="9" height="9"/>\udfff</svg>', {"SOURCE_REJECTED"}),
    ("inf-in-points", SVG_HEAD + '<polygon points="0,0 1e999,0 0,10"/></svg>', {"SOURCE_REJECTED"}),
    ("relative-path-overflow", SVG_HEAD + '<path d="M 0 0 l 1e308 0 l 1e308 0" stroke-width="1"/></svg>', {"SOURCE_REJECTED"}),
    ("y-minus-h-overflow", SVG_HEAD + '<rect x="0" y="1.7e308" width="1" height="1.7e308"/></svg>', {"SOURCE_REJECTED"}),
    ("past-coordinate-bound", SVG_HEAD + '<circle cx="5e8" cy="0" r="1"/></svg>', {"SOURCE_REJECTED"}),
    ("negative-size", SVG_HEAD + '<rect x="0" y="0" width="-5" height="5"/></svg>', {"SOURCE_REJECTED"}),
]


@pytest.fixture(scope="module")
def svg_attack_results():
    return ev.evaluate_many([(TASK, src, "svg") for _, src, _ in SVG_ATTACKS], workers=2, limits=LIM)


@pytest.mark.parametrize("k", range(len(SVG_ATTACKS)), ids=[a[0] for a in SVG_ATTACKS])
def test_svg_attack_is_stopped_with_the_parser_verdict(svg_attack_results, k):
    name, src, accepted = SVG_ATTACKS[k]
    r = svg_attack_results[k]
    assert r.status.value in accepted, (name, r.status, r.reason)
    assert_clean_reason(r.reason)
    assert ev.check_source(src, "svg", limits=LIM) == r.reason, name   # one verdict per source


def test_svg_parser_is_linear_time():
    "A 19,880-digit number costs the parent microseconds, not seconds (no backtracking regex)."
    t0 = time.monotonic()
    reason = ev.check_source(SVG_ATTACKS[0][1], "svg")
    assert time.monotonic() - t0 < 0.5 and reason is not None and len(reason) <= 300, reason[:80]
    t0 = time.monotonic()
    res = ev.evaluate_many([(TASK, src, "svg") for _, src, _ in SVG_ATTACKS[:2]] * 4, workers=2, limits=LIM)
    assert time.monotonic() - t0 < 1.0
    assert all(r.status == Status.SOURCE_REJECTED for r in res)


def test_svg_accepted_means_executed():
    "What the svg parser accepts runs (however long its py translation); what it refuses, evaluate refuses alike."
    many = " ".join(f"{i % 10},{i // 10 % 10}" for i in range(4400))                 # 4,400 vertices
    hops = "M 0 0" + " h 0.01 v 0.01" * 1400                                           # 2,801 vertices
    srcs = [SVG_HEAD + f'<polygon points="{many}"/></svg>', SVG_HEAD + f'<path d="{hops}" stroke-width="1"/></svg>',
            SVG_HEAD + '<rect x="1e-300" y="0" width="1e6" height="1"/></svg>']
    res = ev.evaluate_many([(TASK, s, "svg") for s in srcs], workers=2, limits=LIM)
    for src, r in zip(srcs, res):
        assert len(src) <= 20000 and ev.check_source(src, "svg") is None
        assert r.status in (Status.OK, Status.EMPTY), (r.status, r.reason)


def test_lone_surrogates_are_statuses():
    "Any text a model can emit is a status, never an exception that loses the batch's rewards."
    from pixrl.pix import reward as rw
    good_svg = SVG_HEAD + '<rect x="10" y="20" width="15" height="50"/></svg>'
    bad = [SVG_HEAD + '<rect x="1" y="1" width="9" height="9" id="\ud800"/></svg>', SVG_HEAD + "\udc80</svg>"]
    for src in bad:
        assert "surrogate" in ev.check_source(src, "svg")
    assert "surrogate" in ev.check_source("x = 1  # \ud800")
    res = ev.evaluate_many([(TASK, bad[0], "svg"), (TASK, good_svg, "svg"), (TASK, "x = 1  # \ud800"),
                            (TASK, "rect(10, 10, 15, 50)")], workers=2, limits=LIM)
    assert [r.status for r in res] == [Status.SOURCE_REJECTED, Status.OK] * 2, [(r.status, r.reason) for r in res]
    fn = rw.make_reward_fn({"fixture": TASK})
    out = fn(prompts=["p"] * 2, completions=[bad[1], good_svg], task_id=["fixture"] * 2, representation=["svg"] * 2)
    assert out[0] == 0.0 and out[1] > 0.0


def test_non_ascii_identifiers_are_honest_python():
    "Python NFKC-normalises identifiers: `θ` is a name, fullwidth `ｏｐｅｎ` IS `open`; evaluate agrees with check_source."
    theta = "\u03b8 = 0.5\nrect(10, 10, 15 + sin(\u03b8) - sin(\u03b8), 50)"
    wide_rect = "\uff52\uff45\uff43\uff54(10, 10, 15, 50)"                            # ｒｅｃｔ -> rect
    confusables = ["\uff4f\uff50\uff45\uff4e('x.txt', 'w')", "\uff45\uff58\uff45\uff43('1')",
                   "x = \uff47\uff4c\uff4f\uff42\uff41\uff4c\uff53()", "x = [].\uff3f\uff3fclass\uff3f\uff3f"]
    res = ev.evaluate_many([(TASK, s) for s in [theta, wide_rect] + confusables], workers=2, limits=LIM)
    assert ev.check_source(theta) is None and ev.check_source(wide_rect) is None
    assert res[0].ok and res[1].ok, (res[0].reason, res[1].reason)
    for src, r in zip(confusables, res[2:]):
        reason = ev.check_source(src)
        assert reason is not None and r.status == Status.SOURCE_REJECTED and r.reason == reason, (src, r.reason, reason)


def test_caps_count_what_is_drawn():
    "Vertex and call caps count drawn points and cut() calls, from lists, generators or zip alike."
    lim = Limits(timeout_s=2.0, max_points=100, max_shapes=10)
    pts = "[(i % 7, i % 5) for i in range({})]"
    cases = [(f"polygon({pts.format(60)})\npolygon({pts.format(40)})", Status.OK),
             (f"polygon({pts.format(60)})\npolygon({pts.format(41)})", Status.RESOURCE_LIMIT),
             ("polygon((i % 7, i % 5) for i in range(101))", Status.RESOURCE_LIMIT),
             ("polygon(zip(range(101), [0, 5] * 60))", Status.RESOURCE_LIMIT),
             (f"path({pts.format(50)}, 1)\npolygon({pts.format(51)})", Status.RESOURCE_LIMIT),
             ("c = rect(0, 0, 50, 50)\nfor i in range(4):\n    rect(i, 0, 1, 1)\nfor i in range(5):\n    cut(c)", Status.EMPTY),
             ("c = rect(0, 0, 50, 50)\nfor i in range(4):\n    rect(i, 0, 1, 1)\nfor i in range(6):\n    cut(c)", Status.RESOURCE_LIMIT)]
    res = ev.evaluate_many([(TASK, src) for src, _ in cases], workers=2, limits=lim)
    assert [r.status for r in res] == [want for _, want in cases], [(r.status, r.reason) for r in res]


# a worker-side probe (un-gated, real builtins): the most MiB one bytearray can take right now
BUDGET_PROBE = """lo, hi = 0, 1 << 14
while hi - lo > 1:
    mid = (lo + hi) // 2
    try:
        b = bytearray(mid << 20)
        del b
        lo = mid
    except MemoryError:
        hi = mid
raise ValueError(f'budget {lo} MB')
"""


def memory_budget_mb(limits):
    st, _, reason, _ = sandbox._sandbox_run_ungated(BUDGET_PROBE, limits=limits)
    assert reason.startswith("ValueError: budget"), reason
    return int(reason.split()[2])


def test_no_state_leaks_between_candidates():
    "A program that keeps memory alive through a reference cycle does not zero the honest ones after it."
    lim = Limits(timeout_s=5.0, memory_mb=128)
    hog_mb = memory_budget_mb(lim) - 2                                   # just below its limit
    honest = "x = 0\n" + "x = x + 1\n" * 1900 + "rect(10, 10, 15, 50)\n"    # needs a few MB to parse
    hogs = [f"def f():\n    return 1\nx = [0] * ({hog_mb} * 2**17)\n",       # fn.__globals__ <-> namespace
            f"x = [[0] * ({hog_mb} * 2**17)]\nx.append(x)\n"]                   # a plain list cycle
    task = FixtureTask("rect(10, 10, 15, 50)")
    for hog in hogs:
        res = ev.evaluate_many([(task, hog)] + [(task, honest + f"# {i}") for i in range(3)], workers=1, limits=lim)
        assert res[0].status == Status.EMPTY, res[0].reason
        assert all(r.ok and r.iou == 1.0 for r in res[1:]), [(r.status, r.reason) for r in res[1:]]


def test_memory_budget_does_not_depend_on_the_batch():
    "The address space a candidate gets is the same after a large batch grew the fork server."
    lim = Limits(timeout_s=5.0, memory_mb=128)
    ev.shutdown_servers()
    fresh = memory_budget_mb(lim)
    slow = [(TASK, "while True:\n    pass")] * 2                # hold both workers while the queue fills
    big = [(TASK, f"# {i} " + "x" * 19980) for i in range(800)]
    ev.evaluate_many(slow + big, workers=2, limits=Limits(timeout_s=1.0), dedupe=False)
    after = memory_budget_mb(lim)
    assert fresh >= lim.memory_mb - 2 and after >= fresh - 1, (fresh, after)


def test_worker_exit_after_other_jobs_is_rerun_alone():
    "A worker that ends without a record after other jobs ran in it may have inherited their state: re-run alone."
    ok, exits = "rect(0, 0, 10, 10)", "import os\nos._exit(3)"
    before = ev.server_stats().get("rerun_solo", 0)
    res = sandbox.run_sandboxed([(ok, (100.0, 80.0), (32, 32), LIM), (exits, (100.0, 80.0), (32, 32), LIM)],
                            workers=1, batch=8, _ungated=True)
    assert res[0][0] == Status.OK and res[1][0] == Status.RUNTIME_ERROR and "code 3" in res[1][2], res
    assert ev.server_stats().get("rerun_solo", 0) == before + 1          # the verdict came from a fresh worker


def test_memory_error_in_the_gate_is_a_resource_limit(monkeypatch):
    "A MemoryError while parsing is a limit hit (re-run alone when it follows other jobs), never SOURCE_REJECTED."
    def no_memory(source, limits):
        raise MemoryError()
    monkeypatch.setattr(worker, "gate_compile", no_memory)
    st, n, reason, mask = worker.execute("rect(0, 0, 1, 1)", (10.0, 10.0), (16, 16), LIM)    # in-process
    assert st == Status.RESOURCE_LIMIT and "MemoryError" in reason and mask is None


def test_deep_nesting_has_one_verdict():
    "The gate's depth budget is the same in the worker as in a caller's check_source (not the worker's 400)."
    srcs = ["x = " + "-" * n + "1\nrect(10, 10, 15, 50)" for n in (500, 1500)] + ["x = 1" + " + 1" * 3000]
    res = ev.evaluate_many([(TASK, s) for s in srcs], workers=2, limits=LIM)
    assert res[0].ok and ev.check_source(srcs[0]) is None, res[0].reason
    for src, r in zip(srcs[1:], res[1:]):
        assert r.status == Status.SOURCE_REJECTED and r.reason == ev.check_source(src), (r.reason, ev.check_source(src))


# ---- red-team round 3: the reward is a function of (task, program) -------------------------
# A heap address (what `'%r' % (rect,)` shows) depends on what ran before in the worker; a program that
# branched on it drew 4-6 masks from 8 copies of itself. Each probe below reads something that could
# follow addresses, ids, hashes or set order and draws from it: it must be rejected, or render the same
# wherever it runs. The gate's choice (03b_gate): a program holds no string value at all.
FROM_S = "\nrect(10, 10, 5 + int(s[-4:-1], 16) % 60, 20)\n"        # the last hex digits of an address
FROM_K = "\nrect(10, 10, 5 + k % 60, 20)\n"
FNS = "fs = [rect, circle, ring, polygon, path, cut]\n"
ADDRESS_PROBES = [   # (name, source, must be rejected)
    ("pct-r-function", "s = '%r' % (rect,)" + FROM_S, True),
    ("pct-r-lambda", "s = '%r' % ((lambda: 0),)" + FROM_S, True),
    ("pct-r-generator", "s = '%r' % ((x for x in range(1)),)" + FROM_S, True),
    ("pct-r-zip", "s = '%r' % (zip(),)" + FROM_S, True),
    ("pct-s-bare", "s = '%s' % rect" + FROM_S, True),
    ("pct-via-name", "fmt = '%r'\ns = fmt % (rect,)" + FROM_S, True),
    ("pct-augassign", "s = '%r'\ns %= (rect,)" + FROM_S, True),
    ("pct-in-function", "def f(t):\n    return '%r' % (t,)\ns = f(rect)" + FROM_S, True),
    ("pct-in-assert", "assert len('%r' % (rect,)) % 2, 'odd'\nrect(10, 10, 5, 20)", True),
    ("format-method", "s = '{}'.format(rect)" + FROM_S, True),
    ("fstring-r", "s = f'{rect!r}'" + FROM_S, True),
    ("str", "s = str(rect)" + FROM_S, True),
    ("repr", "s = repr(rect)" + FROM_S, True),
    ("ascii", "s = ascii(rect)" + FROM_S, True),
    ("format", "s = format(rect, '')" + FROM_S, True),
    ("object-repr", "s = object.__repr__(rect)" + FROM_S, True),
    ("id", "k = id(rect) // 16" + FROM_K, True),
    ("hash", "k = hash(rect)" + FROM_K, True),
    ("kwargs-keys", "def f(**kw):\n    return kw\nk = len(f(a=rect))" + FROM_K, True),
    ("set-of-functions", FNS + "k = [i for i, f in enumerate({f for f in fs}) if f == rect][0] * 9" + FROM_K, True),
    ("set-literal", FNS + "k = [i for i, f in enumerate({rect, circle, ring, polygon, path}) if f == rect][0] * 9" + FROM_K, True),
    ("set-builtin", FNS + "k = [i for i, f in enumerate(set(fs)) if f == rect][0] * 9" + FROM_K, True),
    ("dict-of-functions", FNS + "k = [i for i, f in enumerate({f: 0 for f in fs}) if f == rect][0] * 9" + FROM_K, True),
    ("sorted-by-id", FNS + "k = [i for i, f in enumerate(sorted(fs, key=id)) if f == rect][0] * 9" + FROM_K, True),
    ("min-by-id", FNS + "k = fs.index(min(fs, key=id)) * 9" + FROM_K, True),
    ("type-vars-dir", "k = len(dir(rect)) + len(vars()) + len(type(rect).__name__)" + FROM_K, True),
    # what stays legal is deterministic: identity comparisons, and an address only in a (scrubbed) reason
    ("identity-index", FNS + "k = fs.index(circle) * 9 + (rect == rect) + (rect in fs)" + FROM_K, False),
    ("assert-repr-reason", "rect(10, 10, 5, 20)\nassert False, (rect, (lambda: 0), zip(), (x for x in []))", False),
]
HONEST = ["for i in range(3):\n    rect(10 + 30 * i, 10, 15, 50)\ncut(circle(17, 35, 4))\n",
          "x = [[0] * 1000 for i in range(300)]\nf = lambda: x\ncircle(50, 40, 20)\n",   # grows the heap, keeps a cycle
          "g = (i for i in range(10))\npolygon([(0, 0), (60, 0), (30, 50)])\n"]


def _outcome(r):
    return (r.status, r.reason, r.n_shapes, None if r.mask is None else geometry.mask_sha256(r.mask))


@pytest.fixture(scope="module")
def address_runs():
    "Batch 1: 8 copies of every probe, interleaved with honest programs, 2 workers. Batch 2: another history."
    first = []
    for c in range(8):
        for k, (_, src, _) in enumerate(ADDRESS_PROBES):
            first.append((TASK, src))
            first.append((TASK, HONEST[(c + k) % 3] + f"# {c} {k}\n"))    # every honest copy a distinct source
    res1 = ev.evaluate_many(first, workers=2, limits=LIM, dedupe=False)
    second = [(TASK, HONEST[1] + "# warm\n")] * 5 + [(TASK, src) for _, src, _ in reversed(ADDRESS_PROBES)] * 2
    res2 = ev.evaluate_many(second, workers=1, limits=LIM, dedupe=False)[5:]
    n = len(ADDRESS_PROBES)
    return {name: [res1[2 * (c * n + k)] for c in range(8)] + [res2[n - 1 - k], res2[2 * n - 1 - k]]
            for k, (name, _, _) in enumerate(ADDRESS_PROBES)}


@pytest.mark.parametrize("k", range(len(ADDRESS_PROBES)), ids=[p[0] for p in ADDRESS_PROBES])
def test_result_is_a_function_of_task_and_program(address_runs, k):
    "The same source gives the same result in every position of a batch and in another worker history."
    name, src, rejected = ADDRESS_PROBES[k]
    runs = address_runs[name]
    outcomes = {_outcome(r) for r in runs}
    assert len(outcomes) == 1, (name, sorted(outcomes, key=str))
    r = runs[0]
    assert (r.status == Status.SOURCE_REJECTED) == rejected, (name, r.status, r.reason)
    assert r.status in (Status.SOURCE_REJECTED, Status.OK, Status.RUNTIME_ERROR), (name, r.status, r.reason)
    assert_clean_reason(r.reason)
    if rejected:
        assert ev.check_source(src) == r.reason, name


def test_honest_programs_around_the_probes_score_right(address_runs):
    res = ev.evaluate_many([(TASK, src) for src in HONEST], workers=2, limits=LIM)
    assert res[0].ok and res[0].iou == 1.0 and all(r.ok for r in res), [(r.status, r.reason) for r in res]


def test_strings_only_where_nothing_reads_them():
    "A docstring and an assert message are text nothing can read; every other string is refused."
    ok = ['"""Three pads."""\nfor i in range(3):\n    rect(10 + 30 * i, 10, 15, 50)',
          'def pad(i):\n    "one pad"\n    return rect(10 + 30 * i, 10, 15, 50)\nassert pad(0), "drew nothing"']
    for src in ok:
        assert ev.check_source(src) is None, src
    bad = ["x = 'a'", "rect(0, 0, 1, len('abcd'))", "x = ['a'][0]", "x = float('inf')", "def f(s='x'):\n    return s",
           "x = (lambda: 'a')()", "assert 'a', 'b' * 2", "x = [c for c in 'abc']", "x = 'a' if 1 else 'b'"]
    for src in bad:
        reason = ev.check_source(src)
        assert reason is not None and "string" in reason, (src, reason)


def test_no_ground_truth_or_band_program_is_rejected():
    "The drawing language needs no text: every committed task program and band program of every split passes the gate."
    from pixrl.pix.base import band_program
    n = 0
    for split in ("train", "validation", "test"):
        for task in tasks.load_split(split):
            for src in (task.program, band_program(task)):
                assert ev.check_source(src, limits=Limits(timeout_s=5.0)) is None, (split, task.id, ev.check_source(src))
                n += 1
    assert n >= 5000


# ---- red-team round 3: the vertex cap is re-entrant ---------------------------------------
def _nested(kind: str, depth: int, n: int) -> str:
    "A `kind` whose points generator draws another `kind` (depth levels below it) before its first point."
    w = ", 1" if kind == "path" else ""
    return (f"def pts(d):\n    return ((i % 50, i % 7) if i or d == 0 or {kind}(pts(d - 1){w}) else 0 "
            f"for i in range({n}))\n{kind}(pts({depth}){w})\n")


def _drawn_vertices(src: str, limits: Limits) -> tuple:
    "(vertices in the scene, cap hit?) of `src` run in-process against the gate and the worker's budget."
    reason, code = worker.gate_compile(src, limits)
    assert reason is None, reason
    scene = geometry.Scene()
    ns = worker._sandbox_namespace(scene, worker._DrawBudget(limits))
    try:
        exec(code, ns)
        hit = False
    except worker._ShapeCap:
        hit = True
    shapes = {id(s): s for _, s in scene.ops if s.kind in ("polygon", "path")}
    return sum(len(s.args[0]) for s in shapes.values()), hit


def test_nested_generators_hit_the_vertex_cap():
    "Six polygons (or paths) nested in each other's point generators: 6 x 19,000 vertices against 20,000."
    srcs = [_nested("polygon", 5, 19000), _nested("path", 5, 19000),
            "def pts(d):\n    return ((i % 50, i % 7) if i or d == 0 or path(pts(d - 1), 1) else 0 for i in range(19000))\n"
            "polygon(pts(1))\n"]
    res = ev.evaluate_many([(TASK, s) for s in srcs], workers=2, limits=LIM)
    assert [r.status for r in res] == [Status.RESOURCE_LIMIT] * 3, [(r.status, r.reason) for r in res]
    assert all("vertices" in r.reason for r in res), [r.reason for r in res]


def test_vertices_drawn_never_pass_the_cap():
    "Whatever re-enters the budget (generators of points, generator elements, keyword points), the total drawn stays <= max_points."
    lim = Limits(timeout_s=2.0, max_points=100, max_shapes=50)
    cases = [(_nested(kind, depth, n), (depth + 1) * n) for kind in ("polygon", "path")
             for depth in (0, 1, 2, 4) for n in (19, 20, 33, 50, 99)]
    cases += [("polygon([(0, 0), (1, 0), (x for x in (polygon([(0, 1)] * 98) and 1, 1))])", 101),
              ("polygon([(0, 0), (1, 0), (x for x in (polygon([(0, 1)] * 97) and 1, 1))])", 100),
              ("polygon(points=((i, i % 3) if i or path([(0, 0)] * 90, 1) else 0 for i in range(11)))", 101),
              ("polygon(zip(range(50), [path([(0, 0)] * 51, 1) and 1] * 50))", 101)]
    for src, need in cases:
        drawn, hit = _drawn_vertices(src, lim)
        assert drawn <= lim.max_points, (src, drawn)
        assert hit == (need > lim.max_points), (src, need, drawn, hit)
    res = ev.evaluate_many([(TASK, src) for src, _ in cases[:10]], workers=2, limits=lim)
    for (src, need), r in zip(cases, res):
        assert (r.status == Status.RESOURCE_LIMIT) == (need > lim.max_points), (src, r.status, r.reason)


# ---- red-team round 3: parent-side text handling is linear and bounded ----------------------
REASON_FAMILIES = {   # adversarial reason texts (what a candidate can make the parent clean)
    "word-run": lambda n: "SVG element <" + "a" * n + "> not allowed",
    "dotted-run": lambda n: "x" + "a." * (n // 2) + "<locals",
    "many-locals": lambda n: "a<locals>." * (n // 10),
    "near-address": lambda n: " at 0x" * (n // 6),
    "hex-runs": lambda n: "0x123 " * (n // 6),
    "long-address": lambda n: " at 0x" + "f" * n,
    "unicode-word": lambda n: "\u00e9" * n + "<locals>",
}


@pytest.mark.parametrize("family", list(REASON_FAMILIES))
def test_clean_reason_is_bounded(family, best_time):
    "clean_reason on 10^5 adversarial characters costs about what it costs on 10^3 (quadratic would be ~10^4 x)."
    make = REASON_FAMILIES[family]
    small, big = best_time(ev.clean_reason, make(10**3)), best_time(ev.clean_reason, make(10**5))
    assert big < 30 * small + 2e-4, (family, small, big)
    assert len(ev.clean_reason(make(10**5))) <= 300


SVG_NAME_ATTACKS = {   # n -> an SVG whose hostile part is n characters long
    "element-name": lambda n: SVG_HEAD + "<" + "a" * n + "/></svg>",
    "attribute-name": lambda n: SVG_HEAD + '<rect ' + "b" * n + '="1"/></svg>',
    "many-attributes": lambda n: SVG_HEAD + "<rect " + " ".join(f"a{i}=\"1\"" for i in range(n // 8)) + "/></svg>",
    "dotted-element": lambda n: SVG_HEAD + "<" + "a." * (n // 2) + "/></svg>",
    "nested-groups": lambda n: SVG_HEAD + "<g>" * (n // 3) + '<rect x="1" y="1" width="2" height="2"/>' + "</g>" * (n // 3) + "</svg>",
}
BIG = Limits(timeout_s=2.0, max_source_chars=10**6, max_shapes=10**6)


@pytest.mark.parametrize("attack", list(SVG_NAME_ATTACKS))
def test_svg_text_handling_is_linear(attack, best_time):
    "The parent's svg path (parser, its messages, clean_reason) on a 10^5-character hostile part: linear, not quadratic."
    make = SVG_NAME_ATTACKS[attack]
    check = lambda src: ev.check_source(src, "svg", limits=BIG)
    small, big = best_time(check, make(10**4), 7), best_time(check, make(10**5), 7)
    assert big < 40 * small + 2e-3, (attack, small, big)    # linear: ~10x (33x seen on a loaded machine); quadratic: ~100x
    assert big < 0.25, (attack, big)
    reason = check(make(10**5))
    assert reason is None or len(reason) <= 300


def test_long_svg_names_cost_the_caller_nothing():
    "8 SVG candidates with a 10^5- (or, within the default limits, 19,900-) character element name: well under 1 s in the caller."
    big = [SVG_NAME_ATTACKS["element-name"](10**5), SVG_NAME_ATTACKS["attribute-name"](10**5)] * 4
    t0 = time.perf_counter()
    res = ev.evaluate_many([(TASK, src, "svg") for src in big], workers=2, limits=BIG)
    assert time.perf_counter() - t0 < 0.5
    assert all(r.status == Status.SOURCE_REJECTED and len(r.reason) <= 300 for r in res), [r.reason[:80] for r in res]
    assert res[0].reason.startswith("SVG element <aaaa") and "allowed: svg, g, rect" in res[0].reason, res[0].reason
    near = [SVG_NAME_ATTACKS["element-name"](19900), SVG_NAME_ATTACKS["attribute-name"](19900)] * 4
    t0 = time.perf_counter()
    res = ev.evaluate_many([(TASK, src, "svg") for src in near], workers=2, limits=LIM)
    assert time.perf_counter() - t0 < 0.5
    assert all(r.status == Status.SOURCE_REJECTED for r in res)


def test_long_identifier_costs_the_caller_nothing():
    "check_source (the parent's gate) on a program with a 19,990-character unknown name."
    src = "x = " + "a" * 19990
    t0 = time.perf_counter()
    reason = ev.check_source(src)
    assert time.perf_counter() - t0 < 0.2 and reason.startswith("unknown name 'aaaa") and len(reason) <= 300
