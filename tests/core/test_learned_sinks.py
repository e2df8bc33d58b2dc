"""Learned attention sinks (gpt-oss): one logit per query head joins every row's softmax denominator.

The float64 reference against a hand computation and transformers' own eager formula (concatenate the
sink column, softmax, drop it); the fused path's ``lse' = logaddexp(lse, sink_h)`` against the
reference over drawn shapes, masks and dtypes; a tiny random gpt_oss model (MoE, alternating windows)
run as the app runs it against eager: weights, logits, the learned sink's share ``1 − Σ w``, step back,
and the Sinks, value-weighted, Compare and export paths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_cases import DTYPES, EXAMPLES, Case, assert_close, cases, score_max
from attnscope.core.attention import reference
from attnscope.core.attention.fused import add_learned_sinks, attention, math_with_lse
from attnscope.core.attention.masks import as_mask
from hypothesis import given, settings
from hypothesis import strategies as st
from variant_runs import (
    assert_step_back_repeats,
    assert_weights_equal_eager,
    eager_full,
    prompt_of,
    run_session,
    save_family,
)

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


# ---------------------------------------------------------------- the reference, by hand -----


def test_reference_learned_sink_by_hand():
    """Scores (0, ln 2) and a sink logit ln 3: weights 1/6, 2/6; the sink keeps 3/6 = 1 − Σ w."""
    q = np.array([[[[1.0]]]])
    k = np.array([[[[0.0], [np.log(2.0)]]]])
    v = np.array([[[[1.0], [10.0]]]])
    res = reference.attention(q, k, v, scale=1.0, sinks=[np.log(3.0)], return_lse=True, return_weights=True)
    np.testing.assert_allclose(res.weights[0, 0, 0], [1 / 6, 2 / 6], rtol=1e-12)
    np.testing.assert_allclose(res.lse[0, 0, 0], np.log(6.0), rtol=1e-12)
    np.testing.assert_allclose(res.out[0, 0, 0], [1 / 6 + 20 / 6], rtol=1e-12)  # the sink moves nothing
    np.testing.assert_allclose(1 - res.weights.sum(), np.exp(np.log(3.0) - res.lse[0, 0, 0]), rtol=1e-12)
    with pytest.raises(ValueError, match="one logit per query head"):
        reference.attention(q, k, v, sinks=[0.0, 1.0])


def test_reference_equals_transformers_gpt_oss_eager_formula():
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 4, 6, 8)) * 2
    k = rng.standard_normal((1, 2, 6, 8)) * 2
    v = rng.standard_normal((1, 2, 6, 8))
    sinks = np.array([-1.0, 0.0, 2.0, 5.0])
    bias = np.triu(np.full((6, 6), -np.inf), 1)[None, None]

    class M(torch.nn.Module):
        num_key_value_groups, training = 2, False

    m = M()
    m.sinks = torch.from_numpy(sinks)
    out, w = eager_attention_forward(
        m, *(torch.from_numpy(a) for a in (q, k, v)), torch.from_numpy(bias), scaling=0.4
    )
    ref = reference.attention(q, k, v, scale=0.4, mask="causal", sinks=sinks, return_weights=True)
    np.testing.assert_allclose(ref.weights, w.numpy(), atol=1e-12)
    np.testing.assert_allclose(ref.out, out.transpose(1, 2).numpy(), atol=1e-12)
    assert ref.weights.sum(-1).max() < 1.0


# ------------------------------------------------------- the fused path against the reference ---


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(), dtype=st.sampled_from(DTYPES), spread=st.sampled_from([0.5, 3.0, 20.0]))
def test_fused_learned_sinks_equal_reference(case: Case, dtype: str, spread: float):
    ts = [torch.from_numpy(a).to(TORCH_DTYPES[dtype]) for a in (case.q, case.k, case.v)]
    rq, rk, rv = (t.float().numpy() for t in ts)
    H = case.q.shape[1]
    sinks = np.random.default_rng(H).standard_normal(H) * spread
    ref = reference.attention(
        rq, rk, rv, scale=case.scale, mask=case.mask, sinks=sinks, return_lse=True, return_weights=True
    )
    got = attention(*ts, scale=case.scale, mask=case.mask, sinks=sinks, return_lse=True, return_weights=True)
    smax = score_max(rq, rk, case.scale)
    assert torch.isfinite(got.lse).all()  # a fully masked row's mass all sits on the sink: lse' = sink
    assert_close(got.out.float().numpy(), ref.out, dtype, "out")
    assert_close(got.lse.numpy(), ref.lse, dtype, "lse", score_max=smax)
    assert_close(got.weights.numpy(), ref.weights, dtype, "weights", score_max=smax)
    m = as_mask(case.mask)
    out, lse = math_with_lse(
        *ts,
        scale=case.scale,
        causal=m.causal,
        sliding_window=m.window,
        mask=m.array,
        sinks=torch.from_numpy(sinks),
    )
    assert_close(out.float().numpy(), ref.out, dtype, "math out")
    assert_close(lse.numpy(), ref.lse, dtype, "math lse", score_max=smax)


def test_add_learned_sinks_fully_masked_row_and_shape_check():
    out = torch.zeros(1, 2, 1, 3)
    lse = torch.tensor([[[float("-inf")], [0.0]]], dtype=torch.float64)
    o2, l2 = add_learned_sinks(out + 1.0, lse, torch.tensor([1.5, 0.0]))
    assert l2[0, 0, 0] == 1.5 and o2[0, 0].abs().max() == 0  # all mass on the sink, output 0
    np.testing.assert_allclose(l2[0, 1, 0], np.log(2.0))
    np.testing.assert_allclose(o2[0, 1].numpy(), 0.5)  # half the mass left for the real key
    with pytest.raises(ValueError, match="one logit per query head"):
        add_learned_sinks(out, lse, torch.zeros(3))


# ------------------------------------------------------------ a tiny gpt_oss model, end to end ---


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss")
    return folder, save_family("gpt_oss", folder)


def _sink_share_of_eager(att) -> np.ndarray:
    return 1.0 - np.stack(att).sum(-1)  # (L, H, T)


def test_gpt_oss_chunked_prefill_and_decode_equal_eager(gpt_oss, monkeypatch):
    """40-token prompt in 16-token chunks, 8 decode steps; the learned sink's share = 1 − Σ eager weights."""
    import attnscope.core.backends.torch_backend as tb

    monkeypatch.setattr(tb, "PREFILL_CHUNK", 16)
    folder, eager = gpt_oss
    s = run_session(folder, 40, 8)
    assert s.trace.has_learned_sinks
    logits, att = eager_full(eager, s.ids)
    np.testing.assert_allclose(s.logits, logits[-1], atol=1e-4)
    assert_weights_equal_eager(s, att)
    share = np.stack([s.trace.learned_sink_share(layer) for layer in range(s.info.n_layers)])
    np.testing.assert_allclose(share, _sink_share_of_eager(att), atol=1e-6)
    assert share.max() > 0.5 and share.mean() > 0.05  # the sinks take a visible share
    for layer in range(s.info.n_layers):  # the stored logits are the model's parameters
        sk = eager.model.layers[layer].self_attn.sinks.detach().double().numpy()
        np.testing.assert_array_equal(s.trace.learned_sinks(layer), sk)
    assert_step_back_repeats(s)


