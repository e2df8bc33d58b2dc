"""Shared hypothesis strategy and helpers for the attention-contract tests (not a test module).

A case is drawn as plain numbers (shapes, mask kind, seed) and built into float32 numpy arrays;
each implementation's test rounds them to its dtype and gives the reference the *rounded*
values, so differences measure the implementation, not the input rounding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from attnscope.core.attention.masks import Mask
from hypothesis import strategies as st

# Error allowed relative to the magnitude of the expected values (max(1, max|expected|)).
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
DTYPES = tuple(TOL)
# Unit roundoff. Scores formed in float32 carry ~EPS["float32"]·|s| of rounding into the LSE and
# into weights exp(s − lse); kernels that round the scores to the input dtype (mx.fast on the
# CPU) carry EPS[dtype]·|s| into everything. Tests pass score_max (and score_dtype) for these.
# Factors measured over 3000 drawn cases: float32 LSE/weights err up to 9·EPS·|s| (fused CPU
# kernel), mx.fast bf16/fp16 outputs up to 1.1·EPS[dtype]·|s|.
SCORE_FACTOR = {"float32": 16.0, "float16": 2.0, "bfloat16": 2.0}
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}

# Examples per property test: modest for CI (2 cores); raise it locally for a deeper search.
EXAMPLES = int(os.environ.get("ATTNSCOPE_PROPERTY_EXAMPLES", "50"))

MASK_KINDS = ("none", "causal", "window", "bool", "additive", "causal+bool", "window+additive")
ARRAY_SHAPES = ("LS", "11LS", "B1LS", "1HLS", "BHLS", "1S")
ADDITIVE_VALUES = np.array([0.0, 0.0, 0.0, -1.0, -2.5, 0.5, 1.25, -np.inf], dtype=np.float32)


@dataclass
class Case:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: object
    kind: str
    scale: float | None

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return (
            f"Case(q={self.q.shape}, k={self.k.shape}, mask={self.kind} "
            f"{self.mask.describe() if isinstance(self.mask, Mask) else _short(self.mask)}, scale={self.scale})"
        )

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis' printer: shapes, not the arrays
        p.text(repr(self))


def _short(mask) -> str:
    return f"array {mask.dtype} {mask.shape}" if hasattr(mask, "shape") else repr(mask)


def make_array(rng, kind_shape: str, B: int, H: int, L: int, S: int, additive: bool, density: float):
    shape = {
        "LS": (L, S),
        "11LS": (1, 1, L, S),
        "B1LS": (B, 1, L, S),
        "1HLS": (1, H, L, S),
        "BHLS": (B, H, L, S),
        "1S": (1, S),
    }[kind_shape]
    if additive:
        return rng.choice(ADDITIVE_VALUES, size=shape).astype(np.float32)
    return rng.random(shape) < density


@st.composite
def cases(draw, max_len: int = 10) -> Case:
    B = draw(st.sampled_from([1, 2]))
    Hkv = draw(st.sampled_from([1, 2, 3]))
    G = draw(st.sampled_from([1, 2, 4]))
    L = draw(st.integers(1, max_len))
    S = draw(st.integers(1, max_len + 3))
    D = draw(st.sampled_from([4, 8, 16, 32]))
    kind = draw(st.sampled_from(MASK_KINDS))
    shape_kind = draw(st.sampled_from(ARRAY_SHAPES))
    density = draw(st.sampled_from([0.2, 0.7, 1.0]))
    window = draw(st.integers(1, max_len + 3))
    magnitude = draw(st.sampled_from([0.5, 1.0, 3.0]))
    scale = draw(st.sampled_from([None, None, 0.3, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    H = Hkv * G
    q = (rng.standard_normal((B, H, L, D)) * magnitude).astype(np.float32)
    k = (rng.standard_normal((B, Hkv, S, D)) * magnitude).astype(np.float32)
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    arr = lambda additive: make_array(rng, shape_kind, B, H, L, S, additive, density)  # noqa: E731
    mask = {
        "none": lambda: None,
        "causal": lambda: "causal",
        "window": lambda: window,
        "bool": lambda: arr(False),
        "additive": lambda: arr(True),
        "causal+bool": lambda: Mask(causal=True, array=arr(False)),
        "window+additive": lambda: Mask(causal=True, window=window, array=arr(True)),
    }[kind]()
    return Case(q, k, v, mask, kind, scale)


def score_max(q: np.ndarray, k: np.ndarray, scale: float | None) -> float:
    """Largest ``|q·k·scale|`` over all (query head, key) pairs (query head h reads KV head h // G)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kk = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    return float(np.abs(np.einsum("bhld,bhsd->bhls", q, kk)).max() * abs(scale))


def assert_close(
    actual,
    expected,
    dtype: str,
    what: str,
    rows=None,
    score_max: float | None = None,
    score_dtype: str = "float32",
):
    """``|actual − expected| <= TOL[dtype] · max(1, max|expected|)``, optionally on ``rows`` only.

    With ``score_max`` the bound grows by ``SCORE_FACTOR·EPS[score_dtype]·score_max`` (scores
    formed in ``score_dtype``).
    Infinite entries (a fully masked row's LSE) must match exactly.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if rows is not None:
        actual, expected = actual[rows], expected[rows]
    inf = np.isinf(expected)
    assert np.array_equal(np.isinf(actual), inf) and np.array_equal(actual[inf], expected[inf]), (
        f"{what}: infinite entries differ"
    )
    fin = ~inf
    if not fin.any():
        return
    assert np.isfinite(actual[fin]).all(), f"{what}: non-finite values"
    err = np.abs(actual[fin] - expected[fin]).max()
    tol = TOL[dtype] + (
        SCORE_FACTOR[score_dtype] * EPS[score_dtype] * score_max if score_max is not None else 0.0
    )
    bound = tol * max(1.0, np.abs(expected[fin]).max())
    assert err <= bound, f"{what} ({dtype}): max error {err:.3g} > {bound:.3g}"
