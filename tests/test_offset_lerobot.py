"""lerobot's own VQBeTHead through pixrl.offset.probes (the optional environment of `make lerobot-env`).

Skipped, with the reason, when that environment is absent; `make offset-lerobot` runs it before the notebook.
"""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import lerobot_env  # noqa: E402

from pixrl.offset.probes import (VQBeTAdapter, VQBeTTeacherForcing, checked_heads, conflict_surface,  # noqa: E402
                                 evaluate_policy, gather_offsets)

REASON = lerobot_env.missing_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"lerobot check skipped: {REASON}"),
              pytest.mark.usefixtures("one_torch_thread")]   # tests/conftest.py


@pytest.fixture(scope="module")
def lr():
    torch.set_num_threads(1)
    return lerobot_env.load()


def config(lr, **kw):
    return lr.VQBeTConfig(
        input_features={"observation.state": lr.PolicyFeature(lr.FeatureType.STATE, (8,)),
                        "observation.image": lr.PolicyFeature(lr.FeatureType.VISUAL, (3, 32, 32))},
        output_features={"action": lr.PolicyFeature(lr.FeatureType.ACTION, (3,))},
        n_obs_steps=1, n_action_pred_token=1, action_chunk_size=1, crop_shape=None, gpt_output_dim=16, **kw)


@pytest.fixture(scope="module")
def head(lr):
    torch.manual_seed(0)
    h = lr.VQBeTHead(config(lr))
    actions = torch.rand(512, 1, 3) * 2 - 1
    for _ in range(3):                                           # a few VQ-VAE steps: EMA codebooks off their init
        h.discretize(3, actions)
    h.eval()
    return h


def test_versions(lr):
    assert lr.version == lerobot_env.LEROBOT_VERSION and lr.versions["lerobot"] == lr.version
    assert lr.modeling_file.startswith(lr.dir)                   # lerobot's own file, from the private folder
    assert "lerobot" not in {p.split("/")[-1] for p in sys.path if "site-packages" in p}


def test_adapter_reproduces_lerobots_forward(lr, head):
    x = torch.randn(32, 16)
    torch.manual_seed(1)
    out = head(x[:, None])                                       # lerobot: sampled codes, decode + their offsets
    ad = VQBeTAdapter(head)                                      # no stats: normalised units, as lerobot's forward
    logits, offsets = checked_heads(ad, x)
    assert torch.allclose(logits, out["cbet_logits"])
    codes = out["sampled_centers"]
    mine = ad.decode(codes) + gather_offsets(offsets, codes)
    assert torch.allclose(mine, out["predicted_action"][:, 0], atol=1e-5)
    assert torch.allclose(ad.decode(codes), out["decoded_action"][:, 0], atol=1e-5)
    acts = torch.rand(20, 3) * 2 - 1
    assert torch.equal(ad.encode(acts), head.vqvae_model.get_code(acts[:, None])[1])
    s = conflict_surface(ad, ad.encode(acts).numpy(), logits.argmax(-1).numpy())
    assert s["n_combinations"] == 256
    summary, _ = evaluate_policy(ad, x[:20], acts.numpy() * 0.5 + 0.5)
    assert np.isfinite(summary["R_median"])


def test_teacher_forced_head_changes_only_the_offset_loss(lr, head):
    class TeacherForcedVQBeTHead(VQBeTTeacherForcing, lr.VQBeTHead):
        pass
    tf = TeacherForcedVQBeTHead(head.config)
    tf.load_state_dict(head.state_dict())
    tf.eval()
    x, target = torch.randn(64, 1, 16), torch.rand(64, 1, 1, 3) * 2 - 1
    torch.manual_seed(2)
    shipped = head.loss_fn(head(x), target)
    torch.manual_seed(2)
    forced = tf.loss_fn(tf(x), target)
    assert shipped["classification_loss"] == forced["classification_loss"]     # focal loss untouched
    _, gt = head.vqvae_model.get_code(target[:, 0])
    ad = VQBeTAdapter(head)
    _, offsets = checked_heads(ad, x[:, 0])
    ref = (ad.decode(gt) + gather_offsets(offsets, gt) - target[:, 0, 0]).abs().mean()
    assert abs(forced["offset_loss"] - float(ref.detach())) < 1e-5               # L1 at the ground-truth codes
    assert abs(shipped["offset_loss"] - forced["offset_loss"]) > 1e-4   # the shipped loss is not that
    # gradients of the offset loss: teacher-forced -> only rows of ground-truth codes; shipped -> rows of sampled codes
    tf.zero_grad()
    torch.manual_seed(3)
    out = tf(x)
    tf.loss_fn(out, target)["loss"].backward()
    weight = tf.map_to_cbet_preds_offset[0].weight                     # lerobot's MLP: one Linear, rows (G C WA)
    rows = weight.grad.abs().sum(1).view(2, tf.config.vqvae_n_embed, 3).sum(-1) > 0
    used = torch.zeros_like(rows)
    for g in range(2):
        used[g, gt[:, g].unique()] = True
    assert torch.equal(rows, used)
    head.zero_grad()
    torch.manual_seed(3)
    out = head(x)
    head.loss_fn(out, target)["loss"].backward()
    rows = head.map_to_cbet_preds_offset[0].weight.grad.abs().sum(1).view(2, head.config.vqvae_n_embed, 3).sum(-1) > 0
    sampled = torch.zeros_like(rows)
    for g in range(2):
        sampled[g, out["sampled_centers"][:, g].unique()] = True
    assert torch.equal(rows, sampled)                                   # shipped: the rows of the sampled codes
    head.zero_grad()
