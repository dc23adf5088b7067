"""Inputs a user hands pixrl: a checkpoint, a release folder, a request to `pixrl serve`, a mem corpus.

7 checkpoints are read with torch.load(weights_only=True): a planted pickle payload is refused and never runs ·
8 a release folder is verified against its release.json by every loader (load_policy, pixrl serve) ·
9 `pixrl serve` refuses a max_tokens beyond the model's budget and nonsense values (HTTP 400), and bounds each request's
  time while other clients are served · 10 every malformed corpus line is a ValueError naming its line."""
import dataclasses, json, os, shutil, threading, time, urllib.error, urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "runs" / "bench_base" / "bench.json"


class _Payload:
    "Unpickling this runs `os.mkdir(marker)`: the marker folder shows whether a loader ran code from the file."
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


# --- 7: checkpoints never run code -----------------------------------------------------------------------------

SMALL_BASE = dict(steps=2, batch_size=2, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, ckpt_every=1,
                  warmup=1, group=1)


def test_resume_training_refuses_a_planted_checkpoint(tmp_path, one_torch_thread):
    from pixrl.pix.base import BaseConfig, resume_training, save_checkpoint
    cfg = dataclasses.asdict(BaseConfig(**SMALL_BASE))
    marker = tmp_path / "payload-ran"
    # the writer of a checkpoint writes its .sha256 too: the planted file passes the digest check
    save_checkpoint(tmp_path / "ckpt", 1, {"model": _Payload(marker), "optimizer": {}, "scheduler": {}, "step": 1,
                                           "log": [], "config": cfg})
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0)
    with pytest.raises(ValueError, match=r"step-0000001\.pt: refused: it holds objects other than tensors"):
        resume_training(tmp_path / "ckpt", cfg, model, opt, sched)
    assert not marker.exists(), "the planted payload ran"


def test_resume_training_still_resumes(tmp_path, one_torch_thread):
    "The checkpoints train_base writes (optimizer, scheduler, torch RNG, log, config) load with weights_only=True."
    from pixrl.pix.base import BaseConfig, train_base
    cfg = BaseConfig(**SMALL_BASE)
    train_base(cfg, tmp_path / "w", stop_after=1)
    _, _, log, info = train_base(cfg, tmp_path / "w")
    assert info["resumed_from"] == 1 and info["steps_done"] == 2 and log


@pytest.mark.parametrize("kw, bad", [(dict(revise=1.5, jitter=0.2), "revise 1.5"), (dict(repair=-0.1), "repair -0.1"),
                                     (dict(revise=0.5), "revise 0.5 with jitter 0"), (dict(revision="patch"), "revision 'patch'"),
                                     (dict(revision="edit"), "revision 'edit' with edit_step 0")])
def test_base_config_refuses_a_bad_revision_share(kw, bad):
    "A reviser base's knobs are probabilities, and a revision needs the noisy demonstrator's copy to revise."
    from pixrl.pix.base import BaseConfig
    with pytest.raises(ValueError, match=bad):
        BaseConfig(**kw)


def test_a_revising_base_trains_on_revision_prompts(tmp_path, one_torch_thread):
    "revise 1: every scene of a step group is the loop's revision prompt; revise 0 draws nothing more (older bases rebuild)."
    from pixrl.pix.base import BaseConfig, group_examples
    from pixrl.pix.tiny import char_tokenizer
    tok = char_tokenizer(True)
    plain = group_examples(BaseConfig(**SMALL_BASE, jitter=0.2), 0, tok)
    revising = group_examples(BaseConfig(**SMALL_BASE, jitter=0.2, revise=1.0, max_chars=3000), 0, tok)
    assert all("Previous attempt" in tok.decode(ids) for ids, _ in revising)
    assert not any("Previous attempt" in tok.decode(ids) for ids, _ in plain)
    lines = group_examples(BaseConfig(**SMALL_BASE, revise=1.0, edit_step=0.5, revision="edit", max_chars=3000), 0, tok)
    answers = [tok.decode([i for i, l in zip(ids, labels) if l != -100]) for ids, labels in lines]
    assert all(a.count("\nb(") == 1 and "sx =" not in a for a in answers), answers[:2]   # one edited line each


def _arm(cfg):
    from pixrl.offset.data import ACTION_NAMES, STATE_FEATURES
    from pixrl.offset.objective import ActionPolicy, JointPolicyObjective
    from pixrl.offset.tokenizer import ResidualVQ
    torch.manual_seed(0)
    tok = ResidualVQ(cfg.n_groups, cfg.n_codes, len(ACTION_NAMES)).fit(torch.rand(200, len(ACTION_NAMES)), iters=2, seed=0)
    policy = ActionPolicy(len(STATE_FEATURES), cfg.n_groups, cfg.n_codes, len(ACTION_NAMES), hidden=cfg.hidden)
    return {"objective": JointPolicyObjective(policy, tok), "tokenizer": tok, "digest": "d" * 64}


