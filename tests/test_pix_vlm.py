"""The vision-language path: a from-config tiny VLM (LLaVA: CLIP tower + Qwen2 text model) through the same loader,
prompt contract (image attached, no raster), probe, SFT, GRPO and campaign as pixrl-tiny."""
import json, os, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch
from trl.data_utils import prepare_multimodal_messages

from pixrl.pix.grpo import rl_dataset, sft_dataset
from pixrl.pix.harvest import task_prompts
from pixrl.pix.policy import load_policy
from pixrl.pix.prompt import PromptSpec, prompt_text
from pixrl.pix.tasks import load_split
from pixrl.pix.tiny import build_tiny_vlm, tiny_dir, TINY_VLM_PROMPT_SPEC
from conftest import cache_with_data

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


@pytest.fixture(scope="module")
def tasks():
    return [t for t in load_split("train") if t.level == 0][:3]


def test_vlm_loads_with_processor_and_attached_image_prompt(vlm_dir, tasks):
    pol = load_policy(str(vlm_dir))
    assert pol.vision and pol.processor is not None and pol.prompt_spec == TINY_VLM_PROMPT_SPEC
    # the size the READMEs quote (113 k parameters; 64 image tokens = (64 px / 8 px patches)^2)
    assert round(sum(p.numel() for p in pol.model.parameters()) / 1e3) == 113
    assert pol.model.config.image_seq_length == 64
    p = pol.prompt(tasks[0])
    # one image slot, the "attached" line, no character raster
    assert p.count("<image>") == 1 and "Image (attached): 64x64 px" in p
    assert not any(set(line) <= {"#", "."} and len(line) >= 8 for line in p.splitlines())
    imgs = pol.images(tasks)
    assert len(imgs) == 3 and imgs[0].size == (64, 64)
    assert np.array_equal(np.asarray(imgs[0]) == 0, np.asarray(tasks[0].model_image, bool))  # ink = black


def test_vlm_token_budget_takes_off_the_image(vlm_dir, tasks):
    "LLaVA's one `<image>` slot is fed as image_seq_length tokens: the budget takes off the 63 the tokenizer does not count."
    from pixrl.pix.campaign import image_tokens, token_budget
    pol = load_policy(str(vlm_dir))
    p = pol.prompt(tasks[0])
    fed = pol._encode([p], pol.images(tasks[:1]))["input_ids"].shape[1]
    assert image_tokens(pol) == fed - len(pol.tokenizer(p, add_special_tokens=False)["input_ids"]) == 63
    assert token_budget(pol, 96) == 2048 - 96 - 63


def test_vlm_prompt_identical_in_probe_rl_and_sft(vlm_dir, tasks):
    "What TRL renders from the GRPO and SFT rows (image column + conversational prompt) is `policy.prompt(task)`."
    pol = load_policy(str(vlm_dir))
    rl, sft = rl_dataset(pol, tasks), sft_dataset(pol, tasks)
    for k, t in enumerate(tasks):
        for row in (rl[k], sft[k]):
            msgs = prepare_multimodal_messages(row["prompt"], images=[row["image"]])
            rendered = pol.processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            assert rendered == pol.prompt(t)
            assert np.array_equal(np.asarray(row["image"]), np.asarray(pol.images([t])[0]))
        assert rl[k]["task_id"] == t.id
        assert sft[k]["completion"][0]["role"] == "assistant" and t.program.strip() in sft[k]["completion"][0]["content"]


def test_vlm_image_reaches_the_model(vlm_dir, tasks):
    "Same prompt text, different attached image -> different next-token distribution (the image is not dropped)."
    pol = load_policy(str(vlm_dir))
    a, b = tasks[0], next(t for t in tasks[1:] if not np.array_equal(t.model_image, tasks[0].model_image))
    text = pol.prompt(a)
    with torch.no_grad():
        la = pol.model(**pol._encode([text], pol.images([a]))).logits[0, -1]
        lb = pol.model(**pol._encode([text], pol.images([b]))).logits[0, -1]
        la2 = pol.model(**pol._encode([text], pol.images([a]))).logits[0, -1]
    assert torch.equal(la, la2) and (la - lb).abs().max() > 1e-4


def test_vlm_sampling_needs_images_and_text_policy_refuses_them(vlm_dir, tasks):
    pol = load_policy(str(vlm_dir))
    prompts = [pol.prompt(t) for t in tasks[:2]]
    s = pol.sample(prompts, n=2, max_new_tokens=8, seed=1, images=pol.images(tasks[:2]))
    assert [len(r) for r in s.texts] == [2, 2]
    assert s.texts == pol.sample(prompts, n=2, max_new_tokens=8, seed=1, images=pol.images(tasks[:2])).texts
    with pytest.raises(ValueError, match="vision-language policy"):
        pol.sample(prompts, n=1, max_new_tokens=4)
    tiny = load_policy("pixrl-tiny")
    with pytest.raises(ValueError, match="takes no images"):
        tiny.sample([tiny.prompt(tasks[0])], n=1, max_new_tokens=4, images=pol.images(tasks[:1]))
    # an attached-image spec on a policy that cannot take images: refused before sampling
    with pytest.raises(ValueError, match="takes no images"):
        task_prompts(tiny, tasks, PromptSpec(vision=True))
    assert task_prompts(pol, tasks, pol.prompt_spec) == [prompt_text(t, pol.prompt_spec) for t in tasks]


