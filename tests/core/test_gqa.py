"""GQA panel data: Jensen-Shannon distance, head distances, within vs across groups, cached keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
from attnscope.core.analysis import gqa
from tiny_models import eager_reference, save_tiny


def test_js_distance_by_hand():
    assert gqa.js_distance([1.0, 0.0], [0.0, 1.0]) == pytest.approx(1.0)
    assert gqa.js_distance([0.3, 0.7], [0.3, 0.7]) == pytest.approx(0.0, abs=1e-12)
    # p = (1/2, 1/2), q = (1, 0): m = (3/4, 1/4)
    kl_p = 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25)
    kl_q = math.log2(1 / 0.75)
    assert gqa.js_distance([0.5, 0.5], [1.0, 0.0]) == pytest.approx(math.sqrt(0.5 * kl_p + 0.5 * kl_q))
    assert gqa.js_distance([0.5, 0.5], [1.0, 0.0]) == pytest.approx(0.5579230, abs=1e-6)
    # symmetric, rows along the last axis
    p = np.array([[0.2, 0.8, 0.0], [0.1, 0.1, 0.8]])
    q = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    d = gqa.js_distance(p, q)
    assert d.shape == (2,) and d[1] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(d, gqa.js_distance(q, p))


def test_group_summary_by_hand():
    # 4 heads in 2 groups of 2: within pairs (0,1), (2,3); across (0,2), (0,3), (1,2), (1,3)
    d = np.zeros((4, 4))
    for (i, j), v in {(0, 1): 0.1, (2, 3): 0.3, (0, 2): 0.5, (0, 3): 0.6, (1, 2): 0.7, (1, 3): 0.8}.items():
        d[i, j] = d[j, i] = v
    within, wm, am = gqa.group_summary(d, 2)
    np.testing.assert_allclose(within, [0.1, 0.3])
    assert wm == pytest.approx(0.2) and am == pytest.approx(0.65)
    within, wm, am = gqa.group_summary(d, 1)  # MHA: no within-group pairs
    assert np.isnan(wm) and am == pytest.approx(d[np.triu_indices(4, 1)].mean())


def test_sample_rows():
    np.testing.assert_array_equal(gqa.sample_rows(5, 10), [1, 2, 3, 4])
    np.testing.assert_array_equal(gqa.sample_rows(1000, 10), np.arange(990, 1000))  # the last rows, one band


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("tiny_gqa")
    model = save_tiny("llama", folder, seed=5)
    s = Session.load(str(folder))
    s.prefill("grouped query attention shares keys", chat_template=False)
    s.step(2)
    _, att = eager_reference(model, s.ids)
    return s, np.stack(att), model


def _brute(att_layer: np.ndarray, rows: np.ndarray) -> np.ndarray:
    H = att_layer.shape[0]
    d = np.zeros((H, H))
    for i in range(H):
        for j in range(H):
            d[i, j] = gqa.js_distance(att_layer[i, rows], att_layer[j, rows]).mean()
    return d


def test_head_distances_equal_brute_force_on_eager(tiny):
    s, att, _ = tiny
    T = s.seq_len
    for layer in range(2):
        d = gqa.head_distances(s, layer, block_rows=7)  # several bands
        np.testing.assert_allclose(d, _brute(att[layer], np.arange(1, T)), atol=1e-5)
        assert np.all(np.diag(d) == 0) and np.allclose(d, d.T)
    # cropped to a step and a row sample
    rows = np.array([2, 3, 4, 9, 10])
    d = gqa.head_distances(s, 1, n=T - 1, rows=rows)
    np.testing.assert_allclose(d, _brute(att[1, :, : T - 1, : T - 1], rows), atol=1e-5)


def test_group_report_tiny(tiny):
    s, att, model = tiny
    T = s.seq_len
    r = gqa.group_report(s, 1, 1, all_layers=True, layer_rows=1000)
    assert r.heads == (2, 3) and r.n == T and not r.pooled
    np.testing.assert_allclose(r.maps, att[1, 2:4], atol=2e-6)
    assert r.within[1] == pytest.approx(r.distances[2, 3])
    assert r.across_mean == pytest.approx(np.mean([r.distances[i, j] for i in (0, 1) for j in (2, 3)]))
    assert r.layers_within[1] == pytest.approx(r.within_mean) and r.layers_across.shape == (2,)
    # keys: the KV cache's post-RoPE keys of KV head 1 = k_proj + RoPE recomputed with transformers' own functions
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        h = model(torch.tensor([s.ids]), output_hidden_states=True).hidden_states[1]  # input of layer 1
        attn = model.model.layers[1].self_attn
        x = model.model.layers[1].input_layernorm(h)
        k = attn.k_proj(x).view(1, T, 2, -1).transpose(1, 2)
        q = attn.q_proj(x).view(1, T, 4, -1).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x, torch.arange(T)[None])
        _, k = apply_rotary_pos_emb(q, k, cos, sin)
    np.testing.assert_allclose(r.keys, k[0, 1].numpy(), atol=1e-5)
    # pooled maps for longer sequences than `size`
    r2 = gqa.group_report(s, 0, 0, size=8)
    assert r2.pooled and r2.maps.shape == (2, 8, 8) and r2.keys.shape[0] == 8
    with pytest.raises(IndexError):
        gqa.group_report(s, 0, 2)


@pytest.mark.slow  # loads a second SmolLM2 (eager); the fast lane has test_group_report_tiny and brute force
def test_group_report_smollm2_against_eager(smol_ran, smol_folder):
    """SmolLM2 (9 query heads, 3 KV heads): distances vs brute force on transformers eager weights."""
    import torch
    from transformers import AutoModelForCausalLM

    s = smol_ran
    model = AutoModelForCausalLM.from_pretrained(
        smol_folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        att = model(torch.tensor([s.ids]), output_attentions=True).attentions
    T = s.seq_len
    for layer in (0, 14):
        a = att[layer][0].float().numpy()
        r = gqa.group_report(s, layer, 2)
        assert r.heads == (6, 7, 8)
        expect = _brute(a, np.arange(1, T))
        np.testing.assert_allclose(r.distances, expect, atol=1e-4)
        within, wm, am = gqa.group_summary(expect, 3)
        np.testing.assert_allclose(r.within, within, atol=1e-4)
        assert r.across_mean == pytest.approx(am, abs=1e-4)
        assert 0 < r.distances[6, 7] < 1


def test_group_report_and_mask_on_mlx(tmp_path):
    """The same panels' data from the MLX backend (keys read from MLX's cache) equal eager."""
    pytest.importorskip("mlx.core")
    from attnscope.core.analysis.maskview import mask_report
    from attnscope.core.session import Session

    model = save_tiny("llama", tmp_path, seed=2)
    s = Session.load(str(tmp_path), backend="mlx")
    s.prefill("hello mlx world", chat_template=False)
    s.step(2)
    _, att = eager_reference(model, s.ids)
    r = gqa.group_report(s, 1, 1)
    np.testing.assert_allclose(r.maps, att[1][2:4], atol=2e-6)
    assert r.keys.shape == (s.seq_len, 16) and r.keys.dtype == np.float32
    np.testing.assert_allclose(r.distances, _brute(att[1], np.arange(1, s.seq_len)), atol=1e-5)
    m = mask_report(s, 1, 3, 2)
    np.testing.assert_allclose(m.weights[0], att[1][3, -1], atol=2e-6)
