"""pixrl.offset.probes adapters: pixrl's objective and lerobot's VQ-BeT layout (a stand-in head, no lerobot)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from pixrl.offset.data import load_split
from pixrl.offset.objective import ActionPolicy, JointPolicyObjective, fit_policy
from pixrl.offset.probes import (OffsetAdapter, ObjectiveAdapter, VQBeTAdapter, VQBeTTeacherForcing, as_adapter,
                                 cancellation_ratio, check_codes, checked_heads, conflict_surface, evaluate_policy,
                                 gather_offsets, paired_seed_ci, policy_outputs, seed_ci, vqbet_offset_table)
from pixrl.offset.tokenizer import ResidualVQ


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def small_objective():
    torch.set_num_threads(1)
    tr = load_split("train", 3000)
    tok = ResidualVQ(2, 8, 3).fit(tr.actions, iters=5)
    torch.manual_seed(0)
    obj = JointPolicyObjective(ActionPolicy(8, 2, 8, 3, hidden=16), tok, teacher_force_offset=False)
    fit_policy(obj, tr.states, tr.actions, steps=40, batch_size=128, log_every=40)
    return obj, load_split("validation", 400)


class StandInVQ(nn.Module):
    "lerobot VqVae's interface (2 RVQ layers, MLP decoder) on a toy scale."
    vqvae_num_layers = 2

    def __init__(self, n_codes, action_dim, latent=4):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.codebooks = nn.Parameter(torch.randn(2, n_codes, latent, generator=g), requires_grad=False)
        self.enc, self.dec = nn.Linear(action_dim, latent), nn.Sequential(nn.Linear(latent, 8), nn.ReLU(), nn.Linear(8, action_dim))

    def get_embeddings_from_code(self, idx):
        return self.codebooks[0][idx[:, 0]] + self.codebooks[1][idx[:, 1]]

    def get_action_from_latent(self, z):
        return self.dec(z)[:, None, :]                                  # (N, W=1, A)

    def get_code(self, state):
        z = self.enc(state.reshape(len(state), -1))
        c0 = torch.cdist(z, self.codebooks[0]).argmin(1)
        c1 = torch.cdist(z - self.codebooks[0][c0], self.codebooks[1]).argmin(1)
        return None, torch.stack([c0, c1], 1)


class StandInHead(nn.Module):
    "lerobot VQBeTHead's attributes and output layout: logits (N, G·C), offsets (N, G·C·W·A)."
    def __init__(self, n_codes=5, action_dim=3, feat=6, sequential=False):
        super().__init__()
        self.config = SimpleNamespace(vqvae_n_embed=n_codes, action_chunk_size=1, action_feature=SimpleNamespace(shape=(action_dim,)),
                                      bet_softmax_temperature=0.1, sequentially_select=sequential)
        self.vqvae_model = StandInVQ(n_codes, action_dim)
        self.map_to_cbet_preds_bin = nn.Linear(feat, 2 * n_codes)
        self.map_to_cbet_preds_offset = nn.Linear(feat, 2 * n_codes * action_dim)

    def forward(self, x):
        return {"cbet_logits": self.map_to_cbet_preds_bin(x.reshape(-1, x.shape[-1]))}

    def loss_fn(self, pred, target):
        return {"offset_loss": (pred["predicted_action"] - target.reshape(*target.shape[:2], -1)).abs().mean()}


def test_objective_adapter_is_the_objective(small_objective):
    obj, va = small_objective
    a, b = policy_outputs(obj, va.states, seed=3), policy_outputs(ObjectiveAdapter(obj), va.states, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    s1, _ = evaluate_policy(obj, va.states, va.actions, seed=1)
    s2, _ = evaluate_policy(as_adapter(obj), va.states, va.actions, seed=1)
    assert s1 == s2
    x = torch.as_tensor(va.states[:50])
    ref = obj._predict(obj.policy(x), sample_codes=False)
    assert np.allclose(b["argmax_action"][:50], np.clip(ref["action"].detach().numpy(), [0, 0, -1], [1, 1, 1]))
    tok = obj.tokenizer
    usage = tok.encode(torch.as_tensor(va.actions)).numpy()
    assert conflict_surface(tok, usage, b["argmax_codes"]) == conflict_surface(obj, usage, b["argmax_codes"])


def test_generic_decoded_table_and_gather_against_loops(small_objective):
    obj, va = small_objective
    ad = as_adapter(obj)
    codes = torch.tensor([[1, 7], [0, 0], [5, 2]])
    table = OffsetAdapter.decoded_table(ad, codes)                        # (3, 2, 8, 3)
    for b in range(3):
        for g in range(2):
            for c in range(8):
                sub = codes[b].clone()
                sub[g] = c
                assert torch.allclose(table[b, g, c], ad.decode(sub[None])[0])
    offs = torch.randn(3, 2, 8, 3)
    loop = torch.stack([sum(offs[b, g, codes[b, g]] for g in range(2)) for b in range(3)])
    assert torch.allclose(gather_offsets(offs, codes), loop)
    # R over the generic table equals R over the codebook (additive RVQ: a shift per state and group)
    assert torch.allclose(cancellation_ratio(table, offs), cancellation_ratio(ad.decoded_table(), offs), atol=1e-5)


def test_bad_input_named(small_objective):
    obj, va = small_objective
    x = torch.as_tensor(va.states[:4])

    class NoLogits(ObjectiveAdapter):
        def heads(self, inputs):
            return {"offsets": super().heads(inputs)["offsets"]}

    class OffsetsForTooManyCodes(ObjectiveAdapter):
        def heads(self, inputs):
            h = super().heads(inputs)
            return {"code_logits": h["code_logits"], "offsets": torch.cat([h["offsets"], h["offsets"]], 2)}

    class OnlyHeads(OffsetAdapter):
        n_groups, n_codes, action_dim = 2, 8, 3
        def heads(self, inputs):
            return {}

    with pytest.raises(ValueError, match="lacks \\['code_logits'\\]"):
        checked_heads(NoLogits(obj), x)
    with pytest.raises(ValueError, match=r"offsets \(4, 2, 16, 3\) do not match the code head: expected \(b, 2, 8, 3\)"):
        policy_outputs(OffsetsForTooManyCodes(obj), x)
    with pytest.raises(ValueError, match="does not implement decode, encode"):
        as_adapter(OnlyHeads())
    with pytest.raises(ValueError, match=r"\[0, 8\).*got range \[0, 8\]"):
        check_codes(torch.tensor([[0, 8]]), 2, 8)
    with pytest.raises(ValueError, match=r"\(b, 2\).*shape \(1, 3\)"):
        check_codes(torch.tensor([[0, 1, 2]]), 2, 8)
    with pytest.raises(ValueError, match=r"\[0, 8\).*\[-1, 0\]"):
        gather_offsets(torch.zeros(1, 2, 8, 3), torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match="range"):
        conflict_surface(obj, np.array([[0, 9]]))
    with pytest.raises(ValueError, match="OffsetAdapter"):
        as_adapter(object())


def test_vqbet_adapter_layout_and_units():
    torch.manual_seed(0)
    head = StandInHead()
    lo, hi = torch.tensor([0.0, 0.0, -1.0]), torch.tensor([1.0, 0.8, 1.0])
    ad = VQBeTAdapter(head, action_min=lo, action_max=hi)
    assert (ad.n_groups, ad.n_codes, ad.action_dim, ad.sampling_temperature) == (2, 5, 3, 0.1)
    x = torch.randn(7, 6)
    logits, offsets = checked_heads(ad, x)                                 # (7, 2, 5), (7, 2, 5, 3)
    flat = head.map_to_cbet_preds_offset(x)
    half = (hi - lo) / 2
    for b, g, c, a in [(0, 0, 0, 0), (3, 1, 4, 2), (6, 1, 2, 1)]:          # lerobot's "(G C WA)" layout, in action units
        assert torch.isclose(offsets[b, g, c, a], flat[b, (g * 5 + c) * 3 + a] * half[a])
    assert torch.equal(logits, head.map_to_cbet_preds_bin(x).view(7, 2, 5))
    codes = torch.tensor([[0, 4], [3, 1]])
    z = head.vqvae_model.codebooks[0][codes[:, 0]] + head.vqvae_model.codebooks[1][codes[:, 1]]
    assert torch.allclose(ad.decode(codes), lo + (head.vqvae_model.dec(z) + 1) * half)
    many = torch.randint(5, (60, 2), generator=torch.Generator().manual_seed(0))   # > 25 combinations: table path
    assert torch.allclose(ad.decode(many), ad._decode(many), atol=1e-6)
    acts = lo + torch.rand(9, 3) * (hi - lo)
    assert torch.allclose(ad.unnormalise(ad.normalise(acts)), acts, atol=1e-6)
    assert torch.equal(ad.encode(acts), head.vqvae_model.get_code(ad.normalise(acts)[:, None])[1])
    assert torch.equal(vqbet_offset_table(head, x[:, None]), flat.view(7, 2, 5, 3))
    with pytest.raises(ValueError, match="sequentially_select"):
        VQBeTAdapter(StandInHead(sequential=True))
    with pytest.raises(ValueError, match="both"):
        VQBeTAdapter(head, action_min=lo)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        VQBeTAdapter(head, action_min=lo[:2], action_max=hi[:2])


def test_teacher_forcing_mixin_gathers_at_ground_truth_codes():
    class TeacherForced(VQBeTTeacherForcing, StandInHead):
        pass
    torch.manual_seed(0)
    head = TeacherForced()
    x, target = torch.randn(8, 1, 6), torch.rand(8, 1, 1, 3) * 2 - 1        # (N, T, D), (N, T, W, A) normalised
    out = head(x)
    assert out["cbet_offsets"].shape == (8, 2, 5, 3)
    loss = head.loss_fn(out, target)["offset_loss"]
    _, gt = head.vqvae_model.get_code(target.reshape(8, 1, 3))
    flat = head.map_to_cbet_preds_offset(x[:, 0])
    ref = []
    for n in range(8):                                                      # plain loop: decode(gt) + Σ_g offsets[g, gt_g]
        pred = head.vqvae_model.dec(head.vqvae_model.get_embeddings_from_code(gt[n:n + 1]))[0]
        for g in range(2):
            pred = pred + flat[n, (g * 5 + gt[n, g]) * 3:(g * 5 + gt[n, g]) * 3 + 3]
        ref.append((pred - target[n, 0, 0]).abs().mean())
    assert torch.isclose(loss, torch.stack(ref).mean(), atol=1e-6)
    loss.backward()                                                         # the gradient reaches only ground-truth rows
    rows = head.map_to_cbet_preds_offset.weight.grad.abs().sum(1).view(2, 5, 3).sum(-1) > 0   # (G, C)
    used = torch.zeros(2, 5, dtype=torch.bool)
    for g in range(2):
        used[g, gt[:, g].unique()] = True
    assert torch.equal(rows, used)


def test_seed_intervals():
    ci = seed_ci([1.0, 2.0, 3.0])
    assert ci["mean"] == 2.0 and abs(ci["hi"] - (2 + 4.302653 / np.sqrt(3))) < 1e-5 and ci["n"] == 3
    d = paired_seed_ci([0.2, 0.3, 0.25], [1.0, 1.1, 1.06])
    assert d["lo"] > 0 and abs(d["mean"] - 0.8033333) < 1e-6
    with pytest.raises(ValueError, match="one per seed"):
        seed_ci([1.0])
    with pytest.raises(ValueError, match="one entry per seed"):
        paired_seed_ci([1.0, 2.0], [1.0, 2.0, 3.0])