def test_vlm_refuses_an_image_of_another_size_or_mode(vlm_dir, tasks):
    "An image the prompt contract does not attach (another size, RGB) is refused before anything is sampled."
    from PIL import Image
    pol = load_policy(str(vlm_dir))
    prompts = [pol.prompt(t) for t in tasks[:2]]
    good = pol.images(tasks[:2])
    with pytest.raises(ValueError, match=r"image 1 is \(32, 32\) mode 'L'; accepted: a 64x64 'L' image"):
        pol.sample(prompts, images=[good[0], good[1].resize((32, 32))], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"image 0 is \(64, 64\) mode 'RGB'; accepted"):
        pol.sample(prompts, images=[good[0].convert("RGB"), good[1]], max_new_tokens=4)


def test_text_model_with_vision_spec_is_refused(tmp_path):
    d = tmp_path / "tiny-vision"
    shutil.copytree(tiny_dir(), d)
    meta = json.loads((d / "pixrl.json").read_text())
    meta["prompt_spec"]["vision"] = True
    (d / "pixrl.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="no vision_config"):
        load_policy(str(d))


@pytest.mark.slow
def test_vlm_campaign_sft_and_grpo_end_to_end(vlm_dir, tmp_path):
    "Arm G (SFT-L0 gated -> RL-L0) on the tiny VLM through the campaign runner's subprocess stages."
    env = {**os.environ, "PIXRL_CACHE": cache_with_data(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pixrl.pix.campaign", "run", "--arm", "G", "--model", str(vlm_dir), "--runs-root",
           str(tmp_path / "runs"), "--name", "vlm", "--smoke", "--levels", "0", "--probe-per-level", "2",
           "--probe-k", "2", "--num-generations", "4", "--groups-per-step", "1", "--max-new-tokens", "24", "--save-steps", "1"]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "runs" / "vlm"
    state = json.loads((run / "state.json").read_text())
    assert [s["name"] for s in state["stages"]] == ["sft-L0", "rl-L0"]
    sft, rl = state["stages"]
    assert sft["global_step"] == 2 and sft["gate"]["rule"] == "absolute"
    assert rl["status"] == "done" and rl["global_step"] == 2 and rl["time_shares"]["generation"] > 0
    # every probe ran on the attached image (prompts hold the image slot) and the trained stage is still a VLM
    base = json.loads((run / state["base_probe"]).read_text())
    assert base["overall"]["n_samples"] == 2 * 5 * 2
    final = load_policy(rl["final_dir"])
    assert final.vision and final.prompt_spec == TINY_VLM_PROMPT_SPEC
    hist = json.loads((run / "metrics_1.json").read_text())
    assert any("reward" in h for h in hist)


def test_pixrl_tiny_vl_name_builds_into_the_cache(tmp_path, monkeypatch):
    from pixrl.pix.policy import resolve_model
    monkeypatch.setenv("PIXRL_CACHE", str(tmp_path))
    p = Path(resolve_model("pixrl-tiny-vl"))
    assert p == tmp_path / "models" / "pixrl-tiny-vl" and (p / "config.json").exists()
    assert not list(p.parent.glob("*.tmp*"))               # built aside, then moved in whole
    pol = load_policy("pixrl-tiny-vl")
    assert pol.vision and pol.prompt_spec == TINY_VLM_PROMPT_SPEC
    assert resolve_model("pixrl-tiny-vl") == str(p)        # second use: the cached copy


def test_build_tiny_vlm_text_from_pixrl_tiny(tmp_path):
    "The transplant copies pixrl-tiny's language model exactly (new tokens at the mean embedding); a shape mismatch is refused."
    from transformers import AutoModelForCausalLM
    d = build_tiny_vlm(tmp_path / "vl", hidden=128, layers=4, intermediate=384, text_from=tiny_dir())
    vlm = load_policy(str(d)).model
    lm = AutoModelForCausalLM.from_pretrained(tiny_dir())
    src, dst = lm.model.state_dict(), vlm.model.language_model.state_dict()
    for k, v in src.items():
        if k.endswith("embed_tokens.weight"):
            assert torch.equal(dst[k][: v.shape[0]], v) and torch.allclose(dst[k][v.shape[0]:], v.mean(0).expand(3, -1))
        else:
            assert torch.equal(dst[k], v), k
    assert torch.equal(vlm.lm_head.weight, vlm.model.language_model.embed_tokens.weight)   # still tied
    with pytest.raises(ValueError, match="shape"):
        build_tiny_vlm(tmp_path / "bad", hidden=64, layers=4, intermediate=384, text_from=tiny_dir())
