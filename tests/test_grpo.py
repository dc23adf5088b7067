"""pixrl.pix.grpo: the advantage TRL trains with equals `pixrl.advantage.group_advantage` for the same rewards, under
every `scale_rewards` a campaign can choose; the loss settings a campaign names reach TRL's config."""
import json, tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pixrl.advantage import group_advantage
from pixrl.pix.campaign import CampaignConfig, SCALE_REWARDS
import pixrl.pix.grpo
from pixrl.pix.grpo import LENGTH_BUCKETS, PixGRPOTrainer, grpo_config, lora_config, rl_dataset
from pixrl.pix.policy import load_policy
from pixrl.pix.tasks import load_split

G = 4
REWARDS = [0.05, 0.9, 0.3, 0.3,   0.0, 0.0, 0.0, 1.0,   0.5, 0.5, 0.5, 0.5]   # 3 groups of G; the last has zero std


def _knobs(cfg: CampaignConfig, **over) -> dict:
    return {"learning_rate": cfg.learning_rate, "num_generations": G, "groups_per_step": len(REWARDS) // G,
            "temperature": cfg.temperature, "max_new_tokens": 8, "seed": cfg.seed, "save_steps": cfg.save_steps,
            "scale_rewards": cfg.scale_rewards, "loss_type": cfg.loss_type, "beta": cfg.beta,
            "num_iterations": cfg.num_iterations, **over}


@pytest.fixture(scope="module")
def trainer():
    policy = load_policy("pixrl-tiny")
    tasks = [t for t in load_split("train") if t.level == 0][:3]
    fixed = iter([])

    def fixed_rewards(prompts=None, completions=None, **kw):
        return [next(fixed) for _ in completions]

    d = tempfile.mkdtemp()
    tr = PixGRPOTrainer(model=policy.model, reward_funcs=fixed_rewards, args=grpo_config(d, 1, **_knobs(CampaignConfig())),
                        train_dataset=rl_dataset(policy, tasks), processing_class=policy.tokenizer)
    rows = [row for row in rl_dataset(policy, tasks) for _ in range(G)]     # TRL's sampler: each prompt G times in a row

    def advantages(scale: str) -> np.ndarray:
        nonlocal fixed
        fixed = iter(REWARDS)
        tr.scale_rewards = scale
        with torch.no_grad():
            out = tr._generate_and_score_completions(rows)
        return out["advantages"].float().numpy()

    return advantages


@pytest.mark.parametrize("scale", SCALE_REWARDS)
def test_trl_advantages_equal_group_advantage(trainer, scale):
    ours = group_advantage(REWARDS, G, scale)
    np.testing.assert_allclose(trainer(scale), ours, rtol=1e-5, atol=1e-5)
    assert np.all(ours[8:] == 0.0)                       # a zero-std group gives no gradient


def test_campaign_loss_settings_reach_trl_config(tmp_path):
    cfg = grpo_config(tmp_path, 1, **_knobs(CampaignConfig(), scale_rewards="batch", loss_type="dr_grpo", beta=0.04))
    assert (cfg.scale_rewards, cfg.loss_type, cfg.beta) == ("batch", "dr_grpo", 0.04)
    default = grpo_config(tmp_path, 1, **_knobs(CampaignConfig()))
    assert (default.scale_rewards, default.loss_type, default.beta) == ("group", "dapo", 0.0)


def test_fast_rollouts_generate_from_a_merged_copy_and_train_the_adapter(tmp_path, monkeypatch):
    """fast_rollouts: each generation batch comes from a plain merged copy (dynamic KV cache); the peft model
    (the one the optimizer steps) never generates and is lent back after every batch."""
    policy = load_policy("pixrl-tiny")
    tasks = [t for t in load_split("train") if t.level == 0][:2]
    copies, peft_generates = [], []
    real = pixrl.pix.grpo.merged_copy

    peft_forwards = []                                   # forward calls of one of the peft model's LoRA layers

    def spy(model):
        m = real(model)
        calls = []
        gen = m.generate

        def generate(*a, **k):
            n = len(peft_forwards)
            out = gen(*a, **k)
            calls.append((k.get("generation_config"), len(peft_forwards) - n))
            return out
        m.generate = generate
        copies.append((m, calls))
        return m

    monkeypatch.setattr(pixrl.pix.grpo, "merged_copy", spy)
    args = grpo_config(tmp_path, 2, **_knobs(CampaignConfig(), groups_per_step=2))
    tr = PixGRPOTrainer(model=policy.model, reward_funcs=lambda completions=None, **kw: [float(sum(map(ord, c)) % 7) for c in completions],
                        args=args, train_dataset=rl_dataset(policy, tasks), processing_class=policy.tokenizer,
                        peft_config=lora_config(8), fast_rollouts=True)
    peft_model = tr.model_wrapped
    lora_layer = next(mod for mod in peft_model.modules() if hasattr(mod, "lora_A"))
    lora_layer.register_forward_hook(lambda *a: peft_forwards.append(1))
    pg = peft_model.generate
    peft_model.generate = lambda *a, **k: peft_generates.append(1) or pg(*a, **k)
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_B" in n}
    tr.train()
    assert tr.state.global_step == 2 and len(copies) == 2 and not peft_generates   # one merged copy per generation batch
    for m, calls in copies:
        assert m is not peft_model and not any("lora" in n for n, _ in m.named_parameters())
        assert len(calls) == 1 and calls[0][0].cache_implementation is None
        assert calls[0][1] == 0          # the copy ran its own layers (TRL's patched forward would run the peft model's)
    assert peft_forwards                                                        # ... which the loss then used
    assert tr.model_wrapped is peft_model                                       # lent back
    moved = [n for n, p in peft_model.named_parameters() if "lora_B" in n and not torch.equal(p, before[n])]
    assert moved                                                                # the adapter trained


