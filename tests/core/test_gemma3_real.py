"""Gemma 3 270M, the second real model : MQA (4 query heads on
1 KV head), head_dim 256, 512-key sliding windows on five of every six layers, k-quants, SentencePiece.

Every head's map after prefill + decode equals transformers' eager attention weights of the same
converted checkpoint, on a prompt long enough (600 tokens) that the sliding windows mask keys.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_gemma3_270m_maps_and_logits_equal_eager(gemma_gguf):
    import torch
    from attnscope.core.loading.resolve import resolve
    from attnscope.core.session import Session
    from tiny_models import eager_reference
    from transformers import AutoModelForCausalLM

    s = Session.load(str(gemma_gguf), dtype="float32")
    info = s.info
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim) == (18, 4, 1, 256)
    prompt = " ".join(f"item {i} is {'red' if i % 3 else 'blue'}," for i in range(120))
    s.prefill(prompt, chat_template=False)
    s.step(4)
    T = s.seq_len
    assert T > 600  # past the 512-key window
    folder, _ = resolve(str(gemma_gguf), dtype="float32")
    eager = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    logits, attn = eager_reference(eager, s.ids)
    windowed = [layer for layer in range(info.n_layers) if s.trace.layers[layer].sliding_window]
    assert len(windowed) == 15 and all(s.trace.layers[layer].sliding_window == 512 for layer in windowed)
    # Exact for the forward that ran: every map is the float64 softmax of the stored q and cached k
    # under the layer's mask. Against eager (another forward of the same weights), the float32
    # rounding of the two forwards grows with depth (measured: 2.4e-5 at layer 7, 1.1e-4 at 8).
    for layer in range(info.n_layers):
        rec = s.trace.layers[layer]
        allowed = np.tril(np.ones((T, T), dtype=bool))
        if rec.sliding_window:
            allowed &= ~np.tril(np.ones((T, T), dtype=bool), -rec.sliding_window)
        for head in range(info.n_heads):
            w = s.weights(layer, head)
            sc = rec.q()[head].double().numpy() @ rec.keys[0].double().numpy().T * rec.scale
            sc = np.where(allowed, sc, -np.inf)
            ref = np.exp(sc - sc.max(1, keepdims=True))
            ref /= ref.sum(1, keepdims=True)
            np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6, err_msg=f"layer {layer} head {head}")
            tol = 2e-5 if layer < 2 else 1e-3
            np.testing.assert_allclose(
                w, attn[layer][head], atol=tol, err_msg=f"eager, layer {layer} head {head}"
            )
    w = s.weights(windowed[0], 0)
    assert w[T - 1, : T - 512].max() == 0.0 and w[T - 1, T - 512 :].sum() == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(s.logits_at(), logits[-1], atol=2e-3, rtol=1e-4)
