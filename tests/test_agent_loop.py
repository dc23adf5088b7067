"""After-training line: the agent loop (feedback, control flow, determinism, endpoints)."""
import json, random, threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pixrl.pix.agent_loop import (EndpointError, EndpointPolicy, LoopConfig, STATUS_FEEDBACK, feedback,
                              redact_numbers, run_agent_loop, revision_prompt)
from pixrl.pix.harvest import verify
from pixrl.pix.tasks import load_split


def _no_digit(text):
    return not any(ch.isdigit() or ch.isnumeric() for ch in text)


def test_feedback_never_contains_a_digit_random_results():
    "Property: 20k random attempt records (every status, wild reasons) give digit-free feedback."
    rng = random.Random(1234)
    alphabet = "abcXYZ _-:=.,()[]0123456789٣²½⅓e+"
    for _ in range(20_000):
        a = {"status": rng.choice(["OK"] * 5 + list(STATUS_FEEDBACK) + ["UNKNOWN_7"]),
             "iou": rng.choice([None, 0.0, 1.0, rng.random()]),
             "extra_um": rng.choice([None, 0.0, rng.random() * 1e3]),
             "missing_um": rng.choice([None, 0.0, rng.random() * 1e3]),
             "reason": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))}
        fb = feedback(a)
        assert fb and _no_digit(fb), (a, fb)


def test_feedback_never_contains_a_digit_real_results():
    "Property on real evaluator results: OK, rejected, runtime errors that quote numbers, empty drawings."
    tasks = load_split("test")[:6]
    progs = ["rect(0, 0, 1e9, 1)", "x = [1, 2, 3][7]", "rect(0, 0, 1/0, 2)", "import os", "circle(1, 1, 0)",
             "y = 12345", "for i in range(3):\n    rect(i * 2.5, 1.5, 1.25, 0.75)", "rect(0, 0, 1, 1)\nrect(0, 0, -3, 2)"]
    rows = verify(tasks, [progs + [t.program] for t in tasks])
    statuses = set()
    for row in rows:
        for a in row:
            statuses.add(a["status"])
            assert _no_digit(feedback(a)), (a, feedback(a))
    assert "OK" in statuses and len(statuses) >= 3, statuses


def test_redact_numbers_cases():
    assert redact_numbers("at line 3, x=2.50 and .5") == "at line <n>, x=<n> and .<n>"
    assert _no_digit(redact_numbers("٣٤ ² ½ 10e-3"))


def test_revision_prompt_keeps_answer_cue_last():
    p = revision_prompt("Task\nraster\nProgram:\n", "rect(0,0,1,1)", "Far.")
    assert p.endswith("Program:\n") and p.index("rect(0,0,1,1)") < p.index("Feedback: Far.") < p.index("Program:")


class RandomPolicy:
    "Scripted test double: seeded random rectangles (some invalid) — exercises the loop's control flow."
    name = "random-rects"

    def __init__(self, tasks):
        self.tasks = tasks

    def generate(self, prompts, n, temperature=1.0, max_new_tokens=256, seed=0):
        out = []
        for i, (t, p) in enumerate(zip(self.tasks, prompts)):
            rng = random.Random(f"{seed}-{i}-{len(p)}")
            w, h = t.footprint_um
            row = []
            for _ in range(n):
                if rng.random() < 0.2:
                    row.append("import os")
                else:
                    x, y = rng.random() * w * 0.5, rng.random() * h * 0.5
                    row.append(f"rect({x:.3f}, {y:.3f}, {rng.random() * w:.3f}, {rng.random() * h:.3f})")
            out.append(row)
        return out


def _strip_wall(rec):
    rec = json.loads(json.dumps(rec))
    rec.pop("wall_s", None)
    return rec


def test_loop_champion_never_decreases_and_is_deterministic():
    tasks = load_split("test")[:5]
    cfg = LoopConfig(n_init=4, n_rounds=3, n_revisions=3, seed=7)
    rec = run_agent_loop(RandomPolicy(tasks), tasks, cfg)
    for row in rec["tasks"]:
        r = row["champion_reward_by_round"]
        assert len(r) == cfg.n_rounds + 1
        assert all(b >= a for a, b in zip(r, r[1:])), r
        # the champion is the best attempt seen in any round, and it carries its code
        best = max(a["reward"] for rd in row["rounds"] for a in rd["attempts"])
        assert row["champion"]["reward"] == best and row["champion"]["code"]
        # feedback in every revision round is digit-free and the round was seeded by a champion
        for rd in row["rounds"][1:]:
            assert _no_digit(rd["feedback"]) and len(rd["attempts"]) == cfg.n_revisions
    assert _strip_wall(rec) == _strip_wall(run_agent_loop(RandomPolicy(tasks), tasks, cfg))
    json.dumps(rec, allow_nan=False)


