"""The model families users bring, each from a tiny random config and a tokenizer/processor built here from the
library's own classes (no download): Qwen3 (thinking on/off), Llama-3-style chat, Gemma-3 (text), Qwen2.5-VL and
Qwen3-VL. For each: `load_policy` on the saved directory, the prompt contract (the token ids TRL feeds the model for a
GRPO and an SFT row are the probe's), the probe, and a smoke campaign (arm B; arm G for the VLMs)."""
import dataclasses, json, os, subprocess, sys
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch
import transformers
from transformers import GenerationConfig

from pixrl.core import PIXRL_META
from pixrl.pix.campaign import token_budget
from pixrl.pix.grpo import rl_dataset, sft_dataset
from pixrl.pix.policy import image_only_processor, load_policy
from pixrl.pix.prompt import PromptSpec, prompt_text
from pixrl.pix.probe import probe_tasks
from pixrl.pix.tasks import load_split
from pixrl.pix.tiny import char_tokenizer, TINY_PROMPT_SPEC, TINY_VLM_PROMPT_SPEC
from conftest import cache_with_data

REPO = Path(__file__).resolve().parents[1]
HIDDEN = 64          # every tiny text model: 64 wide, 2 layers, 4 query heads of 16, 2 kv heads

# ---- chat templates: each family's rules, written out (the real ones, less tools / system-prompt options) ----
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] | trim }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
_QWEN_VL_BODY = (
    "<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n")
QWEN25_VL_TEMPLATE = (                       # Qwen2.5-VL adds its default system turn
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}" + _QWEN_VL_BODY + "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN3_VL_TEMPLATE = (
    "{% for m in messages %}" + _QWEN_VL_BODY + "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_VL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def family_tokenizer(specials: list, template: str, eos: str, bos: str | None = None, pad: str | None = "<|endoftext|>",
                     plain: tuple = ()):
    """pixrl's character tokenizer + the family's special tokens (`plain`: added tokens that decode as text, like
    Qwen3's <think>), its chat template, eos/bos/pad; `bos` is also prepended to every encoding, as Llama-3's and
    Gemma's tokenizers do."""
    from tokenizers import processors
    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(specials)})
    tok.add_tokens(list(plain))
    tok.eos_token = eos
    tok.chat_template = template
    if bos is not None:
        tok.bos_token = bos
        bos_id = tok.convert_tokens_to_ids(bos)
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    if pad is None:
        tok.pad_token = None
    elif pad != tok.pad_token:
        tok.pad_token = pad
    return tok


def _text_config(cls, tok, **kw):
    ids = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
           "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id}
    return cls(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
               **ids, **kw)


def _save(model, owner, out, spec: PromptSpec, max_new_tokens: int = 64, **meta) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = getattr(owner, "tokenizer", owner)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    owner.save_pretrained(out)
    (out / PIXRL_META).write_text(json.dumps({"prompt_spec": dataclasses.asdict(spec),
                                              "max_new_tokens": max_new_tokens, **meta}, indent=1))
    return out


def build_qwen3(out):
    tok = family_tokenizer(["<|im_start|>", "<|im_end|>"], QWEN3_TEMPLATE, eos="<|im_end|>", plain=("<think>", "</think>"))
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(_text_config(transformers.Qwen3Config, tok, head_dim=16))
    return _save(model, tok, out, TINY_PROMPT_SPEC)


def build_llama3(out):
    tok = family_tokenizer(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                           LLAMA3_TEMPLATE, eos="<|eot_id|>", bos="<|begin_of_text|>", pad=None)
    torch.manual_seed(0)
    cfg = _text_config(transformers.LlamaConfig, tok)
    cfg.pad_token_id = None
    model = transformers.LlamaForCausalLM(cfg)
    return _save(model, tok, out, TINY_PROMPT_SPEC)


