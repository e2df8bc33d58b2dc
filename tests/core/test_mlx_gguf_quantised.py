"""A Q4_0 / Q4_1 / Q8_0 GGUF on the MLX backend stays quantised (core/backends/mlx_gguf.py).

The GGUFs are written here from a tiny random llama (q/k rows permuted as llama.cpp does). The
reference is the conversion path: the same GGUF converted to a float32 safetensors folder (gguf's
dequantisation + transformers' processors). At float32 every packed layer must dequantise to that
folder's weight bit for bit, the logits agree to float32 matmul roundoff, and every head's
captured map equals eager attention of the converted model.
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")

import gguf  # noqa: E402
import torch  # noqa: E402
from attnscope.core.backends.mlx_backend import MlxBackend, float_weight  # noqa: E402
from attnscope.core.backends.mlx_gguf import load_packed, packable  # noqa: E402
from tiny_models import COMMON, tiny_model, write_llama_gguf  # noqa: E402

IDS = [5, 17, 3, 88, 42, 42, 7, 63, 11, 29, 5, 70, 2, 91]
QTYPES = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlxgguf")
    m = tiny_model("llama")
    out = {}
    for name in (*QTYPES, "F32"):
        out[name] = write_llama_gguf(m, root / f"tiny-{name}.gguf", getattr(gguf.GGMLQuantizationType, name))
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _converted_weights(path):
    from attnscope.core.loading.resolve import resolve

    folder, _ = resolve(str(path), dtype="float32")
    w = {}
    for f in sorted(folder.glob("*.safetensors")):
        w.update(mx.load(str(f)))
    return folder, w


@pytest.mark.parametrize("qtype", list(QTYPES))
def test_packed_gguf_dequantises_to_the_converted_weights(ggufs, cache, qtype):
    b = MlxBackend.load(str(ggufs[qtype]), dtype="float32")
    bits = QTYPES[qtype]
    q = b.model.model.layers[0].self_attn.q_proj
    assert isinstance(q, nn.QuantizedLinear) and q.bits == bits and q.group_size == 32
    assert isinstance(b.model.model.embed_tokens, nn.QuantizedEmbedding)
    assert b.info.quantization_runtime.startswith("Q8_0 kept packed (mlx QuantizedLinear, groups of 32): ")
    assert b.info.quantization_runtime.endswith(f"16 layers (16 {bits}-bit)")  # 2 × 7 linears, embed, lm_head
    assert not (cache / "converted").exists()  # nothing was converted
    _, ref = _converted_weights(ggufs[qtype])
    n = 0
    for name, mod in b.model.named_modules():
        if hasattr(mod, "scales"):
            np.testing.assert_array_equal(np.array(float_weight(mod)), np.array(ref[f"{name}.weight"]))
            n += 1
    assert n == 16
    for name in ("model.norm.weight", "model.layers.1.input_layernorm.weight"):
        np.testing.assert_array_equal(
            np.array(dict(b.model.named_modules())[name.rpartition(".")[0]].weight), np.array(ref[name])
        )


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_packed_gguf_capture_is_exact_for_the_model_that_ran(ggufs, cache, qtype):
    from transformers import AutoModelForCausalLM

    b = MlxBackend.load(str(ggufs[qtype]), dtype="float32")
    logits = np.concatenate([b.forward(IDS[:9], all_logits=True)] + [b.forward([t])[None] for t in IDS[9:]])
    folder, _ = _converted_weights(ggufs[qtype])
    eager = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        out = eager(torch.tensor([IDS]), output_attentions=True)
    ref = out.logits[0].numpy()
    assert np.abs(logits - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
    for layer in range(b.info.n_layers):
        for head in range(b.info.n_heads):
            np.testing.assert_allclose(
                b.trace.weights(layer, head), out.attentions[layer][0, head].numpy(), atol=1e-5
            )
    assert b.value_norms(0).shape == (b.info.n_heads, len(IDS))  # reads the dequantised o_proj


def test_bfloat16_rounds_the_scales_only(ggufs, cache):
    b = MlxBackend.load(str(ggufs["Q4_0"]), dtype="bfloat16")
    q = b.model.model.layers[1].mlp.down_proj
    assert q.scales.dtype == mx.bfloat16 and q.weight.dtype == mx.uint32
    w = b.forward(IDS)
    assert w.shape == (COMMON["vocab_size"],) and np.isfinite(w).all()
    np.testing.assert_allclose(b.trace.weights(1, 2).sum(axis=1), 1.0, atol=1e-5)


def test_float_or_other_types_convert_as_before(ggufs, cache):
    assert not packable(ggufs["F32"])
    assert load_packed(ggufs["F32"], mx.float32) is None
    b = MlxBackend.load(str(ggufs["F32"]), dtype="float32")
    assert type(b.model.model.layers[0].self_attn.q_proj) is nn.Linear
    assert b.info.quantization_runtime == ""
    assert (cache / "converted").is_dir()


def test_runtime_quantize_still_converts_first(ggufs, cache):
    """--quantize int8 on a Q4_0 GGUF: the file is converted to float and re-quantised (as asked)."""
    b = MlxBackend.load(str(ggufs["Q4_0"]), dtype="float32", quantize="int8")
    assert b.info.quantization_runtime.startswith("int8 weight-only (mlx.nn.quantize")


@pytest.mark.slow
def test_embedded_model_on_mlx_stays_q4_1(cache):
    """SmolLM2's Q4_1 GGUF (its embedding Q8_0) loads packed on MLX: 210 4-bit linears + the 8-bit
    tied embedding, and its maps are proper softmax rows."""
    b = MlxBackend.load(None)
    assert b.info.quantization_file == "Q4_1"
    assert b.info.quantization_runtime.endswith("211 layers (210 4-bit, 1 8-bit)")
    b.forward([1, 504, 3458, 314, 260, 3767])
    np.testing.assert_allclose(b.trace.weights(29, 8).sum(axis=1), 1.0, atol=1e-5)
