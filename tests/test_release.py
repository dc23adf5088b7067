"""After-training line: `pixrl release` (adapter + model card from the evidence records; the self-contained release of
a tiny real campaign, loaded from a copy of the folder alone with an empty PIXRL_CACHE)."""
import json, os, shutil, subprocess, sys
from pathlib import Path

import pytest

from pixrl.cli import main as pixrl_main
from pixrl.release import make_release, sha256_file
from conftest import cache_with_data

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "runs" / "bench_base" / "bench.json"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    "A real (tiny, random) peft LoRA adapter + merged model built from a config; nothing downloaded."
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM
    d = tmp_path_factory.mktemp("adapter")
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(d / "base")
    peft = get_peft_model(Qwen2ForCausalLM.from_pretrained(d / "base"),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(d / "adapter")
    peft.merge_and_unload().save_pretrained(d / "merged")
    return d


def test_release_cli_writes_card_from_committed_bench(adapter, tmp_path, capsys):
    out = tmp_path / "rel"
    rc = pixrl_main(["release", "--adapter", str(adapter / "adapter"), "--out", str(out), "--bench", str(BENCH),
                     "--merged", str(adapter / "merged"), "--name", "pixrl-test"])
    assert rc == 0, capsys.readouterr().err
    bench = json.loads(BENCH.read_text())
    card = (out / "README.md").read_text()
    o = bench["overall"]
    assert f"| **all** | {o['n_tasks']} | {o['exec_rate']:.3f} | {o['mean_iou']:.3f} | {o['best_of_n_iou']:.3f} |" in card
    for fam in bench["per_family"]:
        assert f"| {fam} |" in card
    assert bench["data_digest"] in card and "vllm serve" in card and sha256_file(BENCH)[:16] in card
    man = json.loads((out / "release.json").read_text())
    assert man["kind"] == "pixrl.release" and man["data_digest"] == bench["data_digest"]
    for rel, sha in man["files"].items():
        assert sha256_file(out / rel) == sha
    # `pixrl serve` can serve the release folder (pixrl's server on CPU serves merged/)
    from pixrl.serve import server_command
    argv, _ = server_command(out, backend="transformers")
    assert argv[1:4] == ["-m", "pixrl.serve", str(out / "merged")]
    # the released adapter still loads on its base
    from peft import PeftModel
    from transformers import Qwen2ForCausalLM
    PeftModel.from_pretrained(Qwen2ForCausalLM.from_pretrained(adapter / "base"), out / "adapter")


def test_release_refuses_bad_input(adapter, tmp_path, capsys):
    with pytest.raises(ValueError, match="not a peft adapter"):
        make_release(adapter / "base", tmp_path / "a", bench=BENCH)
    with pytest.raises(ValueError, match="needs evidence"):
        make_release(adapter / "adapter", tmp_path / "b")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "pixrl.agent_loop"}))
    with pytest.raises(ValueError, match="not a pixrl.bench"):
        make_release(adapter / "adapter", tmp_path / "c", bench=bad)
    with pytest.raises(ValueError, match="probe"):
        make_release(adapter / "adapter", tmp_path / "d", probe=bad)
    assert pixrl_main(["release", "--adapter", str(tmp_path / "nope"), "--out", str(tmp_path / "e"),
                       "--bench", str(BENCH)]) == 2
    assert "not a folder" in capsys.readouterr().err
    # a loop record whose champion does not re-evaluate to its recorded IoU (issue 34's bad input)
    loop = json.loads((ROOT / "runs" / "agent_loop_b" / "loop.json").read_text())
    task = loop["tasks"][5]
    task["champion"]["iou"] = (task["champion"]["iou"] or 0.0) + 0.05
    tampered = tmp_path / "loop.json"
    tampered.write_text(json.dumps(loop))
    with pytest.raises(ValueError, match=f"task {task['task_id']}: the champion .* re-evaluates to"):
        make_release(adapter / "adapter", tmp_path / "f", bench=BENCH, loop=tampered)
    assert not (tmp_path / "f").exists()


# --- the self-contained release of a campaign -------------------------------------------------------------------