def build_gemma3(out):
    tok = family_tokenizer(["<bos>", "<start_of_turn>", "<end_of_turn>", "<pad>"], GEMMA3_TEMPLATE, eos="<end_of_turn>",
                           bos="<bos>", pad="<pad>")
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(_text_config(transformers.Gemma3TextConfig, tok, head_dim=16,
                                                        sliding_window=64, query_pre_attn_scalar=16))
    return _save(model, tok, out, TINY_PROMPT_SPEC)


def _qwen_vl_processor(proc_cls, template, patch: int, merge: int = 2):
    from transformers import Qwen2VLImageProcessorPil
    tok = family_tokenizer(QWEN_VL_TOKENS, template, eos="<|im_end|>")
    S = TINY_VLM_PROMPT_SPEC.image_size
    image_proc = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=merge, temporal_patch_size=2,
                                          min_pixels=(patch * merge) ** 2, max_pixels=S * S,
                                          size={"shortest_edge": (patch * merge) ** 2, "longest_edge": S * S})
    return image_only_processor(proc_cls)(image_processor=image_proc, tokenizer=tok, chat_template=template)


def _vl_ids(tok) -> dict:
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                                                           ("vision_start_token_id", "<|vision_start|>"),
                                                           ("vision_end_token_id", "<|vision_end|>")]}
    return ids


def build_qwen25_vl(out):
    proc = _qwen_vl_processor(transformers.Qwen2_5_VLProcessor, QWEN25_VL_TEMPLATE, patch=8)
    tok = proc.tokenizer
    text = _text_config(transformers.Qwen2_5_VLTextConfig, tok,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = transformers.Qwen2_5_VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                                 patch_size=8, spatial_merge_size=2, temporal_patch_size=2,
                                                 window_size=16, out_hidden_size=HIDDEN, fullatt_block_indexes=[1])
    cfg = transformers.Qwen2_5_VLConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                        tie_word_embeddings=True, **_vl_ids(tok))
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg)
    return _save(model, proc, out, TINY_VLM_PROMPT_SPEC)


def build_qwen3_vl(out):
    proc = _qwen_vl_processor(transformers.Qwen3VLProcessor, QWEN3_VL_TEMPLATE, patch=8)
    tok = proc.tokenizer
    text = _text_config(transformers.Qwen3VLTextConfig, tok, head_dim=16,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True})
    vision = transformers.Qwen3VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8,
                                              spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=HIDDEN,
                                              num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = transformers.Qwen3VLConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                     tie_word_embeddings=True, **_vl_ids(tok))
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(cfg)
    return _save(model, proc, out, TINY_VLM_PROMPT_SPEC)


FAMILIES = {"qwen3": build_qwen3, "llama3": build_llama3, "gemma3": build_gemma3, "qwen2.5-vl": build_qwen25_vl,
            "qwen3-vl": build_qwen3_vl}
VISION = {"qwen2.5-vl", "qwen3-vl"}
ARM = {name: "G" if name in VISION else "B" for name in FAMILIES}   # the VLMs: SFT (gated) -> RL; text: base RL


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    "(name, saved tiny model directory) of each family."
    name = request.param
    return name, FAMILIES[name](tmp_path_factory.mktemp(name.replace(".", "")) / "model")


@pytest.fixture(scope="module")
def tasks():
    return [t for t in load_split("train") if t.level == 0][:2]


def _policy(name, d, thinking=False):
    "The family's policy at the campaign's A/B operating point (thinking off where the template can think)."
    return load_policy(str(d), thinking=thinking if name == "qwen3" else None)


def probe_ids(pol, task) -> dict:
    "What the probe feeds the model for `task`: token ids (+ a VLM's image tensors) of `Policy._encode`."
    enc = pol._encode([pol.prompt(task)], pol.images([task]))
    return {k: v[0].tolist() if k == "input_ids" else v for k, v in enc.items() if k != "attention_mask"}


