"""Mlx-lm 4-/8-bit folders load as ``nn.QuantizedLinear`` and the capture stays exact.

The quantised folder is written here as mlx-lm writes one: ``nn.quantize`` of a float model
(every layer with ``to_quantized`` whose input size the group divides: linears and the embedding),
packed weights + ``scales`` + ``biases`` in safetensors, ``"quantization": {"group_size", "bits"}``
in config.json. The reference is transformers eager on the *dequantised* weights (``mx.dequantize``
of the very same packed arrays, written as a float folder): what the quantised model computes.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")

import torch  # noqa: E402
from attnscope.core.backends.mlx_backend import MlxBackend, float_weight  # noqa: E402
from attnscope.core.errors import UnsupportedModelError  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from tiny_models import COMMON, tiny_tokenizer  # noqa: E402

IDS = [5, 17, 3, 88, 42, 42, 7, 63, 11, 29, 5, 70, 2, 91]
CFG = dict(COMMON, hidden_size=128, intermediate_size=256, vocab_size=320, tie_word_embeddings=False)
GROUP = 64


@pytest.fixture(scope="module")
def float_folder(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("mlxq") / "float"
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **CFG), dtype=torch.float32)
    m.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _quantised_folder(float_folder, out, bits):
    """mlx-lm's layout: quantise a float MLX model, save packed weights and the quantization config."""
    b = MlxBackend.load(str(float_folder))
    nn.quantize(
        b.model,
        group_size=GROUP,
        bits=bits,
        class_predicate=lambda p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % GROUP == 0,
    )
    out.mkdir()
    weights = dict(tree_flatten(b.model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    cfg = json.loads((float_folder / "config.json").read_text())
    cfg["quantization"] = {"group_size": GROUP, "bits": bits}
    (out / "config.json").write_text(json.dumps(cfg))
    for f in float_folder.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return out, b.model


def _dequantised_folder(qmodel, float_folder, out):
    """The float weights the quantised model computes with, as a transformers folder."""
    from safetensors.numpy import save_file

    shutil.copytree(float_folder, out)
    state = {}
    for name, mod in qmodel.named_modules():
        if hasattr(mod, "scales"):  # QuantizedLinear / QuantizedEmbedding
            state[f"{name}.weight"] = np.array(float_weight(mod).astype(mx.float32))
    for k, v in tree_flatten(qmodel.parameters()):
        if k.endswith(("scales", "biases")) or k in state:
            continue
        if not (k.endswith(".weight") and k[: -len(".weight")] + ".weight" in state):
            state[k] = np.array(v.astype(mx.float32))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 8])
def test_mlx_quantised_folder_loads_quantised_and_stays_exact(float_folder, tmp_path, bits):
    from transformers import AutoModelForCausalLM

    qfolder, qmodel = _quantised_folder(float_folder, tmp_path / f"q{bits}", bits)
    b = MlxBackend.load(str(qfolder))
    layer0 = b.model.model.layers[0]
    assert isinstance(layer0.self_attn.q_proj, nn.QuantizedLinear) and layer0.self_attn.q_proj.bits == bits
    assert isinstance(layer0.mlp.down_proj, nn.QuantizedLinear)
    assert isinstance(b.model.model.embed_tokens, nn.QuantizedEmbedding)
    assert b.model.lm_head.weight.dtype == mx.uint32  # packed: bits per weight, not 32
    assert b.info.quantization_file == f"MLX {bits}-bit (group {GROUP})"
    assert b.info.quantization_runtime.startswith(f"MLX {bits}-bit (group {GROUP}")
    logits = np.concatenate([b.forward(IDS[:9], all_logits=True)] + [b.forward([t])[None] for t in IDS[9:]])
    ref_folder = _dequantised_folder(qmodel, float_folder, tmp_path / f"deq{bits}")
    eager = AutoModelForCausalLM.from_pretrained(
        ref_folder, attn_implementation="eager", dtype=torch.float32
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


def test_runtime_quantize_on_mlx(float_folder):
    b = MlxBackend.load(str(float_folder), quantize="int4")
    assert isinstance(b.model.model.layers[1].mlp.up_proj, nn.QuantizedLinear)
    assert isinstance(b.model.lm_head, nn.Linear) and not isinstance(b.model.lm_head, nn.QuantizedLinear)
    assert b.info.quantization_runtime == "int4 weight-only (mlx.nn.quantize, groups of 64), 14 linear layers"
    w = (b.forward(IDS), b.trace.weights(1, 3))[1]
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)


def test_mlx_quantised_folder_refused_by_torch_names_mlx(float_folder, tmp_path):
    from attnscope.core.session import Session

    qfolder, _ = _quantised_folder(float_folder, tmp_path / "q4", 4)
    with pytest.raises(
        UnsupportedModelError,
        match=r"^llama checkpoint holds MLX-quantised weights \(4-bit\): "
        r"the torch backend cannot load them; open it with --backend mlx$",
    ):
        Session.load(str(qfolder))
    assert Session.load(str(qfolder), backend="mlx").info.quantization_file == "MLX 4-bit (group 64)"
