"""Mask panel data: the applied mask per step (L != S offset in decode, sliding window), scores, weights, entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from attnscope.core.analysis.maskview import entropy_nats, mask_report, step_geometry
from tiny_models import eager_reference, save_tiny


def _session(tmp_path_factory, family, seed=0):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp(f"tiny_mask_{family}")
    model = save_tiny(family, folder, seed=seed)
    s = Session.load(str(folder))
    s.prefill("mask me, please", chat_template=False)
    s.step(3)
    _, att = eager_reference(model, s.ids)
    return s, np.stack(att), model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _session(tmp_path_factory, "llama")


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return _session(tmp_path_factory, "mistral")  # sliding_window = 4


def test_step_geometry():
    assert step_geometry(10, 3, 0) == ("prefill", 10, 10)
    assert step_geometry(10, 3, 1) == ("decode", 1, 11)
    assert step_geometry(10, 3, 3) == ("decode", 1, 13)
    with pytest.raises(IndexError):
        step_geometry(10, 3, 4)


def test_entropy_by_hand():
    w = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    np.testing.assert_allclose(entropy_nats(w), [0.0, math.log(2), 1.5 * math.log(2)], rtol=1e-6)


def test_decode_step_mask_is_offset_tril(llama):
    s, att, _ = llama
    n0 = s.n_prompt
    for t in (1, 2, 3):
        r = mask_report(s, 1, 2, t)
        S = n0 + t
        assert (r.kind, r.L, r.S, r.offset, r.row_start, r.row_stop) == ("decode", 1, S, S - 1, S - 1, S)
        # tril with k = S - L: the single decode query sees every cached key
        np.testing.assert_array_equal(r.allowed, np.tril(np.ones((1, S), bool), k=S - 1))
        assert r.allowed.all()
        assert f"tril(ones(1, {S}), k = {S} − 1 = {S - 1})" in r.formula
        np.testing.assert_allclose(r.weights[0], att[1, 2, S - 1, :S], atol=2e-6)
        np.testing.assert_allclose(r.entropy, entropy_nats(att[1, 2, S - 1 : S, :S]), atol=1e-5)
        assert r.max_entropy[0] == pytest.approx(math.log(S))


def test_prefill_mask_scores_weights(llama):
    s, att, model = llama
    n0 = s.n_prompt
    r = mask_report(s, 0, 3, 0)
    assert (r.kind, r.L, r.S, r.offset) == ("prefill", n0, n0, 0)
    np.testing.assert_array_equal(r.allowed, np.tril(np.ones((n0, n0), bool)))
    assert np.all(np.isneginf(r.scores[~r.allowed])) and np.all(np.isfinite(r.scores[r.allowed]))
    # softmax of the scores is eager's weights
    e = np.exp(r.scores - r.scores.max(1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(1, keepdims=True), att[0, 3, :n0, :n0], atol=2e-6)
    np.testing.assert_allclose(r.weights, att[0, 3, :n0, :n0], atol=2e-6)
    np.testing.assert_allclose(r.entropy, entropy_nats(att[0, 3, :n0, :n0]), atol=1e-5)
    np.testing.assert_allclose(r.max_entropy, np.log(np.arange(1, n0 + 1)), rtol=1e-6)
    # scores = q . k * scale, with q and k recomputed by transformers' own layer-0 projections + RoPE
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        emb = model.model.embed_tokens(torch.tensor([s.ids[:n0]]))
        lyr = model.model.layers[0]
        x = lyr.input_layernorm(emb)
        q = lyr.self_attn.q_proj(x).view(1, n0, 4, -1).transpose(1, 2)
        k = lyr.self_attn.k_proj(x).view(1, n0, 2, -1).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x, torch.arange(n0)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        ref = (q[0, 3] @ k[0, 3 // 2].T).numpy() / math.sqrt(q.shape[-1])
    assert r.scale == pytest.approx(1 / math.sqrt(16))
    np.testing.assert_allclose(r.scores[r.allowed], ref[r.allowed], atol=1e-4)
    # only the last rows when asked
    r5 = mask_report(s, 0, 3, 0, max_rows=5)
    assert (r5.row_start, r5.row_stop) == (n0 - 5, n0) and r5.allowed.shape == (5, n0)
    np.testing.assert_array_equal(r5.allowed, r.allowed[-5:])


def test_sliding_window_mask(mistral):
    s, att, _ = mistral
    n0 = s.n_prompt
    r = mask_report(s, 1, 1, 0)
    assert r.sliding_window == 4 and "j > i + 0 − 4" in r.formula
    i, j = np.indices((n0, n0))
    np.testing.assert_array_equal(r.allowed, (j <= i) & (j > i - 4))
    np.testing.assert_allclose(r.weights, att[1, 1, :n0, :n0], atol=2e-6)
    np.testing.assert_allclose(r.max_entropy, np.log(np.minimum(np.arange(1, n0 + 1), 4)), rtol=1e-6)
    d = mask_report(s, 1, 1, 2)
    S = n0 + 2
    assert d.L == 1 and d.S == S
    np.testing.assert_array_equal(d.allowed[0], np.arange(S) > S - 1 - 4)  # only the last 4 keys
    np.testing.assert_allclose(d.weights[0], att[1, 1, S - 1, :S], atol=2e-6)
    assert np.isneginf(d.scores[0, : S - 4]).all()


def test_bad_selection(llama):
    s, _, _ = llama
    with pytest.raises(IndexError):
        mask_report(s, 2, 0, 0)
    with pytest.raises(IndexError):
        mask_report(s, 0, 4, 0)
    with pytest.raises(IndexError):
        mask_report(s, 0, 0, 4)


@pytest.mark.slow  # loads a second SmolLM2 (eager); the tiny llama/mistral tests above cover the same panels
def test_smollm2_mask_and_aggregates_against_eager(smol_session, smol_folder):
    """SmolLM2: the decode-step row, prefill rows, entropies and a KV-group mean vs transformers eager."""
    import torch
    from attnscope.core.analysis.aggregate import map_at
    from transformers import AutoModelForCausalLM

    s = smol_session
    s.prefill("Grouped-query attention lets nine query heads share three KV heads.", chat_template=False)
    s.step(2)
    model = AutoModelForCausalLM.from_pretrained(
        smol_folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        att = [a[0].float().numpy() for a in model(torch.tensor([s.ids]), output_attentions=True).attentions]
    n0, T = s.n_prompt, s.seq_len
    d = mask_report(s, 11, 5, 2)
    assert (d.L, d.S, d.offset) == (1, T, T - 1) and d.allowed.all()
    np.testing.assert_allclose(d.weights[0], att[11][5, T - 1], atol=1e-5)
    np.testing.assert_allclose(d.entropy, entropy_nats(att[11][5, T - 1 :]), atol=1e-4)
    p = mask_report(s, 11, 5, 0)
    np.testing.assert_allclose(p.weights, att[11][5, :n0, :n0], atol=1e-5)
    np.testing.assert_allclose(p.entropy, entropy_nats(att[11][5, :n0, :n0]), atol=1e-4)
    np.testing.assert_allclose(
        map_at(s, 11, 5, "group", n=n0 + 1), att[11][3:6, : n0 + 1, : n0 + 1].mean(0), atol=1e-5
    )