CAMPAIGN = ["--arm", "B", "--model", "pixrl-tiny", "--name", "rel", "--levels", "0", "--steps-per-level", "2",
            "--probe-per-level", "1", "--probe-k", "2", "--groups-per-step", "1", "--max-new-tokens", "48",
            "--lora-r", "8", "--preflight-control-n", "8"]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    "A tiny real campaign (pixrl-tiny, arm B, one 2-step RL stage on L0): (run dir, its PIXRL_CACHE)."
    root = tmp_path_factory.mktemp("campaign")
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(root / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--runs-root", str(root / "runs"), *CAMPAIGN]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return root / "runs" / "rel", root / "cache"


def _greedy_transformers(model_dir, prompts: list[str], max_new_tokens: int) -> list[str]:
    "Greedy completions with transformers alone (the loaders the release card names), batched left-padded."
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_campaign_release_loads_on_a_fresh_machine(campaign, tmp_path, monkeypatch, capsys):
    from pixrl.pix.campaign import load_state
    from pixrl.pix.policy import load_policy, model_dir_sha256, resolve_model
    from pixrl.pix.probe import probe_tasks
    from pixrl.serve import complete, completion_text, server_command, start_server
    from pixrl.pix.tasks import release_digest
    run_dir, cache = campaign
    monkeypatch.setenv("PIXRL_CACHE", str(cache))
    state = load_state(run_dir)
    final = state["stages"][-1]["final_dir"]
    assert final.startswith(str(cache))
    out = tmp_path / "made" / "rel"
    assert pixrl_main(["release", "--campaign", str(run_dir), "--out", str(out)]) == 0, capsys.readouterr().err
    # the campaign's final model, greedy, on 8 probe tasks (the reference, before the cache goes)
    ref = load_policy(final, device="cpu")
    prompts = [ref.prompt(t) for t in probe_tasks(2)[:8]]
    want = ref.generate(prompts, temperature=0, max_new_tokens=24)
    # a fresh machine: the release folder alone, an empty PIXRL_CACHE, the training cache gone
    fresh = tmp_path / "fresh" / "rel"
    shutil.copytree(out, fresh)
    shutil.rmtree(out)
    gone = cache.with_name("cache-gone")
    cache.rename(gone)
    try:
        monkeypatch.setenv("PIXRL_CACHE", str(tmp_path / "empty-cache"))
        got_policy = load_policy(fresh / "merged", device="cpu").generate(prompts, temperature=0, max_new_tokens=24)
        got_tf = _greedy_transformers(fresh / "merged", prompts, 24)
        with start_server(fresh, backend="transformers", startup_timeout=120, log_path=tmp_path / "server.log") as srv:
            status, body = complete(srv.base_url, srv.model, prompts[0], max_tokens=24, timeout=60)
    finally:
        gone.rename(cache)
    assert got_policy == want
    assert got_tf == [w[0] for w in want]
    assert status == 200, body                                        # `pixrl serve`'s transformers server, same text
    assert completion_text(body) == want[0][0]
    # every file is in the manifest with its sha256; no JSON names the training cache
    man = json.loads((fresh / "release.json").read_text())
    assert man["form"] == "merged" and man["load"] == "merged" and man["stage"] == "rl-L0"
    for rel, sha in man["files"].items():
        assert sha256_file(fresh / rel) == sha
    assert set(man["files"]) >= {"README.md", "version.json", "merged/model.safetensors", "merged/pixrl.json"}
    assert man["files"]["merged/model.safetensors"] == model_dir_sha256(Path(final))
    assert man["files"]["merged/model.safetensors"] != man["base"]["sha256"], \
        "the tiny campaign left the weights unchanged, so the greedy check cannot tell the release from its base"
    for f in fresh.rglob("*.json"):
        assert str(cache) not in f.read_text(), f
    # the base by name and sha256, the chain, the probe curve
    assert man["base"]["name"] == "pixrl-tiny" and man["base"]["sha256"] == model_dir_sha256(resolve_model("pixrl-tiny"))
    assert [(r["stage"], r["trained_steps"], r["in_weights"]) for r in man["chain"]] == [("rl-L0", 2, True)]
    assert [r["stage"] for r in man["probe_curve"]] == ["base"] * 5 + ["rl-L0"] * 5
    card = (fresh / "README.md").read_text()
    assert "`pixrl-tiny` (committed in the pixrl repository at `data/models/pixrl-tiny`" in card
    assert "`rl-L0` (2 steps)" in card and "merged model is the one exact form" in card
    assert "each trains a rank-8 LoRA on the previous stage's weights" in card and "full fine-tuning" not in card
    assert "| rl-L0 | rl | L0 | 2 steps | done | 2 | yes |" in card
    assert man["data_digest"] == release_digest() and release_digest() in card and "campaign preflight" in man["evidence"]
    # `pixrl serve` serves the released model folder
    argv, _ = server_command(fresh, backend="transformers")
    assert argv[1:4] == ["-m", "pixrl.serve", str(fresh / "merged")]


def test_campaign_release_card_names_the_lora_r_of_an_old_state(campaign, tmp_path, monkeypatch):
    "A state recorded before the rename (`lora_rank`, read back as `lora_r` by load_state) still gives a LoRA card."
    from pixrl.release import campaign_summary, make_campaign_release
    run_dir, cache = campaign
    state = json.loads((run_dir / "state.json").read_text())
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    config = {("lora_rank" if k == "lora_r" else k): v for k, v in state["config"].items()}
    (old / "state.json").write_text(json.dumps({**state, "config": config}))
    assert campaign_summary(old)[0]["lora_rank"] == campaign_summary(run_dir)[0]["lora_rank"] == 8
    monkeypatch.setenv("PIXRL_CACHE", str(cache))
    make_campaign_release(old, tmp_path / "rel")
    card = (tmp_path / "rel" / "README.md").read_text()
    assert "a rank-8 LoRA" in card and "full fine-tuning" not in card


def test_campaign_release_refuses(campaign, tmp_path, capsys):
    from pixrl.release import make_campaign_release
    run_dir, cache = campaign
    with pytest.raises(ValueError, match="no state.json"):
        make_campaign_release(tmp_path, tmp_path / "a")
    state = json.loads((run_dir / "state.json").read_text())
    pending = tmp_path / "pending"
    shutil.copytree(run_dir, pending)
    (pending / "state.json").write_text(json.dumps({**state, "stages": [{**s, "status": "pending"} for s in state["stages"]]}))
    with pytest.raises(ValueError, match="no finished stage"):
        make_campaign_release(pending, tmp_path / "b")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run_dir, elsewhere)
    moved = [{**s, "final_dir": s["final_dir"].replace(str(cache), "/nonexistent/cache")} for s in state["stages"]]
    (elsewhere / "state.json").write_text(json.dumps({**state, "stages": moved}))
    with pytest.raises(ValueError, match="not on this machine: '/nonexistent/cache/"):
        make_campaign_release(elsewhere, tmp_path / "c")
    with pytest.raises(ValueError, match="measured weights"):      # a bench of other weights (runs/bench_base: the base)
        make_campaign_release(run_dir, tmp_path / "d", bench=BENCH)
    assert pixrl_main(["release", "--campaign", str(run_dir), "--out", str(tmp_path / "e"), "--merged", str(run_dir)]) == 2
    assert "--probe / --merged go with --adapter" in capsys.readouterr().err
