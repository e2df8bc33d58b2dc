"""The streamed GGUF conversion on a real-shaped synthetic checkpoint ("streamed conversion
equals transformers' own dequantisation on ... a Q4_0/Q8_0 synthetic").

``tests/make_synthetic.py --layers 1``: Llama-3.2-1B's published geometry (a 128,256 × 2,048 tied
embedding, 1 GB at float32, so above the converter's 256 MB row-block threshold; 32 query heads on
8 KV heads of 64; MLP 8,192) with one decoder layer, written as llama.cpp writes it (q/k rows
permuted). Each tensor of :func:`attnscope.core.loading.gguf_convert.iter_tensors` equals
transformers' ``load_gguf_checkpoint`` bit for bit at float32 and is its float32 result rounded at
bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from gguf_families import transformers_tensors
from make_synthetic import write_gguf


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.slow
@pytest.mark.parametrize("qname", ["Q8_0", "Q4_0"])
def test_streamed_conversion_of_a_real_shaped_synthetic_equals_transformers(qname, tmp_path):
    from attnscope.core.loading import gguf_convert
    from attnscope.core.loading.quiet import quiet_transformers

    quiet_transformers()
    path = write_gguf("llama-3.2-1b", tmp_path, qname, layers=1, log=lambda *_: None)
    assert path.name == f"Llama-3.2-1B-L1-{qname}.gguf"
    ref = transformers_tensors(path)
    emb = ref["model.embed_tokens.weight"]
    assert tuple(emb.shape) == (128256, 2048) and emb.numel() * 4 > 256 << 20  # row blocks
    assert tuple(ref["model.layers.0.self_attn.k_proj.weight"].shape) == (512, 2048)
    seen = set()
    for name, t in gguf_convert.iter_tensors(path, "float32"):
        assert t.dtype == torch.float32 and torch.equal(t, ref[name]), name
        seen.add(name)
    assert seen == set(ref) and len(seen) == 11
    for name, t in gguf_convert.iter_tensors(path, "bfloat16"):
        assert t.dtype == torch.bfloat16 and torch.equal(t, ref[name].to(torch.bfloat16)), name
    # and not trivially: the quantised weights differ from one another and are not all zero
    q = ref["model.layers.0.self_attn.q_proj.weight"]
    assert 0.01 < float(q.float().std()) < 0.03
