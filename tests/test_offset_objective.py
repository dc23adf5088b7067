"""pixrl.offset.objective: the teacher-forced offset loss (seed PR #258 tests, re-created).

gather correctness · bit-exact `_predict` regression against the pre-refactor monolithic implementation
(seeded multinomial included) · gradient routing · teacher_force_offset=False == the old loss ·
the logged metric carries no gradient · offset_scale bound/identity · clear errors on bad input."""
import pytest
import torch
import torch.nn.functional as F

from pixrl.offset.objective import ActionPolicy, JointPolicyObjective, bounded_offset, focal_loss
from pixrl.offset.tokenizer import ResidualVQ, TokenizerNotFittedError

G, C, A, S = 3, 5, 3, 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tests/conftest.py


@pytest.fixture()
def setup():
    torch.manual_seed(0)
    actions = torch.rand(400, A)
    tok = ResidualVQ(G, C, A).fit(actions, iters=5, seed=0)
    policy = ActionPolicy(S, G, C, A, hidden=16)
    with torch.no_grad():  # non-trivial offsets, so a wrong gather would show
        policy.offset_head.weight.normal_(0, 0.3)
        policy.offset_head.bias.normal_(0, 0.3)
    states = torch.randn(64, S)
    return tok, policy, states, actions[:64]


# --- the pre-refactor implementation, kept verbatim in spirit: one monolithic _predict -----------------
def pre_refactor_predict(obj, features, sample_codes=True, generator=None):
    p, tok = obj.policy, obj.tokenizer
    b = features.shape[0]
    code_logits = p.code_head(features).view(b, p.n_groups, p.n_codes)
    offsets = p.offset_head(features).view(b, p.n_groups, p.n_codes, p.action_dim)
    if sample_codes:
        probs = torch.softmax(code_logits, dim=-1)
        codes = torch.multinomial(probs.reshape(-1, p.n_codes), 1, generator=generator).view(b, p.n_groups)
    else:
        codes = torch.argmax(code_logits, dim=-1)
    decoded = tok.decode(codes)
    offset = offsets[torch.arange(b)[:, None], torch.arange(p.n_groups)[None, :], codes].sum(1)
    return dict(code_logits=code_logits, offsets=offsets, codes=codes, decoded=decoded, offset=offset,
                action=decoded + offset)


def pre_refactor_loss(obj, states, actions, generator=None):
    "The old objective: focal at target codes + L1 of the reconstruction at SAMPLED codes."
    target = obj.tokenizer.encode(actions)
    out = pre_refactor_predict(obj, obj.policy(states), True, generator)
    focal = sum(w * focal_loss(out["code_logits"][:, g], target[:, g], obj.focal_gamma) for g, w in enumerate(obj.group_weights))
    return focal + obj.offset_weight * F.l1_loss(out["action"], actions)


def test_gather_offset_hand_computed():
    offs = torch.arange(2 * 2 * 3 * 2, dtype=torch.float32).view(2, 2, 3, 2)  # (b, g, c, a)
    codes = torch.tensor([[0, 2], [1, 1]])
    # frame 0: offs[0,0,0]=[0,1] + offs[0,1,2]=[10,11]; frame 1: offs[1,0,1]=[14,15] + offs[1,1,1]=[20,21]
    got = JointPolicyObjective._gather_offset(offs, codes)
    assert got.tolist() == [[10.0, 12.0], [34.0, 36.0]]
    # and against a plain loop on a random table
    offs = torch.randn(7, G, C, A)
    codes = torch.randint(C, (7, G))
    loop = torch.stack([sum(offs[b, g, codes[b, g]] for g in range(G)) for b in range(7)])
    assert torch.allclose(JointPolicyObjective._gather_offset(offs, codes), loop)


@pytest.mark.parametrize("sample", [True, False])
@pytest.mark.parametrize("offset_scale", [None, 0.5])
def test_predict_bit_exact_vs_pre_refactor(setup, sample, offset_scale):
    tok, policy, states, _ = setup
    obj = JointPolicyObjective(policy, tok, offset_scale=offset_scale)
    feats = policy(states)
    new = obj._predict(feats, sample_codes=sample, generator=torch.Generator().manual_seed(123))
    # the pre-refactor code had no bound: with offset_scale set, the raw table is compared through the bound
    ref = pre_refactor_predict(JointPolicyObjective(policy, tok), feats, sample, torch.Generator().manual_seed(123))
    if offset_scale is not None:
        ref["offsets"] = bounded_offset(ref["offsets"], offset_scale)
        ref["offset"] = JointPolicyObjective._gather_offset(ref["offsets"], ref["codes"])
        ref["action"] = ref["decoded"] + ref["offset"]
    for k in ("code_logits", "offsets", "codes", "decoded", "offset", "action"):
        assert torch.equal(new[k], ref[k]), k
    assert new["offsets"].shape == (len(states), G, C, A)  # the full table is exposed