def test_sinks_report_counts_the_learned_sink(gpt_oss):
    from attnscope.core.analysis.sinks import session_sink_report

    folder, eager = gpt_oss
    s = run_session(folder, 24, 3)
    _, att = eager_full(eager, s.ids)
    A, share = np.stack(att), _sink_share_of_eager(att)
    rep = session_sink_report(s, threshold=0.5)
    assert rep.has_learned_sinks
    np.testing.assert_allclose(rep.sink, A[:, :, 1:, 0].mean(-1), atol=2e-6)
    np.testing.assert_allclose(rep.per_row_learned, share, atol=1e-6)
    np.testing.assert_allclose(rep.learned, share[..., 1:].mean(-1), atol=1e-6)
    total = A[:, :, 1:, 0].mean(-1) + share[..., 1:].mean(-1)
    np.testing.assert_allclose(rep.sink_total, total, atol=2e-6)
    assert rep.sink_heads() == [(int(a), int(b)) for a, b in zip(*np.nonzero(total >= 0.5), strict=True)]
    j = rep.to_json()
    assert (
        np.allclose(j["learned_sink"], rep.learned, atol=1e-6) and len(j["by_step"][0]["learned_sink"]) == 2
    )


def test_value_weighted_sink_slot_moves_nothing(gpt_oss):
    """α_ij ‖v_j W_O‖ / Σ_j α_ij ‖v_j W_O‖ over the real keys: the sink slot adds to neither sum."""
    from attnscope.core.analysis.value_weighted import value_norms, value_weighted

    folder, eager = gpt_oss
    s = run_session(folder, 16, 2)
    _, att = eager_full(eager, s.ids)
    for layer in range(s.info.n_layers):
        nv = value_norms(s, layer)  # (H, T)
        for head in range(s.info.n_heads):
            vw = value_weighted(s, layer, head, normalise=True, norms=nv)
            a = att[layer][head] * nv[head][None, :]
            np.testing.assert_allclose(vw, a / a.sum(-1, keepdims=True), atol=2e-5)
            np.testing.assert_allclose(vw.sum(-1), 1.0, atol=1e-5)