def trl_grpo_ids(pol, row) -> list:
    "The prompt ids TRL's GRPOTrainer generates from for dataset `row` (its own `_tokenize_prompts`, images merged as it does)."
    from trl import GRPOTrainer
    from trl.data_utils import prepare_multimodal_messages
    from pixrl.pix.prompt import thinking_kwargs
    owner = pol.processor or pol.tokenizer
    trainer = SimpleNamespace(processing_class=owner, _is_vlm=pol.processor is not None, environment_factories=None,
                              tools=None, chat_template=None, chat_template_kwargs=thinking_kwargs(owner, pol.thinking))
    prompt = prepare_multimodal_messages(row["prompt"], images=[row["image"]]) if pol.vision else row["prompt"]
    ids, _, fields = GRPOTrainer._tokenize_prompts(trainer, [prompt])
    return list(ids[0]), fields


def trl_sft_prompt_ids(pol, row) -> tuple[list, dict]:
    "The prompt part of what TRL's SFT trains on for `row`: its VLM collator, or its text `_tokenize` of prompt+completion."
    if pol.vision:
        from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling
        batch = DataCollatorForVisionLanguageModeling(pol.processor, completion_only_loss=True)([dict(row)])
        keep = (batch["labels"][0] == -100) & (batch["attention_mask"][0] == 1)     # the prompt: no loss, not padding
        return batch["input_ids"][0][keep].tolist(), batch
    from trl.data_utils import _tokenize, common_prefix_length
    prompt = _tokenize(pol.tokenizer, row["prompt"])["input_ids"]
    full = _tokenize(pol.tokenizer, row["prompt"] + row["completion"])["input_ids"]
    return full[:common_prefix_length(prompt, full)], {}


def test_family_loads_with_its_prompt(family, tasks):
    name, d = family
    pol = _policy(name, d)
    assert pol.chat and pol.vision == (name in VISION)
    assert pol.prompt_spec == (TINY_VLM_PROMPT_SPEC if name in VISION else TINY_PROMPT_SPEC)
    p = pol.prompt(tasks[0])
    assert prompt_text(tasks[0], pol.prompt_spec).strip() in p and pol.tokenizer.pad_token is not None
    bos = pol.tokenizer.bos_token
    if name in ("llama3", "gemma3"):                     # the template writes BOS once, the tokenizer adds none
        assert p.startswith(bos)
        ids = pol.tokenizer(p)["input_ids"]
        assert ids == pol.tokenizer(p, add_special_tokens=False)["input_ids"] and ids.count(pol.tokenizer.bos_token_id) == 1
    if name == "qwen3":                                  # thinking on/off through enable_thinking
        on = _policy(name, d, thinking=True)
        assert pol.can_think and p == on.prompt(tasks[0]) + "<think>\n\n</think>\n\n"
    if name in VISION:                                   # one image slot, grid of 8x8 patches -> 16 merged image tokens
        assert p.count("<|image_pad|>") == 1 and "<|vision_start|><|image_pad|><|vision_end|>" in p
        enc = pol._encode([p], pol.images(tasks[:1]))
        assert enc["image_grid_thw"].tolist() == [[1, 8, 8]]
        assert (enc["input_ids"] == pol.model.config.image_token_id).sum() == 16
        with torch.no_grad():                            # the image reaches the model
            a = pol.model(**enc).logits[0, -1]
            b = pol.model(**pol._encode([p], pol.images(tasks[1:2]))).logits[0, -1]
        assert (a - b).abs().max() > 1e-5
    s = pol.sample([pol.prompt(t) for t in tasks], n=2, max_new_tokens=8, seed=1, images=pol.images(tasks))
    assert [len(r) for r in s.texts] == [2, 2]


