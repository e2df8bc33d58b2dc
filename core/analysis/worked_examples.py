"""The seeds' worked numbers, as data plus the computation that reproduces each of them.

Every example is recomputed through the same engine code the app uses (the reference attention
:func:`attnscope.core.attention.reference.attention`, :mod:`attnscope.core.attention.rope`, :mod:`attnscope.core.kv_formula`), never through test-only
code, and carries, step by step, what the seed text printed next to what we compute, so a
"worked examples" view can show both. Sources (``../shared/seeds/``):

* seed 004 (attention handbook page): §2 the 3-token numeric trace, §3 ``softmax(15, 0, 0)``,
  §5 the memory wall, §7 the 70B KV-cache table, §10 exercises 1 and 3;
* seed 002 (PyTorch walk-through): 256 MB per head at 8192² fp32, 16 GB for 64 heads, the
  scale ≈ 0.088 for d_k = 128.

**The 3-token trace is a reconstruction.** The handbook's input and weight matrices were lost in
transcription. The matrices in :data:`TRACE_X` / :data:`TRACE_W_Q` / :data:`TRACE_W_K` /
:data:`TRACE_W_V` are the reconstruction agreed for this project: every number the text does
give follows from them (the check "row 1 of Q: [1,0,1,0]·col 1 of W_Q = 2", the scaled scores
row 1 (0, 2.828, 1.414), the three softmax rows and the three output rows). The trace is full
(unmasked) self-attention, as in the handbook.

**One erratum.** The handbook prints ``softmax(15, 0, 0) = (0.99999969, 1.5e-7, 1.5e-7)``; the exact
values are ``(0.99999939, 3.06e-7, 3.06e-7)`` (``e^-15 = 3.06e-7``; the printed pair would be
``softmax(15.69, 0, 0)``). The step keeps the printed numbers and is flagged ``erratum``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from attnscope.core import kv_formula as kv
from attnscope.core.attention.reference import attention, default_scale, softmax
from attnscope.core.attention.rope import rope_score

# ---------------------------------------------------------------- §2 trace data (reconstruction)

TRACE_TOKENS = ("the", "cat", "sat")
TRACE_X = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], dtype=np.float64)  # (T=3, d_model=4)
TRACE_W_Q = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=np.float64)  # (4, d_k=2)
TRACE_W_K = np.array([[0, 1], [1, 0], [0, 1], [1, 0]], dtype=np.float64)
TRACE_W_V = np.array([[1, 1], [0, 1], [1, 0], [1, 1]], dtype=np.float64)


@dataclass(frozen=True)
class Step:
    """One number or array of a worked example.

    Attributes:
        name: what it is (``"scaled scores S/√d_k"``).
        value: what the engine computes (float64 array; scalars are 0-d).
        printed: what the seed prints (same shape), or None where it prints nothing.
        atol: how far ``value`` may be from ``printed`` given the seed's rounding.
        note: provenance (``"reconstructed"``), units, or the seed's wording.
        erratum: True where the seed's printed number is known to be wrong (see ``note``).
    """

    name: str
    value: np.ndarray
    printed: np.ndarray | None = None
    atol: float = 0.0
    note: str = ""
    erratum: bool = False

    def matches(self) -> bool:
        """True when nothing is printed, or the computed value is within ``atol`` of it."""
        if self.printed is None:
            return True
        return bool(np.allclose(self.value, self.printed, rtol=0.0, atol=self.atol))


@dataclass(frozen=True)
class WorkedExample:
    """A titled sequence of steps from one seed section."""

    key: str
    title: str
    source: str
    steps: tuple[Step, ...]
    note: str = ""
    inputs: dict = field(default_factory=dict)

    def step(self, name: str) -> Step:
        """The step called ``name``. Raises KeyError if there is none."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"{self.key} has no step {name!r}")

    def mismatches(self) -> list[str]:
        """Names of steps whose computed value disagrees with the seed's printed one."""
        return [s.name for s in self.steps if not s.matches()]


