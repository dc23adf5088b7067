"""pixrl.grpo: the advantage TRL trains with equals `pixrl.advantage.group_advantage` for the same rewards, under
every `scale_rewards` a campaign can choose; the loss settings a campaign names reach TRL's config."""
import tempfile

import numpy as np
import pytest
import torch

from pixrl.advantage import group_advantage
from pixrl.campaign import CampaignConfig, SCALE_REWARDS
from pixrl.grpo import PixGRPOTrainer, grpo_config, rl_dataset
from pixrl.policy import load_policy
from pixrl.tasks import load_split

G = 4
REWARDS = [0.05, 0.9, 0.3, 0.3,   0.0, 0.0, 0.0, 1.0,   0.5, 0.5, 0.5, 0.5]   # 3 groups of G; the last has zero std


def _knobs(cfg: CampaignConfig, **over) -> dict:
    return {"lr": cfg.lr, "num_generations": G, "groups_per_step": len(REWARDS) // G, "temperature": cfg.temperature,
            "max_new_tokens": 8, "seed": cfg.seed, "save_steps": cfg.save_steps, "scale_rewards": cfg.scale_rewards,
            "loss_type": cfg.loss_type, "beta": cfg.beta, "num_iterations": cfg.num_iterations, **over}


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