def test_compare_counts_the_sink_slot_and_export_records_it(gpt_oss, tmp_path):
    from attnscope.core.analysis.compare_runs import compare_sessions
    from attnscope.core.analysis.gqa import js_distance
    from attnscope.core.io import head_export, provenance

    p = np.array([0.2, 0.3])  # sink 0.5
    q = np.array([0.5, 0.3])  # sink 0.2
    full = js_distance(np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.3, 0.2]))
    np.testing.assert_allclose(js_distance(p, q, sink_slot=True), full, rtol=1e-12)
    folder, _ = gpt_oss
    s = run_session(folder, 20, 3)
    b = run_session(folder, 20, 3)
    assert np.abs(compare_sessions(s, b).js_mean).max() < 1e-3
    b.prefill(prompt_of(20)[:10] + "Z" + prompt_of(20)[11:], chat_template=False)
    b.feed(s.ids[20:])
    assert compare_sessions(s, b).js_mean.max() > 0.01
    meta = provenance.head_metadata(s, 0, 3)
    sink = float(s.trace.learned_sinks(0)[3])
    assert meta["softmax"] == {
        "softcap": None,
        "learned_sinks": True,
        "layer_softcap": None,
        "learned_sink_logit": sink,
    }
    assert meta["model"]["learned_sinks"] is True
    path = tmp_path / "map.npy"
    head_export.export_head(s, 0, 3, path)
    np.testing.assert_array_equal(np.load(path), s.weights(0, 3))
    snap = s.snapshot()
    assert snap.learned_sinks and snap.softcap is None


def test_mask_report_names_the_learned_sink(gpt_oss):
    from attnscope.core.analysis.maskview import mask_report

    folder, _ = gpt_oss
    s = run_session(folder, 12, 2)
    r = mask_report(s, 1, 2, 2)
    assert r.learned_sink == pytest.approx(float(s.trace.learned_sinks(1)[2]))
    np.testing.assert_allclose(r.weights.sum(-1) + r.learned_share, 1.0, atol=1e-5)
    assert r.raw_scores is None


@pytest.mark.slow
def test_gpt_oss_long_chunked_prefill_equals_eager(tmp_path):
    """640 tokens through the default 512-token chunks, then 8 decode steps: exact in every layer."""
    eager = save_family(
        "gpt_oss",
        tmp_path / "go",
        max_position_embeddings=1024,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=150000.0,
            factor=32.0,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=32,
        ),
    )
    s = run_session(tmp_path / "go", 640, 8)
    logits, att = eager_full(eager, s.ids)
    np.testing.assert_allclose(s.logits, logits[-1], atol=1e-4)
    assert_weights_equal_eager(s, att)
    share = np.stack([s.trace.learned_sink_share(layer) for layer in range(s.info.n_layers)])
    np.testing.assert_allclose(share, _sink_share_of_eager(att), atol=1e-6)
    assert_step_back_repeats(s)


@pytest.mark.parametrize("family", ["gpt_oss", "gemma2"])
def test_mlx_backend_refuses_the_two_families_in_one_line(family):
    from attnscope.core.backend_registry import problem as backend_problem

    why = backend_problem(family, "mlx")
    assert why is not None and family in why and "\n" not in why
    assert backend_problem(family, "torch") is None