def test_fast_rollouts_off_generates_from_the_peft_model(tmp_path, monkeypatch):
    policy = load_policy("pixrl-tiny")
    tasks = [t for t in load_split("train") if t.level == 0][:2]
    copies = []
    monkeypatch.setattr(pixrl.pix.grpo, "merged_copy", lambda m: copies.append(m) or m)
    args = grpo_config(tmp_path, 1, **_knobs(CampaignConfig(), groups_per_step=2))
    tr = PixGRPOTrainer(model=policy.model, reward_funcs=lambda completions=None, **kw: [0.0] * len(completions),
                        args=args, train_dataset=rl_dataset(policy, tasks), processing_class=policy.tokenizer,
                        peft_config=lora_config(8))
    tr.train()
    assert tr.state.global_step == 1 and not copies and args.cache_implementation is None


def test_shared_prefix_trains_the_same_adapter_as_trls_forward(tmp_path):
    """shared_prefix=True: two GRPO steps from one seed end with the adapter TRL's own forward gives (float rounding),
    and the loss's forward ran each group's prompt once (the first forward of a step sees one row per group)."""
    policy = load_policy("pixrl-tiny")
    tasks = [t for t in load_split("train") if t.level == 0][:2]
    adapters, head_rows = [], []
    for shared in (False, True):
        args = grpo_config(tmp_path / str(shared), 2, **_knobs(CampaignConfig(), groups_per_step=2, max_new_tokens=16))
        tr = PixGRPOTrainer(model=load_policy("pixrl-tiny").model,
                            reward_funcs=lambda completions=None, **kw: [float(sum(map(ord, c)) % 7) for c in completions],
                            args=args, train_dataset=rl_dataset(policy, tasks), processing_class=policy.tokenizer,
                            peft_config=lora_config(8), fast_rollouts=True, shared_prefix=shared)
        embed = tr.model_wrapped.get_input_embeddings()
        rows = []
        hook = embed.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]) if torch.is_grad_enabled() else None)
        tr.train()
        hook.remove()
        head_rows.append(rows)
        adapters.append({n: p.detach().clone() for n, p in tr.model_wrapped.named_parameters() if "lora_" in n})
    assert all(r == 2 * G for r in head_rows[0])                         # TRL: every row, every forward
    per_step = 1 + min(LENGTH_BUCKETS, 2 * G)                            # shared: the prompt pass, then the length buckets
    steps = [head_rows[1][i:i + per_step] for i in range(0, len(head_rows[1]), per_step)]
    assert len(steps) == 2 and all(s[0] == 2 and sum(s[1:]) == 2 * G for s in steps), head_rows[1]   # 2 prompts, 2·G tails
    moved = max((adapters[1][n] - p).abs().max().item() for n, p in adapters[0].items())
    assert moved < 1e-4, moved
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in adapters[1].items() if "lora_B" in n)


def test_shared_prefix_trains_a_llava_vlm_as_trls_forward(tmp_path, monkeypatch):
    """A LLaVA VLM (pixrl-tiny-vl): two GRPO steps with shared_prefix end at the weights TRL's forward gives (float
    rounding), and the shared forward ran, given each row's image."""
    from pixrl.pix.grpo import run_grpo
    from pixrl.pix.policy import resolve_model
    from safetensors.torch import load_file
    tasks = [t for t in load_split("train") if t.level == 0][:2]
    calls, inner = [], pixrl.pix.grpo.shared_prefix_logps
    def counted(*args, **images):
        calls.append(tuple(images["pixel_values"].shape))
        return inner(*args, **images)
    monkeypatch.setattr(pixrl.pix.grpo, "shared_prefix_logps", counted)
    finals = []
    for shared in (False, True):
        out = run_grpo(resolve_model("pixrl-tiny-vl"), tasks, tmp_path / str(shared), steps=2, lora_r=8,
                       reward="shaped_v3d", fast_rollouts=True, shared_prefix=shared,
                       **_knobs(CampaignConfig(), groups_per_step=2))
        finals.append(load_file(str(Path(out["final_dir"]) / "model.safetensors")))
    gap = max((finals[0][k] - finals[1][k]).abs().max().item() for k in finals[0])
    assert gap < 1e-4, gap
    assert len(calls) == 2 and all(c[0] == 2 * G for c in calls), calls        # one loss forward a step, an image a row


def test_shared_prefix_refuses_a_vlm_without_one_image_row_per_row(tmp_path):
    """A Qwen-VL-style policy (flattened patches): refused at the campaign's validation, naming its model type."""
    from pixrl.pix.campaign_config import validate
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (tmp_path / "pixrl.json").write_text(json.dumps({"prompt_spec": {"vision": True}}))
    with pytest.raises(ValueError, match="shared_prefix=True with .*'qwen2_5_vl' vision-language policy; accepted: a text policy or a VLM"):
        validate(CampaignConfig(model=str(tmp_path), shared_prefix=True, runs_root=str(tmp_path / "runs")))