def test_family_prompt_contract(family, tasks):
    "The ids (and a VLM's image tensors) TRL feeds for a GRPO row and an SFT row are the probe's, token for token."
    name, d = family
    pol = _policy(name, d)
    rl, sft = rl_dataset(pol, tasks), sft_dataset(pol, tasks)
    for k, t in enumerate(tasks):
        want = probe_ids(pol, t)
        grpo, fields = trl_grpo_ids(pol, rl[k])
        assert grpo == want["input_ids"], (name, pol.tokenizer.decode(grpo[:8]), pol.tokenizer.decode(want["input_ids"][:8]))
        sft_prompt, batch = trl_sft_prompt_ids(pol, sft[k])
        assert sft_prompt == want["input_ids"], name
        if pol.vision:
            for got in (fields, batch):
                assert torch.equal(torch.as_tensor(got["image_grid_thw"]), want["image_grid_thw"])
                assert torch.allclose(torch.as_tensor(got["pixel_values"]), want["pixel_values"])


def test_family_smoke_campaign_and_probe(family, tmp_path):
    "Arm B (arm G for the VLMs) as a smoke campaign through the CLI's subprocess stages; the probes and the trained stage."
    name, d = family
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", ARM[name], "--model", str(d), "--runs-root",
           str(tmp_path / "runs"), "--name", "fam", "--smoke", "--levels", "0", "--probe-per-level", "1", "--probe-k", "1",
           "--max-new-tokens", "16", "--num-generations", "2", "--groups-per-step", "1", "--preflight-control-n", "2"]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "runs" / "fam"
    state = json.loads((run / "state.json").read_text())
    assert [s["name"] for s in state["stages"]] == (["sft-L0", "rl-L0"] if name in VISION else ["rl-L0"])
    rl = state["stages"][-1]
    assert rl["status"] == "done" and rl["global_step"] == 2
    for probe in (state["base_probe"], rl["probe"]):     # 1 task per level x 5 levels x k=1
        assert json.loads((run / probe).read_text())["overall"]["n_samples"] == 5
    # the trained stage is the same family with the same prompt
    final, base = _policy(name, rl["final_dir"]), _policy(name, d)
    task = probe_tasks(1)[0]
    assert final.vision == base.vision and final.prompt(task) == base.prompt(task)
    assert type(final.model) is type(base.model) and probe_ids(final, task)["input_ids"] == probe_ids(base, task)["input_ids"]


def test_token_budget_counts_the_attached_image(family, tasks):
    """The prompt budget takes off what the processor adds for the image beyond the tokenizer's count of the prompt
    text — for Qwen-VL one `<|image_pad|>` becomes 16 merged patches (no config field holds that number; before, the
    budget counted 0) — and refuses a completion budget that leaves no room for a prompt."""
    name, d = family
    pol = _policy(name, d)
    p = pol.prompt(tasks[0])
    fed = pol._encode([p], pol.images(tasks[:1]))["input_ids"].shape[1]          # what the model is fed
    counted = len(pol.tokenizer(p, add_special_tokens=False)["input_ids"])     # what the preflight's audit counts
    assert fed - counted == (15 if name in VISION else 0)
    ctx = pol.model.config.get_text_config().max_position_embeddings
    assert token_budget(pol, 16) == ctx - 16 - (fed - counted)
    with pytest.raises(ValueError, match=rf"context of {ctx} tokens holds no prompt beside a completion budget of "
                                         rf"{ctx - fed + counted} and {fed - counted} image tokens"):
        token_budget(pol, ctx - (fed - counted))


def test_vlm_without_an_offline_image_processor_is_refused(tmp_path):
    "A Qwen-VL directory lacking its image processor: refused before anything trains, naming the family and the file."
    d = build_qwen3_vl(tmp_path / "vl")
    (d / "processor_config.json").unlink()
    for f in d.glob("preprocessor_config.json"):
        f.unlink()
    with pytest.raises(ValueError, match=r"qwen3_vl processor \(Qwen3VLProcessor\).*preprocessor_config.json"):
        load_policy(str(d))