def test_loop_all_attempts_fail_is_explicit():
    "No executable attempt: the champion keeps its status, executable False — never a silent zero champion."
    tasks = load_split("test")[:2]

    class Broken:
        def generate(self, prompts, n, **kw):
            return [["import os"] * n for _ in prompts]
    rec = run_agent_loop(Broken(), tasks, LoopConfig(n_init=2, n_rounds=1, n_revisions=1))
    for row in rec["tasks"]:
        assert row["champion"]["status"] == "SOURCE_REJECTED" and row["champion"]["executable"] is False
    assert rec["summary"]["n_executable_champions"] == 0


def test_loop_champion_without_program_gets_a_fresh_attempt():
    "An empty completion leaves the champion no program: the next round samples the task prompt again (fresh_attempt)."
    tasks = load_split("test")[:2]
    seen = []

    class Empty:
        def generate(self, prompts, n, **kw):
            seen.append(list(prompts))
            return [[""] * n for _ in prompts]
    rec = run_agent_loop(Empty(), tasks, LoopConfig(n_init=2, n_rounds=1, n_revisions=1))
    assert seen[1] == seen[0]                                   # the revision round re-sent the task prompts
    for row in rec["tasks"]:
        assert row["rounds"][1].get("fresh_attempt") is True and "Previous attempt" not in "".join(seen[1])


def test_loop_rejects_bad_policy_output():
    tasks = load_split("test")[:2]

    class Short:
        def generate(self, prompts, n, **kw):
            return [["rect(0,0,1,1)"] for _ in prompts]
    with pytest.raises(ValueError, match="expected 2 lists of 3"):
        run_agent_loop(Short(), tasks, LoopConfig(n_init=3))


# ---- OpenAI-compatible endpoint (a tiny local HTTP server; the client path is what is under test)

