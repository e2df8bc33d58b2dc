"""CUDA parity: the fused CUDA path (FlashAttention-2 / memory-efficient kernels with LSE) against
the unfused float32 math path and against transformers eager, on SmolLM2, in float32 and bfloat16.

Skipped without CUDA. Run on a GPU machine with ``pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPT = (
    "In a quiet village by the sea, an old fisherman mended his nets every morning while the gulls "
    "circled above and the children ran along the shore."
)
# (out, lse) tolerances of the fused kernel against the float32 math path on the same inputs.
# bf16: FlashAttention rounds P to bf16 before P·V (out ~ 2^-8 relative); its LSE stays float32.
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 1e-3)}
DTYPES = [torch.float32, torch.bfloat16]


def _qkv(L, S, dtype, H=9, Hkv=3, D=64, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(1, H, L, D, generator=g) * 2
    k = torch.randn(1, Hkv, S, D, generator=g) * 2
    v = torch.randn(1, Hkv, S, D, generator=g)
    return (t.to("cuda", dtype) for t in (q, k, v))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "L,S,window",
    [(64, 64, None), (1, 300, None), (37, 300, None), (512, 2048, None), (300, 300, 16), (1, 300, 16)],
)
def test_fused_cuda_kernel_taken_and_equal_to_math(dtype, L, S, window):
    from attnscope.core.attention import fused as A

    q, k, v = _qkv(L, S, dtype)
    Hkv = k.shape[1]
    structural = not (window is None and L in (1, S))
    is_causal = window is None and L == S and L > 1
    bias5 = A.mask_bias(
        L,
        S,
        Hkv,
        causal=structural,
        sliding_window=window if window and window < S else None,
        dtype=q.dtype,
        device=q.device,
    )
    assert A._cuda_fused(q, k, v, 64**-0.5, is_causal, bias5) is not None, "fell back to the unfused path"
    out, lse = A.sdpa_with_lse(q, k, v, causal=True, sliding_window=window)
    ref_out, ref_lse = A.math_with_lse(q, k, v, causal=True, sliding_window=window)
    assert out.dtype == dtype and lse.dtype == torch.float32
    tol_out, tol_lse = TOL[dtype]
    assert (out.float() - ref_out.float()).abs().max().item() < tol_out
    assert (lse - ref_lse).abs().max().item() < tol_lse * max(1.0, ref_lse.abs().max().item())


@pytest.fixture(scope="module")
def folder():
    from attnscope.core.loading.resolve import resolve

    return resolve(None)[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_session_on_cuda_weights_equal_eager(folder, dtype):
    from attnscope.core.session import Session
    from transformers import AutoModelForCausalLM

    s = Session.load(device="cuda", dtype=str(dtype).removeprefix("torch."))
    s.prefill(PROMPT, chat_template=False)
    s.step(3)
    eager = (
        AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
        .to("cuda")
        .eval()
    )
    with torch.no_grad():
        ref = eager(torch.tensor([s.ids], device="cuda"), output_attentions=True).attentions
    worst = 0.0
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            w = s.weights(layer, head)
            np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-4)
            worst = max(worst, float(np.abs(w - ref[layer][0, head].float().cpu().numpy()).max()))
    # float32: exact to rounding. bf16: eager rounds q·k and the weights to bf16 (2^-8 relative)
    # while ours are float32 from the same bf16 q and k, so only bf16-sized differences remain.
    assert worst < (1e-5 if dtype == torch.float32 else 3e-2), worst


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_from_fused_lse_equal_math_lse(dtype):
    """Weights recomputed with the fused kernel's LSE equal those from the math path's LSE."""
    from attnscope.core.attention import fused as A

    q, k, v = _qkv(200, 200, dtype, seed=1)
    _, lse = A.sdpa_with_lse(q, k, v, causal=True)
    _, ref_lse = A.math_with_lse(q, k, v, causal=True)
    w = A.attention_weights(q, k, lse, mask="causal")
    ref = A.attention_weights(q, k, ref_lse, mask="causal")
    assert (w - ref).abs().max().item() < (1e-5 if dtype == torch.float32 else 1e-3)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-3, rtol=0)


def test_logits_cuda_equal_cpu():
    from attnscope.core.session import Session

    gpu = Session.load(device="cuda")
    cpu = Session.load(device="cpu")
    for s in (gpu, cpu):
        s.prefill(PROMPT, chat_template=False)
    assert np.abs(gpu.logits - cpu.logits).max() < 1e-3
    np.testing.assert_allclose(gpu.weights(7, 4), cpu.weights(7, 4), atol=1e-5)


def test_quick_bench_on_cuda():
    from attnscope.core.bench.overhead import BenchOptions, run_bench

    res = run_bench(
        BenchOptions(
            sizes=(256,),
            repeats=1,
            decode_steps=4,
            head_repeats=2,
            matmul_n=1024,
            memory=False,
            device="cuda",
        )
    )
    assert res["machine"]["device"] == "cuda" and res["machine"]["gpu"]
    for c in ("sdpa", "scope", "eager"):
        d = res["sizes"][0]["configs"][c]
        assert d["prefill_median_s"] > 0 and d["decode_step_median_s"] > 0
    assert res["sizes"][0]["configs"]["scope"]["head_map_median_s"] > 0
