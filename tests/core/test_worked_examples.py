"""The seeds' worked numbers (attnscope.core.analysis.worked_examples) and RoPE (attnscope.core.attention.rope)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from attnscope.core.analysis.worked_examples import (
    EXAMPLES,
    all_examples,
    exercise_1,
    exercise_3,
    softmax_saturation,
    three_token_trace,
)
from attnscope.core.attention.fused import sdpa_with_lse
from attnscope.core.attention.rope import apply_rope, rope_frequencies, rope_score, rotation_matrix

# ------------------------------------------------ the 3-token trace (worked_examples.TRACE_*) -------


def test_trace_reconstruction_gives_the_agreed_projections():
    ex = three_token_trace()
    assert np.array_equal(ex.step("Q = X W_Q").value, [[2, 0], [0, 2], [1, 1]])
    assert np.array_equal(ex.step("K = X W_K").value, [[0, 2], [2, 0], [1, 1]])
    assert np.array_equal(ex.step("V = X W_V").value, [[2, 1], [1, 2], [1, 2]])
    assert np.array_equal(ex.step("scores S = Q Kᵀ").value, [[0, 4, 2], [4, 0, 2], [2, 2, 2]])
    assert ex.inputs["tokens"] == ("the", "cat", "sat")


def test_trace_reproduces_every_printed_number():
    ex = three_token_trace()
    assert ex.mismatches() == []
    printed = [s.name for s in ex.steps if s.printed is not None]
    assert len(printed) >= 8
    # the numbers, independently of the Step bookkeeping: by hand from S = [[0,4,2],[4,0,2],[2,2,2]]
    e = np.exp(np.array([0.0, 4.0, 2.0]) / math.sqrt(2))
    row1 = e / e.sum()
    assert np.round(row1, 3).tolist() == [0.045, 0.768, 0.187]
    A = ex.step("weights A = softmax(S/√d_k)").value
    assert np.allclose(A[0], row1, atol=1e-12) and np.allclose(A[1], row1[[1, 0, 2]], atol=1e-12)
    assert np.allclose(A[2], 1 / 3)
    out = ex.step("output A V").value
    assert np.round(out, 3).tolist() == [[1.045, 1.955], [1.768, 1.232], [1.333, 1.667]]
    assert np.allclose(out[0], row1 @ np.array([[2, 1], [1, 2], [1, 2]]), atol=1e-12)
    assert np.allclose(ex.step("log-sum-exp per row").value[0], np.log(e.sum()))


def test_trace_through_the_apps_fused_torch_path():
    # The same numbers from the kernel every model layer runs (not only the numpy reference).
    ex = three_token_trace()
    Q, K, V = (
        torch.tensor(ex.step(n).value, dtype=torch.float32)[None, None]
        for n in ("Q = X W_Q", "K = X W_K", "V = X W_V")
    )
    out, lse = sdpa_with_lse(Q, K, V, causal=False)
    assert np.allclose(out[0, 0].numpy(), ex.step("output A V").value, atol=1e-6)
    assert np.allclose(lse[0, 0].numpy(), ex.step("log-sum-exp per row").value, atol=1e-6)


# ----------------------------------- saturation, exercises, memory and KV figures (worked_examples) ------


def test_exercise_1():
    ex = exercise_1()
    assert ex.mismatches() == []
    w = ex.step("softmax weights").value
    assert w[0] == pytest.approx(math.exp(0.5) / (math.exp(0.5) + math.exp(0.25)))
    assert round(w[0], 3) == 0.562 and round(w[1], 3) == 0.438


def test_exercise_3_rope_relative_position():
    ex = exercise_3()
    assert ex.mismatches() == []
    assert round(float(ex.step("⟨R₃q, R₇k⟩").value), 4) == 0.2674
    assert abs(float(ex.step("difference").value)) < 1e-12


def test_softmax_15_0_0_flags_the_handbook_erratum():
    ex = softmax_saturation()
    step = ex.step("softmax(15, 0, 0)")
    exact = np.array([1.0, math.exp(-15), math.exp(-15)]) / (1 + 2 * math.exp(-15))
    assert np.allclose(step.value, exact, rtol=1e-12, atol=0)
    assert round(float(step.value[0]), 8) == 0.99999939 and float(step.value[1]) == pytest.approx(
        3.06e-7, rel=1e-3
    )
    assert step.erratum and not step.matches()  # the printed (0.99999969, 1.5e-7, 1.5e-7) is off by 2×
    assert ex.mismatches() == ["softmax(15, 0, 0)"]


def test_every_example_matches_its_seed_except_flagged_errata():
    assert set(EXAMPLES) == {
        "trace",
        "exercise1",
        "exercise3",
        "saturation",
        "seed002",
        "kv70b",
        "memorywall",
    }
    for ex in all_examples():
        bad = [s for s in ex.steps if not s.matches()]
        assert all(s.erratum for s in bad), (ex.key, [s.name for s in bad])
        assert ex.source.startswith("seed")


# ------------------------------------------------------------------------------ RoPE -----------


def test_interleaved_rope_equals_complex_rotation():
    # Meta's Llama reference: view consecutive pairs as complex numbers, multiply by e^{i m θ}.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8))
    pos = np.array([0, 1, 2, 7, 100])
    theta = rope_frequencies(8, base=10000.0)
    z = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * np.outer(pos, theta))
    expect = np.stack([z.real, z.imag], axis=-1).reshape(5, 8)
    assert np.allclose(apply_rope(x, pos, theta, interleaved=True), expect, atol=1e-12)


def test_half_rope_equals_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rng = np.random.default_rng(1)
    T, D = 6, 16
    q, k = rng.standard_normal((1, 2, T, D)), rng.standard_normal((1, 2, T, D))
    theta = rope_frequencies(D, base=100000.0)
    ang = np.outer(np.arange(T), theta)
    emb = np.concatenate([ang, ang], axis=-1)  # transformers: cat(freqs, freqs)
    cos, sin = torch.tensor(np.cos(emb))[None], torch.tensor(np.sin(emb))[None]
    tq, tk = apply_rotary_pos_emb(torch.tensor(q), torch.tensor(k), cos, sin)
    assert np.allclose(apply_rope(q, np.arange(T), theta, interleaved=False), tq.numpy(), atol=1e-12)
    assert np.allclose(apply_rope(k, np.arange(T), theta, interleaved=False), tk.numpy(), atol=1e-12)


def test_rope_frequencies_match_transformers_inv_freq():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64 * 9, num_attention_heads=9, head_dim=64, rope_theta=100000.0)
    inv_freq = LlamaRotaryEmbedding(cfg).inv_freq.double().numpy()
    assert np.allclose(rope_frequencies(64, 100000.0), inv_freq, rtol=1e-6)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotations_compose_so_scores_depend_on_the_offset_only(interleaved):
    theta = rope_frequencies(8, 10000.0)
    R3, R7, R4 = (rotation_matrix(m, theta, interleaved=interleaved) for m in (3, 7, 4))
    assert np.allclose(R3.T @ R3, np.eye(8), atol=1e-12)  # orthogonal
    assert np.allclose(R3.T @ R7, R4, atol=1e-12)  # R_mᵀ R_n = R_{n−m}
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    assert rope_score(q, k, 3, 7, theta, interleaved=interleaved) == pytest.approx(
        rope_score(q, k, 10, 14, theta, interleaved=interleaved), abs=1e-10
    )
    assert rope_score(q, k, 3, 7, theta, interleaved=interleaved) != pytest.approx(
        rope_score(q, k, 3, 8, theta, interleaved=interleaved), abs=1e-6
    )


def test_rope_matches_mlx_fast_rope_both_layouts():
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 1, 5, 8)).astype(np.float32)
    theta = rope_frequencies(8, 10000.0)
    for traditional in (True, False):
        got = mx.fast.rope(mx.array(x), 8, traditional=traditional, base=10000.0, scale=1.0, offset=3)
        expect = apply_rope(x, np.arange(3, 8), theta, interleaved=traditional)
        assert np.allclose(np.array(got), expect, atol=1e-5)


def test_rope_rejects_bad_sizes():
    with pytest.raises(ValueError, match="even"):
        rope_frequencies(7)
    with pytest.raises(ValueError, match="angles"):
        apply_rope(np.zeros(4), 1, [1.0])
