"""Chunked prefill (1 < L < S new rows after cached keys): the CPU path that splits the chunk into
unmasked cached-prefix and causal-diagonal kernel calls merged by LSE, against the math path, and
a chunked SmolLM2 prefill against a one-chunk prefill."""

from __future__ import annotations

import attnscope.core.attention.fused as A
import attnscope.core.backends.torch_backend as tb
import numpy as np
import pytest
import torch


def _qkv(L, S, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, 9, L, 64, generator=g) * scale,
        torch.randn(1, 3, S, 64, generator=g) * scale,
        torch.randn(1, 3, S, 64, generator=g),
    )


@pytest.mark.parametrize("L,S", [(2, 3), (37, 300), (512, 1024), (100, 2048)])
def test_split_path_taken_and_equal_to_math(monkeypatch, L, S):
    taken = []
    real = A._prefix_then_diagonal

    def spy(*a):
        r = real(*a)
        taken.append(r is not None)
        return r

    monkeypatch.setattr(A, "_prefix_then_diagonal", spy)
    q, k, v = _qkv(L, S, 1.0, L)
    out, lse = A.sdpa_with_lse(q, k, v, causal=True)
    ref_out, ref_lse = A.math_with_lse(q, k, v, causal=True)
    assert taken == [True]
    assert (out - ref_out).abs().max().item() < 1e-5
    assert (lse - ref_lse).abs().max().item() < 1e-5


def test_large_scores_fall_back_to_the_masked_call(monkeypatch):
    q, k, v = _qkv(5, 17, 40.0, 0)  # |lse| in the thousands: the merge would lose precision
    taken = []
    real = A._prefix_then_diagonal
    monkeypatch.setattr(A, "_prefix_then_diagonal", lambda *a: taken.append(real(*a)) or taken[-1])
    out, lse = A.sdpa_with_lse(q, k, v, causal=True)
    ref_out, ref_lse = A.math_with_lse(q, k, v, causal=True)
    assert taken == [None] and float(ref_lse.abs().max()) > A.SPLIT_MAX_LSE
    assert (out - ref_out).abs().max().item() < 1e-4
    assert torch.allclose(lse, ref_lse, rtol=1e-6)


def test_chunked_prefill_equals_one_chunk(smol_session, monkeypatch):
    from conftest import SMOL_PROMPT

    s = smol_session
    s.prefill(SMOL_PROMPT, chat_template=False)
    whole_logits = s.logits.copy()
    whole = [s.weights(layer, 4) for layer in (0, 11, 29)]
    monkeypatch.setattr(tb, "PREFILL_CHUNK", 5)  # 27 tokens as 5 + 5 + ... + 2: every split shape
    s.prefill(SMOL_PROMPT, chat_template=False)
    assert np.abs(s.logits - whole_logits).max() < 1e-4
    for w, layer in zip(whole, (0, 11, 29), strict=True):
        np.testing.assert_allclose(s.weights(layer, 4), w, atol=1e-5)
