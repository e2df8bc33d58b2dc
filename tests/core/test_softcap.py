"""Attention-logit soft-capping (Gemma 2): ``cap·tanh(s / cap)`` after the scale, before the mask.

The float64 reference against a hand computation and transformers' own eager formula; the fused
path (the unfused float32 math path) against the reference over drawn shapes, masks and dtypes; a
tiny random gemma2 model run as the app runs it (chunked prefill, decode steps, step back) against
eager on the whole sequence, in every recomputation of the trace (tiles, blocks, overviews,
sinks, diagonals, the Mask panel's raw and capped scores).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_cases import DTYPES, EXAMPLES, Case, assert_close, cases, score_max
from attnscope.core.attention import reference
from attnscope.core.attention.fused import attention, math_with_lse, sdpa_with_lse, softcap_scores
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
CAP = 1.5  # tests/tiny_models.py's gemma2 cap


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


# ---------------------------------------------------------------- the reference, by hand -----


def test_reference_softcap_by_hand():
    """One head, one query, keys with scores 0, 2 and 10 at cap 5: weights ∝ exp(5·tanh(s/5))."""
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[0.0, 0.0], [2.0, 0.0], [10.0, 0.0]]]])
    v = np.eye(3)[None, None, :, :2]
    res = reference.attention(q, k, v, scale=1.0, softcap=5.0, return_lse=True, return_weights=True)
    capped = 5.0 * np.tanh(np.array([0.0, 2.0, 10.0]) / 5.0)  # 0, 1.9003, 4.8201
    expect = np.exp(capped) / np.exp(capped).sum()
    np.testing.assert_allclose(res.weights[0, 0, 0], expect, rtol=1e-12)
    np.testing.assert_allclose(res.lse[0, 0, 0], np.log(np.exp(capped).sum()), rtol=1e-12)
    plain = reference.attention(q, k, v, scale=1.0, return_weights=True).weights[0, 0, 0]
    assert plain[2] > 0.999 and expect[2] < 0.95  # the cap bites: 10 → 4.82
    with pytest.raises(ValueError, match="softcap"):
        reference.attention(q, k, v, softcap=0.0)


def test_reference_equals_transformers_gemma2_eager_formula():
    """The reference is transformers' ``modeling_gemma2.eager_attention_forward`` (mask after the cap)."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 6, 8)) * 2
    k = rng.standard_normal((1, 2, 6, 8)) * 2
    v = rng.standard_normal((1, 2, 6, 8))
    bias = np.triu(np.full((6, 6), -np.inf), 1)[None, None]

    class M(torch.nn.Module):
        num_key_value_groups, training, head_dim = 2, False, 8

    out, w = eager_attention_forward(
        M(), *(torch.from_numpy(a) for a in (q, k, v)), torch.from_numpy(bias), scaling=0.4, softcap=2.0
    )
    ref = reference.attention(q, k, v, scale=0.4, mask="causal", softcap=2.0, return_weights=True)
    # eager softmaxes in float32 (dtype=torch.float32) whatever the input: float32 rounding
    np.testing.assert_allclose(ref.weights, w.numpy(), atol=1e-6)
    np.testing.assert_allclose(ref.out, out.transpose(1, 2).numpy(), atol=1e-6)


# ------------------------------------------------------- the fused path against the reference ---


def _torch(case: Case, dtype: str):
    ts = [torch.from_numpy(a).to(TORCH_DTYPES[dtype]) for a in (case.q, case.k, case.v)]
    return ts, [t.float().numpy() for t in ts]


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases(), dtype=st.sampled_from(DTYPES), cap=st.sampled_from([0.5, 2.0, 30.0]))
def test_fused_softcap_equals_reference(case: Case, dtype: str, cap: float):
    (tq, tk, tv), (rq, rk, rv) = _torch(case, dtype)
    ref = reference.attention(
        rq, rk, rv, scale=case.scale, mask=case.mask, softcap=cap, return_lse=True, return_weights=True
    )
    got = attention(
        tq, tk, tv, scale=case.scale, mask=case.mask, softcap=cap, return_lse=True, return_weights=True
    )
    assert got.out.dtype == TORCH_DTYPES[dtype] and got.lse.dtype == torch.float64
    smax = min(score_max(rq, rk, case.scale), cap)  # capped scores are within ±cap
    assert_close(got.out.float().numpy(), ref.out, dtype, "out")
    assert_close(got.lse.numpy(), ref.lse, dtype, "lse", score_max=smax)
    assert_close(got.weights.numpy(), ref.weights, dtype, "weights", score_max=smax)
    m = as_mask(case.mask)
    out, lse = math_with_lse(
        tq, tk, tv, scale=case.scale, causal=m.causal, sliding_window=m.window, mask=m.array, softcap=cap
    )
    assert_close(out.float().numpy(), ref.out, dtype, "math out")
    assert_close(lse.numpy(), ref.lse, dtype, "math lse", score_max=smax)


def test_softcap_scores_in_place_and_none():
    s = torch.tensor([0.0, 1.0, -100.0])
    assert softcap_scores(s, None) is s and s.tolist() == [0.0, 1.0, -100.0]
    softcap_scores(s, 2.0)
    np.testing.assert_allclose(s.numpy(), 2.0 * np.tanh(np.array([0.0, 1.0, -100.0]) / 2.0), rtol=1e-6)
    with pytest.raises(ValueError, match="softcap"):
        sdpa_with_lse(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), softcap=-1.0)


# ------------------------------------------------------------- a tiny gemma2 model, end to end ---


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma2")
    return folder, save_family("gemma2", folder)


def _chunked(monkeypatch, chunk: int = 16):
    import attnscope.core.backends.torch_backend as tb

    monkeypatch.setattr(tb, "PREFILL_CHUNK", chunk)