def test_teacher_force_false_equals_old_loss(setup):
    tok, policy, states, actions = setup
    obj = JointPolicyObjective(policy, tok, teacher_force_offset=False)
    loss, metrics = obj(states, actions, generator=torch.Generator().manual_seed(7))
    old = pre_refactor_loss(obj, states, actions, generator=torch.Generator().manual_seed(7))
    assert torch.equal(loss, old)
    # and the gradients are identical too
    g_new = torch.autograd.grad(loss, list(policy.parameters()))
    g_old = torch.autograd.grad(pre_refactor_loss(obj, states, actions, torch.Generator().manual_seed(7)), list(policy.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(g_new, g_old))
    # in the bug arm the logged sampled reconstruction IS the optimised offset loss
    assert torch.equal(metrics["metric/offset_sampled_recon"], metrics["loss/offset"])


def test_teacher_forced_loss_is_gathered_at_target_codes(setup):
    tok, policy, states, actions = setup
    obj = JointPolicyObjective(policy, tok, teacher_force_offset=True)
    parts = obj.losses(states, actions, generator=torch.Generator().manual_seed(7))
    target = tok.encode(actions)
    offsets = parts["out"]["offsets"]
    by_hand = torch.stack([tok.decode(target[b]) + sum(offsets[b, g, target[b, g]] for g in range(G)) for b in range(len(actions))])
    assert torch.allclose(parts["offset"], (by_hand - actions).abs().mean())
    assert not torch.allclose(parts["offset"], parts["sampled_recon"])  # a different quantity than the old loss


@pytest.mark.parametrize("teacher_force", [True, False])
def test_gradient_routing(setup, teacher_force):
    tok, policy, states, actions = setup
    obj = JointPolicyObjective(policy, tok, teacher_force_offset=teacher_force)
    before = tok.codebooks.clone()
    parts = obj.losses(states, actions, generator=torch.Generator().manual_seed(3))
    # offset loss -> offset head only (plus the shared trunk); no gradient to the code head
    g = torch.autograd.grad(parts["offset"], [policy.offset_head.weight, policy.code_head.weight, policy.code_head.bias],
                            retain_graph=True, allow_unused=True)
    assert g[0] is not None and g[0].abs().sum() > 0
    assert all(x is None or x.abs().sum() == 0 for x in g[1:])
    # focal -> code head only; no gradient to the offset head
    g = torch.autograd.grad(parts["focal"], [policy.code_head.weight, policy.offset_head.weight, policy.offset_head.bias],
                            retain_graph=True, allow_unused=True)
    assert g[0] is not None and g[0].abs().sum() > 0
    assert all(x is None or x.abs().sum() == 0 for x in g[1:])
    # tokenizer frozen: no parameters at all, codebooks untouched by a full optimiser step
    assert list(tok.parameters()) == [] and not tok.codebooks.requires_grad
    opt = torch.optim.SGD(obj.parameters(), lr=1.0)
    loss, _ = obj(states, actions, generator=torch.Generator().manual_seed(3))
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.equal(tok.codebooks, before) and tok.codebooks.grad is None


@pytest.mark.parametrize("teacher_force", [True, False])
def test_logged_metric_carries_no_gradient(setup, teacher_force):
    tok, policy, states, actions = setup
    obj = JointPolicyObjective(policy, tok, teacher_force_offset=teacher_force)
    loss, metrics = obj(states, actions, generator=torch.Generator().manual_seed(1))
    assert loss.requires_grad
    for name, v in metrics.items():
        assert not v.requires_grad and v.grad_fn is None, name
    assert "metric/offset_sampled_recon" in metrics


def test_offset_scale_bounds_and_identity(setup):
    x = torch.linspace(-50, 50, 10001)
    for s in (0.05, 0.3, 2.0):
        y = bounded_offset(x, s)
        assert y.abs().max() <= s and torch.all(y[1:] >= y[:-1])                # bounded, monotone
        small = x[x.abs() < 1e-3 * s] if (x.abs() < 1e-3 * s).any() else torch.tensor([1e-4 * s])
        assert torch.allclose(bounded_offset(small, s), small, rtol=1e-5, atol=0)  # identity for |x| << s
    tok, policy, states, _ = setup
    with torch.no_grad():
        policy.offset_head.bias.fill_(100.0)
    obj = JointPolicyObjective(policy, tok, offset_scale=0.1)
    _, table = obj._heads(policy(states))
    assert table.abs().max() <= 0.1 + 1e-7


def test_bad_input_errors(setup):
    tok, policy, states, actions = setup
    with pytest.raises(TokenizerNotFittedError, match="not fitted|fit"):
        JointPolicyObjective(policy, ResidualVQ(G, C, A))
    assert issubclass(TokenizerNotFittedError, ValueError)
    with pytest.raises(ValueError, match="action_dim"):
        JointPolicyObjective(ActionPolicy(S, G, C, A + 1, hidden=8), tok)
    for bad in (0, 0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="offset_scale"):
            JointPolicyObjective(policy, tok, offset_scale=bad)
    obj = JointPolicyObjective(policy, tok)
    with pytest.raises(ValueError, match="actions must be"):
        obj(states, actions[:, :2])
    with pytest.raises(ValueError, match="states must be"):
        obj(states[:, :2], actions)
    with pytest.raises(ValueError, match="action_dim"):
        tok.encode(actions[:, :2])
    with pytest.raises(TokenizerNotFittedError):
        ResidualVQ(G, C, A).decode(torch.zeros(2, G, dtype=torch.long))