def test_load_arm_refuses_a_planted_checkpoint(tmp_path, one_torch_thread):
    from pixrl.offset.objective import ArmConfig, load_arm, save_arm
    cfg = ArmConfig(n_train=10, n_val=10, n_tok_fit=10, n_groups=2, n_codes=4, hidden=8, steps=1, batch_size=4)
    save_arm(_arm(cfg), cfg, tmp_path / "ok.pt")                     # what save_arm writes still loads
    obj, cfg2, digest = load_arm(tmp_path / "ok.pt")
    assert cfg2 == cfg and digest == "d" * 64
    marker = tmp_path / "payload-ran"
    torch.save({"policy": _Payload(marker), "tokenizer": {}, "config": dataclasses.asdict(cfg), "digest": "x"},
               tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"evil\.pt: refused: it holds objects other than tensors"):
        load_arm(tmp_path / "evil.pt")
    assert not marker.exists(), "the planted payload ran"


def test_no_loader_unpickles():
    "Every torch.load in the package passes weights_only=True; nothing calls pickle.load(s) on a file."
    for f in (ROOT / "pixrl").rglob("*.py"):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{f}:{n}: {line.strip()}"
            if "pickle.load(" in line:
                raise AssertionError(f"{f}:{n}: {line.strip()}")


# --- 8: a release is verified on load -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def release(tmp_path_factory):
    "A release (make_release) of a tiny random LoRA adapter, its merged/ a copy of pixrl-tiny (a prompt spec to edit)."
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM
    from pixrl.pix.policy import resolve_model
    from pixrl.release import make_release
    d = tmp_path_factory.mktemp("release")
    tiny = Path(resolve_model("pixrl-tiny"))
    peft = get_peft_model(Qwen2ForCausalLM.from_pretrained(tiny), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    peft.save_pretrained(d / "adapter")
    make_release(d / "adapter", d / "rel", bench=BENCH, merged=tiny, name="pixrl-inputs")
    return d / "rel"


def _loaders(rel: Path):
    from pixrl.pix.policy import load_policy
    from pixrl.serve import cli_main, load_version, server_command
    return {"load_policy": lambda: load_policy(rel / "merged", device="cpu"),
            "load_version": lambda: load_version(rel),
            "server_command": lambda: server_command(rel, backend="transformers"),
            "pixrl serve": lambda: cli_main([str(rel), "--backend", "transformers", "--print-command"])}


@pytest.mark.parametrize("what", ["merged/model.safetensors", "merged/pixrl.json"])
def test_tampered_release_is_refused(release, tmp_path, what, capsys):
    from pixrl.pix.policy import resolve_model
    from pixrl.release import sha256_file
    rel = tmp_path / "rel"
    shutil.copytree(release, rel)
    f = rel / what
    if what.endswith(".safetensors"):                                  # another model's weights
        f.write_bytes((Path(resolve_model("pixrl-base")) / "model.safetensors").read_bytes())
    else:                                                              # the prompt spec changed
        f.write_text(f.read_text().replace('"raster": 16', '"raster": 32'))
    recorded = json.loads((rel / "release.json").read_text())["files"][what]
    found = sha256_file(f)
    assert recorded != found
    for name, load in _loaders(rel).items():
        if name == "pixrl serve":
            assert load() == 2, name
            err = capsys.readouterr().err
        else:
            with pytest.raises(ValueError) as e:
                load()
            err = str(e.value)
        assert what in err and recorded in err and found in err, (name, err)


def test_release_with_an_added_or_missing_file_is_refused(release, tmp_path):
    from pixrl.pix.policy import load_policy
    rel = tmp_path / "rel"
    shutil.copytree(release, rel)
    (rel / "merged" / "model-00002-of-00002.safetensors").write_bytes(b"planted")
    with pytest.raises(ValueError, match=r"merged/model-00002-of-00002\.safetensors is not recorded in release\.json"):
        load_policy(rel / "merged", device="cpu")
    (rel / "merged" / "model-00002-of-00002.safetensors").unlink()
    (rel / "merged" / "pixrl.json").unlink()
    with pytest.raises(ValueError, match=r"merged/pixrl\.json is missing"):
        load_policy(rel / "merged", device="cpu")


def test_untampered_release_loads(release, capsys):
    from pixrl.release import verify_release
    loaders = _loaders(release)
    assert loaders["load_policy"]().prompt_spec.raster == 16
    assert loaders["load_version"]()["version"] == "pixrl-inputs"
    argv, name = loaders["server_command"]()
    assert argv[1:4] == ["-m", "pixrl.serve", str(release / "merged")] and "--host" in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"                # loopback by default
    assert loaders["pixrl serve"]() == 0
    assert verify_release(release)["name"] == "pixrl-inputs"


# --- 9: pixrl serve bounds every request --------------------------------------------------------------------------

CONTEXT = 16384   # so long that no CPU generates the whole budget inside the test's deadline


@pytest.fixture(scope="module")
def endless_export(tmp_path_factory):
    """An export (version.json + merged/) of a random tiny model whose end-of-sequence logit is pinned at 0: greedy, it
    never ends by itself, so only the server's bounds stop a completion."""
    from pixrl.pix.tiny import char_tokenizer, new_tiny_model
    d = tmp_path_factory.mktemp("endless")
    tok = char_tokenizer()
    net = new_tiny_model(0, vocab_size=len(tok), hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64,
                         max_positions=CONTEXT)
    with torch.no_grad():
        net.lm_head.weight[tok.eos_token_id] = 0
    net.save_pretrained(d / "merged")
    tok.save_pretrained(d / "merged")
    (d / "version.json").write_text(json.dumps({"version": "endless", "layout": {"adapter": None, "merged": "merged"}}))
    return d, len(tok("hello")["input_ids"])


def _post(base_url: str, body, timeout: float = 60) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_refuses_unbounded_and_nonsense_requests(endless_export):
    from pixrl.serve import complete, start_server
    export, n_prompt = endless_export
    budget = CONTEXT - n_prompt
    with start_server(export, backend="transformers", startup_timeout=120, max_time=10) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        t0 = time.monotonic()
        status, body = complete(srv.base_url, srv.model, "hello", max_tokens=10**9, timeout=30, max_retries=0)
        assert status == 400 and time.monotonic() - t0 < 5, body
        assert "max_tokens 1000000000" in body["error"] and f"budget of {budget} tokens" in body["error"], body
        base = {"model": srv.model, "prompt": "hello"}
        for bad, needle in [({"max_tokens": 0}, "max_tokens 0"), ({"max_tokens": -3}, "max_tokens -3"),
                            ({"max_tokens": 2.5}, "max_tokens 2.5"), ({"max_tokens": "8"}, "max_tokens '8'"),
                            ({"max_tokens": budget + 1}, f"max_tokens {budget + 1} exceeds"),
                            ({"temperature": -1}, "temperature -1"), ({"top_p": 0}, "top_p 0"), ({"n": 0}, "n 0"),
                            ({"prompt": ""}, "prompt ''"), ({"stream": True}, "stream True")]:
            status, body = _post(srv.base_url, {**base, **bad})
            assert status == 400 and needle in body["error"]["message"], (bad, status, body)
        assert _post(srv.base_url, b"[" * 100_000)[0] == 400
        assert _post(srv.base_url, {**base, "model": "another"})[0] == 404
        status, body = _post(srv.base_url, {**base, "max_tokens": 8, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] == 8, body
        assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["stopped_by"] == "max_tokens"


def test_serve_bounds_a_long_request_and_serves_others(endless_export):
    from pixrl.serve import start_server
    export, n_prompt = endless_export
    max_time = 1.5
    with start_server(export, backend="transformers", startup_timeout=120, max_time=max_time) as srv:
        base = {"model": srv.model, "prompt": "hello", "temperature": 0}
        long = {}

        def run_long():
            t = time.monotonic()
            long["reply"] = _post(srv.base_url, {**base, "max_tokens": CONTEXT - n_prompt})
            long["seconds"] = time.monotonic() - t
        t = threading.Thread(target=run_long)
        t0 = time.monotonic()
        t.start()
        time.sleep(0.5)
        with urllib.request.urlopen(srv.base_url + "/health", timeout=5) as r:
            assert r.status == 200
        status, body = _post(srv.base_url, {**base, "max_tokens": 4})   # a second client, while the long one runs
        short_done = time.monotonic() - t0
        t.join(timeout=60)
    assert status == 200 and body["usage"]["completion_tokens"] == 4, body
    status, body = long["reply"]
    assert status == 200, body
    c = body["choices"][0]
    assert c["stopped_by"] == "max_time" and c["finish_reason"] == "length", c
    assert 0 < body["usage"]["completion_tokens"] < CONTEXT - n_prompt
    assert long["seconds"] < max_time + 2.0, long["seconds"]            # the deadline ended it
    assert short_done < long["seconds"], (short_done, long["seconds"])   # served before the long one finished


# --- 10: the mem corpus loader names every malformed line ------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus_lines(tmp_path_factory):
    from pixrl.mem.corpus import export_corpus, fixture_corpus
    records, meta = fixture_corpus()
    p = export_corpus(tmp_path_factory.mktemp("corpus") / "c.jsonl", records, kappa=meta["kappa"], meta=meta)
    head, *body = p.read_text(encoding="utf-8").split("\n")[:-1]
    return head, body, records


def _missing_field(line: str) -> str:
    d = json.loads(line)
    d.pop("answer")
    return json.dumps(d)


MALFORMED = [  # (line 3 of the file, what the message says)
    ("[1, 2, 3]", "a record must be a JSON object"),
    ('"a string"', "got a JSON string"),
    ("42", "got a JSON number"),
    ("null", "got a JSON null"),
    ("true", "got a JSON boolean"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"id": ' * 100_000, "nested too deeply"),
    ("{not json", "not JSON"),
    ('{"id": "x", ', "not JSON"),
    (None, "missing fields ['answer']"),                 # a record missing a field
    ("dup", "duplicate record id"),                      # the record of line 2 again
]


@pytest.mark.parametrize("bad,needle", MALFORMED, ids=[m[1][:24] + f"-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_corpus_line_is_a_value_error_naming_it(corpus_lines, tmp_path, bad, needle):
    from pixrl.mem.corpus import load_corpus
    head, body, records = corpus_lines
    line = {None: lambda: _missing_field(body[1]), "dup": lambda: body[0]}.get(bad, lambda: bad)()
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([head, body[0], line, *body[2:]]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_corpus(p)
    msg = str(e.value)
    assert type(e.value) is ValueError and f"{p} line 3:" in msg and needle in msg, msg[:300]
    if bad == "dup":
        assert repr(records[0].id) in msg and "first on line 2" in msg, msg


def test_corpus_line_errors_on_the_metadata_line_and_bytes(corpus_lines, tmp_path):
    from pixrl.mem.corpus import load_corpus
    head, body, records = corpus_lines
    deep = tmp_path / "deep_head.jsonl"
    deep.write_text("\n".join(["[" * 100_000, *body]) + "\n")
    with pytest.raises(ValueError, match="line 1: not a corpus line: JSON nested too deeply"):
        load_corpus(deep)
    raw = tmp_path / "latin1.jsonl"
    raw.write_bytes("\n".join([head, body[0]]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match="line 3: not valid UTF-8"):
        load_corpus(raw)


def test_corpus_round_trips_a_line_separator_in_a_chunk(tmp_path):
    "Lines are split at \\n only: a chunk holding U+2028 (written raw, ensure_ascii=False) loads back."
    from pixrl.mem.corpus import export_corpus, fixture_corpus, load_corpus
    records, meta = fixture_corpus()
    r = records[0]
    odd = dataclasses.replace(r, chunks=(dataclasses.replace(r.chunks[0], text=r.chunks[0].text + "\u2028more"),
                                         *r.chunks[1:]))
    p = export_corpus(tmp_path / "c.jsonl", [odd, *records[1:]], kappa=meta["kappa"], meta=meta)
    back, _ = load_corpus(p)
    assert back[0] == odd and len(back) == len(records)


def test_the_line_editing_demonstrator_falls_back_when_its_edit_would_copy_another_line():
    """Scene 7702 of pixrl-base-line-editor's stream stopped its first build: its only region-guided edit makes its line
    equal another (which `apply_edit` would then replace), so the demonstrator must fall back to an undirected edit."""
    from pixrl.pix.agent_loop import apply_edit
    from pixrl.pix.base import base_build, cell_stream, demonstrator_rng, edit_example
    from pixrl.pix.reward import extract_program
    from pixrl.core import LINE_EDITOR_NAME
    cfg = base_build(LINE_EDITOR_NAME)
    rng = demonstrator_rng(cfg.seed, 7702)
    assert rng.random() < cfg.revise                      # group_examples shows this scene as a revision
    prompt, answer = edit_example(next(cell_stream(cfg.seed, start=7702)), rng, cfg.edit_step, cfg.prior_edits,
                                  cfg.cells, cfg.feedback, cfg.revision)
    prev = prompt.split("Previous attempt:\n```python\n")[1].split("\n```")[0] + "\n"
    edited = apply_edit(prev, extract_program(answer))
    assert edited is not None and edited != prev
    lines = [l for l in prev.splitlines() if l.startswith("b(")]
    assert len(lines) == len(set(lines)) and len(set(l for l in edited.splitlines() if l.startswith("b("))) == len(lines)