def test_gemma2_chunked_prefill_and_decode_equal_eager(gemma2, monkeypatch):
    """40-token prompt in 16-token chunks (L < S over cached keys), 8 decode steps, step back."""
    folder, eager = gemma2
    _chunked(monkeypatch)
    s = run_session(folder, 40, 8)
    assert s.trace.softcaps == (CAP,) * s.info.n_layers
    logits, att = eager_full(eager, s.ids)
    np.testing.assert_allclose(s.logits, logits[-1], atol=1e-4)
    assert_weights_equal_eager(s, att)
    assert_step_back_repeats(s)
    # the cap bit: the uncapped exp(q·k·scale − lse) is not the distribution
    raw = s.trace.scores(0, 0, raw=True)
    capped = s.trace.scores(0, 0)
    fin = np.isfinite(raw)
    np.testing.assert_allclose(capped[fin], CAP * np.tanh(raw[fin] / CAP), rtol=1e-5, atol=1e-6)
    assert np.abs(raw[fin] - capped[fin]).max() > 0.1 * CAP
    np.testing.assert_allclose(s.weights(0, 0).sum(-1), 1.0, atol=1e-5)


def test_every_recomputation_applies_the_cap(gemma2, monkeypatch):
    """Tiles, batched blocks, the blocked path, key summaries and diagonals equal the exact weights."""
    from attnscope.core.analysis.score_blocks import LayerBlocks

    folder, eager = gemma2
    _chunked(monkeypatch)
    s = run_session(folder, 30, 4)
    tr, T = s.trace, s.seq_len
    _, att = eager_full(eager, s.ids)
    A = np.stack(att)  # (L, H, T, T)
    for layer in range(s.info.n_layers):
        full = np.stack([tr.weights(layer, h) for h in range(s.info.n_heads)])
        np.testing.assert_allclose(full, A[layer], atol=1e-5)
        np.testing.assert_allclose(
            tr.weights(layer, 1, slice(5, 20), slice(3, 11)), full[1, 5:20, 3:11], atol=1e-6
        )
        blk = tr.weights_block(layer, None, slice(2, T), slice(0, T)).numpy()
        np.testing.assert_allclose(blk, full[:, 2:], atol=1e-6)
        lb = LayerBlocks(tr, layer, [0, 1, 2, 3], T)
        assert lb.direct  # the LSE cannot be folded into a capped product
        np.testing.assert_allclose(lb.weights(0, T, 0, T).numpy(), full, atol=1e-6)
    np.testing.assert_allclose(tr.weight_on_key(0), A[..., 0], atol=1e-6)
    np.testing.assert_allclose(tr.row_mass([0, 3, 7]), A[..., [0, 3, 7]].sum(-1), atol=1e-6)
    d = tr.diagonal(1)
    np.testing.assert_allclose(d[..., 1:], np.diagonal(A, offset=-1, axis1=2, axis2=3), atol=1e-6)


def test_mask_report_shows_raw_and_capped_scores(gemma2):
    from attnscope.core.analysis.maskview import mask_report

    folder, _ = gemma2
    s = run_session(folder, 12, 2)
    for step in (0, 2):
        r = mask_report(s, 1, 2, step)
        assert r.softcap == CAP and r.raw_scores is not None and r.learned_sink is None
        fin = np.isfinite(r.raw_scores)
        assert np.array_equal(fin, r.allowed) and np.array_equal(np.isfinite(r.scores), fin)
        np.testing.assert_allclose(
            r.scores[fin], CAP * np.tanh(r.raw_scores[fin] / CAP), rtol=1e-5, atol=1e-6
        )
        assert float(np.abs(r.scores[fin]).max()) <= CAP


def test_sinks_compare_export_and_snapshot_run_on_gemma2(gemma2, tmp_path):
    from attnscope.core.analysis.compare_runs import compare_sessions
    from attnscope.core.analysis.sinks import session_sink_report
    from attnscope.core.io import provenance

    folder, eager = gemma2
    s = run_session(folder, 20, 3)
    _, att = eager_full(eager, s.ids)
    A = np.stack(att)
    rep = session_sink_report(s)
    assert not rep.has_learned_sinks
    np.testing.assert_allclose(rep.sink, A[:, :, 1:, 0].mean(-1), atol=2e-6)
    b = run_session(folder, 20, 3)
    same = compare_sessions(s, b)
    assert np.abs(same.js_mean).max() < 1e-3  # identical runs (sqrt of ~1e-7 rounding)
    b.prefill(prompt_of(20)[:10] + "Z" + prompt_of(20)[11:], chat_template=False)
    b.feed(s.ids[20:])  # same length, one token edited: rows from 10 on move
    moved = compare_sessions(s, b, weighting="value-weighted")
    assert moved.js_mean.max() > 10 * same.js_mean.max()
    meta = provenance.head_metadata(s, 1, 2)
    assert meta["softmax"] == {
        "softcap": CAP,
        "learned_sinks": False,
        "layer_softcap": CAP,
        "learned_sink_logit": None,
    }
    assert meta["model"]["softcap"] == CAP and meta["model"]["learned_sinks"] is False
    snap = s.snapshot()
    assert snap.softcap == CAP and not snap.learned_sinks


@pytest.mark.slow
def test_gemma2_long_chunked_prefill_equals_eager(tmp_path):
    """640 tokens through the default 512-token chunks, then 8 decode steps: exact in every layer."""
    eager = save_family("gemma2", tmp_path / "g2", max_position_embeddings=1024)
    s = run_session(tmp_path / "g2", 640, 8)
    logits, att = eager_full(eager, s.ids)
    np.testing.assert_allclose(s.logits, logits[-1], atol=1e-4)
    assert_weights_equal_eager(s, att)
    assert_step_back_repeats(s)