def _a(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def three_token_trace() -> WorkedExample:
    """Handbook §2: self-attention on "the cat sat", d_model = 4, d_k = 2, unmasked.

    Projections ``Q = X W_Q`` etc., scores ``S = Q Kᵀ``, scaled by ``1/√2``, row softmax,
    output ``A V``; scores, weights and output come from :func:`attnscope.core.attention.reference.attention`.
    """
    X, WQ, WK, WV = TRACE_X, TRACE_W_Q, TRACE_W_K, TRACE_W_V
    Q, K, V = X @ WQ, X @ WK, X @ WV  # (3, 2) each
    d_k = Q.shape[1]
    scale = default_scale(d_k)
    res = attention(
        Q[None, None],
        K[None, None],
        V[None, None],
        scale=scale,
        mask=None,
        return_lse=True,
        return_weights=True,
    )  # (1, 1, 3, ·): one batch, one head
    scores = Q @ K.T
    scaled = scores * scale
    A, out = res.weights[0, 0].astype(np.float64), res.out[0, 0]
    recon = "reconstructed (the seed's matrices were lost in transcription)"
    steps = (
        Step("Q = X W_Q", Q, note=recon),
        Step("Q[0, 0] check", _a(Q[0, 0]), _a(2), 0.0, "[1,0,1,0]·col 1 of W_Q = 1·1+0·0+1·1+0·0 = 2"),
        Step("K = X W_K", K, note=recon),
        Step("V = X W_V", V, note=recon),
        Step("scores S = Q Kᵀ", scores, note=recon),
        Step("√d_k", _a(math.sqrt(d_k)), _a(1.414), 5e-4),
        Step("scaled scores S/√d_k, row 1", scaled[0], _a([0.0, 2.828, 1.414]), 5e-4),
        Step("scaled scores S/√d_k", scaled),
        # The handbook exponentiates the rounded 2.828 (16.91) but sums the unrounded terms (22.03).
        Step(
            "exp(row 1)",
            np.exp(scaled[0]),
            _a([1.000, 16.91, 4.113]),
            1e-2,
            "the handbook rounds intermediate values; exp(2.828427) = 16.919",
        ),
        Step("sum exp(row 1)", _a(np.exp(scaled[0]).sum()), _a(22.03), 5e-3),
        Step(
            "weights A = softmax(S/√d_k)",
            A,
            _a([[0.045, 0.768, 0.187], [0.768, 0.045, 0.187], [0.333, 0.333, 0.333]]),
            5e-4,
        ),
        Step("row sums of A", A.sum(axis=1), _a([1.0, 1.0, 1.0]), 1e-6),
        Step("output A V", out, _a([[1.045, 1.955], [1.768, 1.232], [1.333, 1.667]]), 5e-4),
        Step("log-sum-exp per row", res.lse[0, 0].astype(np.float64), note="what a fused kernel returns"),
    )
    return WorkedExample(
        "trace",
        "A complete numeric trace: self-attention on three tokens",
        "seed 004 §2",
        steps,
        note="Input and weight matrices are a reconstruction consistent with every printed number; "
        "unmasked (full) self-attention.",
        inputs={"tokens": TRACE_TOKENS, "X": X, "W_Q": WQ, "W_K": WK, "W_V": WV},
    )


def exercise_1() -> WorkedExample:
    """Handbook §10 problem 1: q = (1, 0.5, −0.5, 0), keys e₁ and e₂, d_k = 4."""
    q = _a([1.0, 0.5, -0.5, 0.0])
    keys = _a([[1, 0, 0, 0], [0, 1, 0, 0]])
    scale = default_scale(4)
    # values = identity, so the output row is the weight row itself
    res = attention(
        q[None, None, None], keys[None, None], np.eye(2)[None, None], scale=scale, return_weights=True
    )
    w = res.weights[0, 0, 0].astype(np.float64)
    steps = (
        Step("q·k", keys @ q, _a([1.0, 0.5]), 0.0),
        Step("scale 1/√d_k", _a(scale), _a(0.5), 0.0),
        Step("scaled scores", (keys @ q) * scale, _a([0.5, 0.25]), 0.0),
        Step("softmax weights", w, _a([0.562, 0.438]), 5e-4),
        Step(
            "raw-score ratio vs weight ratio",
            _a([1.0 / 1.5, w[0]]),
            _a([0.67, 0.56]),
            5e-3,
            "1.0 vs 0.5 raw is 67/33, the softmax gives only 56/44",
        ),
    )
    return WorkedExample(
        "exercise1",
        "Exercise 1: a small attention step, d_k = 4",
        "seed 004 §10 problem 1",
        steps,
        inputs={"q": q, "k1": keys[0], "k2": keys[1]},
    )


def exercise_3() -> WorkedExample:
    """Handbook §10 problem 3: RoPE's score depends only on the offset (θ = (1.0, 0.1), interleaved pairs)."""
    theta = _a([1.0, 0.1])
    q = k = _a([1, 0, 1, 0])
    s37 = rope_score(q, k, 3, 7, theta, interleaved=True)
    s04 = rope_score(q, k, 0, 4, theta, interleaved=True)
    steps = (
        Step("⟨R₃q, R₇k⟩", _a(s37), _a(0.2674), 5e-5),
        Step("⟨R₀q, R₄k⟩", _a(s04), _a(0.2674), 5e-5),
        Step("difference", _a(s37 - s04), _a(0.0), 5e-7, "identical to 6 decimal places"),
        Step(
            "cos(4·1.0) + cos(4·0.1)",
            _a(math.cos(4.0) + math.cos(0.4)),
            _a(0.2674),
            5e-5,
            "closed form: each pair contributes cos(offset·θ_i)",
        ),
    )
    return WorkedExample(
        "exercise3",
        "Exercise 3: RoPE's relative-position property, offset 4",
        "seed 004 §10 problem 3",
        steps,
        note="Interleaved pairs (x0, x1), (x2, x3) rotated by m·θ_i.",
        inputs={"theta": theta, "q": q, "k": k},
    )


def softmax_saturation() -> WorkedExample:
    """Handbook §3: ``softmax(15, 0, 0)`` is effectively one-hot (with the seed's erratum)."""
    p = softmax(_a([15.0, 0.0, 0.0]))
    steps = (
        Step(
            "softmax(15, 0, 0)",
            p,
            _a([0.99999969, 1.5e-7, 1.5e-7]),
            5e-9,
            "erratum: the handbook prints (0.99999969, 1.5e-7, 1.5e-7); exact is "
            "(0.99999939, 3.06e-7, 3.06e-7) since e^-15 = 3.06e-7",
            erratum=True,
        ),
        Step("max weight > 0.999999", _a(p[0] > 0.999999), _a(1.0), 0.0, "effectively one-hot"),
    )
    return WorkedExample(
        "saturation", "Why scale: softmax saturates at a score gap of 15", "seed 004 §3", steps
    )


def torch_text_memory() -> WorkedExample:
    """Seed 002 "The memory problem" and the scale for d_k = 128."""
    per_head = kv.attention_matrix_bytes(8192, dtype="fp32")
    heads64 = kv.attention_matrix_bytes(8192, n_heads=64, dtype="fp32")
    steps = (
        Step("elements of 8192 × 8192", _a(8192 * 8192), _a(67e6), 0.5e6, "“67 million elements”"),
        Step(
            "bytes per head, fp32 (MiB)", _a(per_head / 2**20), _a(256), 0.0, "“256 MB per head” (binary MB)"
        ),
        Step("bytes for 64 heads (GiB)", _a(heads64 / 2**30), _a(16), 0.0, "“16 GB” (binary GB)"),
        Step("scale 1/√128", _a(default_scale(128)), _a(0.088), 5e-4, "“about 0.088”"),
    )
    return WorkedExample(
        "seed002",
        "The O(T²) memory of naive attention; the scale for d_k = 128",
        "seed 002",
        steps,
        inputs={"seq_len": 8192, "dtype": "fp32"},
    )


def kv_cache_table_70b() -> WorkedExample:
    """Handbook §7: a 70B model's KV cache at 8192 tokens in bf16 (80 layers, head_dim 128)."""
    cfg = kv.KVConfig(n_layers=80, n_kv_heads=8, head_dim=128, n_heads=64, dtype="bf16", name="70B")
    rows = {r.scheme: r for r in kv.compare_schemes(cfg, 8192)}
    steps: tuple[Step, ...] = (
        Step("MHA, 64 KV heads (GB)", _a(rows["MHA"].total_bytes / 1e9), _a(21.5), 0.05),
        Step("GQA, 8 KV heads (GB)", _a(rows["GQA"].total_bytes / 1e9), _a(2.7), 0.05),
        Step("MQA, 1 KV head (GB)", _a(rows["MQA"].total_bytes / 1e9), _a(0.34), 0.005),
        Step("GQA-8 saving vs MHA", _a(rows["GQA"].vs_mha), _a(8), 0.0, "“8× less cache”"),
    )
    # the §7 diagram: 32 query heads; GQA with 8 KV heads is 4× smaller, MQA 32×
    small = {
        r.scheme: r for r in kv.compare_schemes(kv.KVConfig(80, 32, 128, n_heads=32), 8192, gqa_kv_heads=8)
    }
    steps += (
        Step("diagram: GQA 32→8 saving", _a(small["GQA"].vs_mha), _a(4), 0.0, "“4× smaller cache”"),
        Step("diagram: MQA 32→1 saving", _a(small["MQA"].vs_mha), _a(32), 0.0, "“32× smaller cache”"),
    )
    return WorkedExample(
        "kv70b",
        "KV cache of a 70B model: MHA vs GQA vs MQA",
        "seed 004 §7",
        steps,
        note="Decimal GB (10⁹ bytes).",
        inputs={"config": cfg, "seq_len": 8192},
    )


def memory_wall() -> WorkedExample:
    """Handbook §5: one layer's attention matrix at B = 8, H = 32, T = 8192 in bf16."""
    b = kv.attention_matrix_bytes(8192, n_heads=32, batch=8, dtype="bf16")
    steps = (
        Step(
            "one layer's attention matrix (GB)",
            _a(b / 1e9),
            _a(34.4),
            0.05,
            "“34.4 GB … an 80 GB GPU cannot materialize it”",
        ),
    )
    return WorkedExample(
        "memorywall",
        "The memory wall",
        "seed 004 §5",
        steps,
        inputs={"batch": 8, "n_heads": 32, "seq_len": 8192, "dtype": "bf16"},
    )


EXAMPLES: dict[str, Callable[[], WorkedExample]] = {
    "trace": three_token_trace,
    "exercise1": exercise_1,
    "exercise3": exercise_3,
    "saturation": softmax_saturation,
    "seed002": torch_text_memory,
    "kv70b": kv_cache_table_70b,
    "memorywall": memory_wall,
}


def all_examples() -> list[WorkedExample]:
    """Every worked example, recomputed (milliseconds)."""
    return [fn() for fn in EXAMPLES.values()]