class _Handler(BaseHTTPRequestHandler):
    mode = "ok"
    seen = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        if self.mode == "garbage":
            data, code = b"<html>not json</html>", 200
        elif self.mode == "nochoices":
            data, code = json.dumps({"error": "x"}).encode(), 200
        elif self.mode == "500":
            data, code = b"boom", 500
        elif self.mode == "503_once" and len(type(self).seen) == 1:
            data, code = b"busy", 503
        else:
            n = 1 if self.mode == "ignore_n" else body.get("n", 1)
            ch = [{"index": k, "text": f"rect(0, 0, {k + 1}, {body['seed'] % 97 + 1})"} for k in reversed(range(n))]
            data, code = json.dumps({"choices": ch}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    _Handler.seen = []
    yield srv
    srv.shutdown()
    srv.server_close()


def test_endpoint_policy_ok_and_ignored_n(server):
    url = f"http://127.0.0.1:{server.server_port}"
    _Handler.mode = "ok"
    pol = EndpointPolicy(url, "m")
    out = pol.generate(["a", "b"], n=3, seed=5)
    assert [len(o) for o in out] == [3, 3] and out[0][0] == "rect(0, 0, 1, 6)"  # sorted by choice index
    assert _Handler.seen[0][0] == "/v1/completions" and _Handler.seen[0][1]["max_tokens"] == 256
    _Handler.mode = "ignore_n"
    _Handler.seen = []
    out = EndpointPolicy(url + "/v1/", "m").generate(["a"], n=3, seed=2)
    assert len(out[0]) == 3 and len(_Handler.seen) == 3 and len(set(out[0])) == 3


@pytest.mark.parametrize("mode,match", [("garbage", "non-JSON"), ("nochoices", "no completion choices"),
                                        ("500", "HTTP 500")])
def test_endpoint_policy_bad_answers(server, mode, match):
    _Handler.mode = mode
    with pytest.raises(EndpointError, match=match):
        EndpointPolicy(f"http://127.0.0.1:{server.server_port}", "m", max_retries=1).generate(["a"], n=2)
    assert len(_Handler.seen) == (2 if mode == "500" else 1)   # a 5xx is retried (max_retries), a bad body is not


def test_endpoint_policy_retries_a_transient_error(server):
    "The openai client's back-off: a 503 then a good answer is a success, after two requests."
    _Handler.mode = "503_once"
    out = EndpointPolicy(f"http://127.0.0.1:{server.server_port}", "m", max_retries=2).generate(["a"], n=2, seed=1)
    assert len(out[0]) == 2 and len(_Handler.seen) == 2
    with pytest.raises(ValueError, match="-1"):
        EndpointPolicy(f"http://127.0.0.1:{server.server_port}", "m", max_retries=-1)


def test_endpoint_down_is_a_clear_error():
    with pytest.raises(EndpointError, match="unreachable"):
        EndpointPolicy("http://127.0.0.1:9", "m", timeout=5).generate(["a"], n=1)
    with pytest.raises(ValueError, match="http"):
        EndpointPolicy("127.0.0.1:8000", "m")


def test_loop_over_endpoint_end_to_end(server):
    "The same loop drives a server: records are complete and the champion never decreases."
    _Handler.mode = "ok"
    tasks = load_split("test")[:2]
    rec = run_agent_loop(EndpointPolicy(f"http://127.0.0.1:{server.server_port}", "m"), tasks,
                         LoopConfig(n_init=2, n_rounds=2, n_revisions=2))
    assert len(_Handler.seen) == 2 * 3
    assert "Previous attempt" in _Handler.seen[-1][1]["prompt"]
    for row in rec["tasks"]:
        r = row["champion_reward_by_round"]
        assert all(b >= a for a, b in zip(r, r[1:]))


def test_loop_in_process_pixrl_tiny_is_deterministic():
    "The real in-process policy path (pixrl-tiny via pixrl.pix.policy.load_policy): same seed, same record."
    import torch
    from pixrl.pix.policy import load_policy
    pol = load_policy("pixrl-tiny")
    tasks = load_split("test")[:1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for a 0.8 M-parameter model on a shared CPU; restored below
    cfg = LoopConfig(n_init=2, n_rounds=1, n_revisions=2, max_new_tokens=16, seed=3)
    try:
        a, b = (_strip_wall(run_agent_loop(pol, tasks, cfg)) for _ in range(2))
    finally:
        torch.set_num_threads(threads)
    assert a == b
    assert a["prompt_spec"]["raster"] == pol.prompt_spec.raster  # the policy's own prompt contract
    for row in a["tasks"]:
        assert len(row["rounds"]) == 2 and all(len(r["attempts"]) == 2 for r in row["rounds"])
        r = row["champion_reward_by_round"]
        assert r[1] >= r[0]


def test_cli_against_endpoint_and_dead_endpoint(server, tmp_path, capsys):
    "`python -m pixrl.pix.agent_loop --base-url ...`: writes a strict-JSON record; a dead server is exit 2 with a message."
    from pixrl.pix.agent_loop import cli_main
    _Handler.mode = "ok"
    out = tmp_path / "loop.json"
    tid = load_split("test")[0].id
    rc = cli_main(["--base-url", f"http://127.0.0.1:{server.server_port}", "--model", "m", "--tasks", tid,
                   "--n-init", "2", "--n-rounds", "1", "--n-revisions", "1", "--raster", "16", "--no-api-doc",
                   "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads(out.read_text())
    assert rec["tasks"][0]["task_id"] == tid and rec["prompt_spec"]["api_doc"] is False and rec["run"]["seed"] == 0
    assert rec["run"]["endpoint"] == {"base_url": f"http://127.0.0.1:{server.server_port}/v1", "served_model": "m"}
    rc = cli_main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--tasks", tid, "--raster", "16",
                   "--out", str(tmp_path / "x.json")])
    assert rc == 2 and "unreachable" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


class LineEditor:
    "Scripted test double for `LoopConfig(revision='edit')`: plain prompts get the band copy; revision prompts one line."
    name = "line-editor"

    def __init__(self, tasks):
        from pixrl.pix.base import band_program
        self.copies = [band_program(t) for t in tasks]

    def generate(self, prompts, n, temperature=1.0, max_new_tokens=256, seed=0):
        out = []
        for copy, p in zip(self.copies, prompts):
            if "Previous attempt:" not in p:
                out.append(["```python\n" + copy + "```"] * n)
                continue
            assert p.rstrip("\n").splitlines()[-2] == "Write one corrected line of it."
            last = p.split("```python\n")[1].split("\n```")[0].splitlines()[-1]     # the previous program's last line
            head, args = last.split("(", 1)
            nums = args.rstrip(")").split(",")
            grown = f"{head}({','.join(nums[:-1] + [str(float(nums[-1]) + 0.5)])})"   # its last size half a cell larger
            out.append(([f"```python\n{grown}\n```", "```python\nb(1,2)\nb(3,4)\n```"] * n)[:n])
        return out


def test_edit_revisions_are_applied_recorded_and_checked():
    "revision='edit': each answer line is put into the champion's program; the champion re-evaluates; a bad edit is refused."
    from pixrl.pix.agent_loop import EDIT_REJECTED, apply_edit, check_loop_record, revision_stats
    tasks = [t for t in load_split("validation") if t.level == 0][:4]
    cfg = LoopConfig(n_init=1, n_rounds=2, n_revisions=2, revision="edit")
    rec = run_agent_loop(LineEditor(tasks), tasks, cfg)
    check_loop_record(rec)
    for row in rec["tasks"]:
        for rd in row["rounds"][1:]:
            s = rd["seeded_by"]
            revised = row["rounds"][s["round"]]["attempts"][s["attempt"]]["code"]
            good, bad = rd["attempts"]
            assert good["code"] == apply_edit(revised, good["edit"]) != revised and good["status"] == "OK"
            assert (bad["status"], bad["reason"], bad["code"]) == ("SOURCE_REJECTED", EDIT_REJECTED, "")
    stats = revision_stats(rec)
    assert stats["n_revisions"] == 4 * 2 * 2 and stats["share_ran"] == 0.5
    assert _strip_wall(rec) == _strip_wall(run_agent_loop(LineEditor(tasks), tasks, cfg))
    with pytest.raises(ValueError, match="'patch'"):
        LoopConfig(revision="patch")
