"""mem line — a9: a versioned adapter export loads in a real OpenAI-compatible server (transformers serve, CPU)."""
import json, subprocess, time

import pytest
import torch

from pixrl.serve import export_adapter, load_version, start_server, complete, completion_text, cli_main, server_command
from pixrl.mem.model import cpu_corpus, TINY_TURN_HEADER
from pixrl.mem.train import resolve_model_path
from pixrl.mem.corpus import corpus_digest
from pixrl.mem.env import turn_prompt


def _nudged_adapter(name: str):
    "The committed mem model `name` + a LoRA adapter nudged by a few supervised steps (so merged ≠ base)."
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    base = resolve_model_path(name)
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"))
    ids = tok("<check>no</check><update></update><next>continue</next>", return_tensors="pt")["input_ids"]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return base, tok, model.eval()


@pytest.mark.parametrize("name", ["pixrl-mem-tiny", "pixrl-mem-base"])
def test_a9_adapter_loads(tmp_path, name):
    records, _ = cpu_corpus(0)
    base, tok, model = _nudged_adapter(name)
    export = export_adapter(model, tok, tmp_path / "export", train_config=dict(alpha=0.9, note="a9"),
                            data_digest=corpus_digest(records), base_model=str(base))
    v = load_version(export)
    assert v["data_digest"] == corpus_digest(records) and v["version"].endswith(corpus_digest(records)[:8])
    assert (export / "adapter" / "adapter_config.json").exists() and (export / "merged" / "config.json").exists()
    # the merged model is the adapter model (merge correctness), and differs from the base
    from transformers import AutoModelForCausalLM
    x = tok(turn_prompt(records[0].question, "", records[0].chunks[0].text, header=TINY_TURN_HEADER), return_tensors="pt")
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(export / "merged")(**x).logits
        peft_l = model(**x).logits
        with model.disable_adapter():
            base_l = model(**x).logits
    assert torch.allclose(merged, peft_l, atol=1e-4) and not torch.allclose(merged, base_l, atol=1e-4)
    assert cli_main([str(export), "--backend", "transformers", "--print-command"]) == 0

    prompt = turn_prompt(records[0].question, "", records[0].chunks[0].text, header=TINY_TURN_HEADER)
    t0 = time.time()
    with start_server(export, backend="transformers", host="127.0.0.1", startup_timeout=150) as srv:
        status, body = complete(srv.base_url, srv.model, prompt, max_tokens=24, timeout=90)
        if status == 404:                                            # completions not routed for this model: chat
            status, body = complete(srv.base_url, srv.model, prompt, max_tokens=24, timeout=90,
                                    endpoint="/v1/chat/completions")
        proc = srv.proc
    print(f"a9: HTTP {status} in {time.time() - t0:.1f} s:", json.dumps(body)[:300])
    assert proc.poll() is not None                                   # the server is gone
    assert status == 200, body
    text = completion_text(body)
    assert isinstance(text, str) and text.strip()
    # the server runs the exported weights: its greedy text is the merged model's greedy text
    m = AutoModelForCausalLM.from_pretrained(export / "merged")
    ids = tok(prompt, return_tensors="pt")
    out = m.generate(**ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    local = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    print("a9 local greedy:", repr(local))
    assert text == local


def test_mem_serve_bad_export_dir(tmp_path):
    with pytest.raises(ValueError, match="version.json"):
        server_command(tmp_path, "transformers")
    assert cli_main([str(tmp_path), "--print-command"]) == 2
