"""pixrl.pix.grpo: the advantage TRL trains with equals `pixrl.advantage.group_advantage` for the same rewards, under
every `scale_rewards` a campaign can choose; the loss settings a campaign names reach TRL's config."""
import tempfile

import numpy as np
import pytest
import torch

from pixrl.advantage import group_advantage
from pixrl.pix.campaign import CampaignConfig, SCALE_REWARDS
import pixrl.pix.grpo
from pixrl.pix.grpo import PixGRPOTrainer, grpo_config, lora_config, rl_dataset
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
