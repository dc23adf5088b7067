"""pixrl.offset.probes and pixrl.offset.data: probe math against plain loops and hand-computed cases."""
import numpy as np
import pytest
import torch

from pixrl.offset.data import load_split, pedal_conflict, data_digest
from pixrl.offset.probes import (cancellation_ratio, offset_decode_regression, conflict_surface,
                                 conflict_filtered_tokenizer, pedal_report, residual_unimodality)
from pixrl.offset.tokenizer import ResidualVQ


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tests/conftest.py


def test_cancellation_ratio_hand_and_loop():
    dec = torch.tensor([[[0.0], [1.0]]])
    offs = torch.tensor([[[[0.0], [0.0]]], [[[0.5], [-0.5]]], [[[0.0], [-0.5]]]])
    assert torch.allclose(cancellation_ratio(dec, offs), torch.tensor([1.0, 0.0, 0.25]))
    g = torch.Generator().manual_seed(0)
    d, o, w = torch.randn(2, 4, 3, generator=g), torch.randn(5, 2, 4, 3, generator=g), torch.rand(5, 2, 4, generator=g)
    def wvar(x, w):
        w = w / w.sum()
        m = (w * x).sum()
        return (w * (x - m) ** 2).sum()
    loop = torch.stack([sum(wvar(d[gi, :, a] + o[b, gi, :, a], w[b, gi]) for gi in range(2) for a in range(3)) /
                        sum(wvar(d[gi, :, a], w[b, gi]) for gi in range(2) for a in range(3)) for b in range(5)])
    assert torch.allclose(cancellation_ratio(d, o, w), loop, atol=1e-6)
    # a perfect negative copy of the codebook: R = 0, slope = corr = -1
    reg = offset_decode_regression(d, -d[None].expand(5, -1, -1, -1) + 0.3)
    assert abs(reg["slope"] + 1) < 1e-6 and abs(reg["corr"] + 1) < 1e-6
    with pytest.raises(ValueError, match="decoded"):
        cancellation_ratio(torch.zeros(2, 5, 3), o)


def test_pedal_report_and_surface():
    pred = np.array([[0.5, 0.5, 0], [0.03, 0.0, 0], [0.0, 0.2, 0], [0.015, 0.015, 0]])
    gt = np.array([[0.5, 0.0, 0], [0.0, 0.0, 0], [0.0, 0.2, 0], [0.0, 0.0, 0]])
    r = pedal_report({"p": pred}, gt, np.arange(4.0)).query("bucket == 'all'").set_index("threshold")
    assert r.loc[0.01, "conflict"] == 0.5 and r.loc[0.02, "conflict"] == 0.25 and r.loc[0.05, "conflict"] == 0.25
    assert (r.gt_conflict == 0).all()
    with pytest.raises(ValueError, match="shape"):
        pedal_report({"p": pred[:, :2]}, gt, np.arange(4.0))
    tr = load_split("train", 5000)
    tok = ResidualVQ(4, 16, 3).fit(tr.actions, iters=8)
    usage = tok.encode(torch.tensor(tr.actions)).numpy()
    s = conflict_surface(tok, usage, usage[:100])
    assert s["n_combinations"] == 65536 and 0 < s["gt_decode_rate"] < 0.2 and s["policy_argmax_hit_rate"] == 1.0
    assert s["usage_weighted_conflict@0.01"] < s["conflict_fraction@0.01"]
    clean = conflict_filtered_tokenizer(tr.actions, iters=8)
    cb = clean.codebooks
    assert not ((cb[..., 0] > 0.01) & (cb[..., 1] > 0.01)).any()  # no single code presses both pedals
    table, hist, edges = residual_unimodality(tok, tr.actions)
    assert len(table) == 16 and hist.shape == (16, 3, len(edges) - 1) and hist.sum() == 3 * len(tr.actions)


def test_data_invariants():
    d = load_split("train", 3000)
    assert not pedal_conflict(d.actions, 0.0).any()
    assert data_digest(d) == data_digest(load_split("train", 3000)) != data_digest(load_split("validation", 3000))
    with pytest.raises(ValueError, match="split"):
        load_split("test", 10)
