"""After-training line: `pixrl release` (adapter + model card from the evidence records)."""
import json
from pathlib import Path

import pytest

from pixrl.cli import main as pixrl_main
from pixrl.release import make_release, sha256_file

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
    # `pixrl serve` can serve the release folder (transformers on CPU serves merged/)
    from pixrl.serve import server_command
    argv, _ = server_command(out, backend="transformers")
    assert argv[1:3] == ["serve", str(out / "merged")]
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
