"""A config.json that does not match its weights is refused at load, in one line (new-user trial):
more layers than the checkpoint holds loaded at random and exported maps of random weights; a
size mismatch said only "You set `ignore_mismatched_sizes` to `False` ... look at the above report!"."""

from __future__ import annotations

import json
import shutil

import pytest
from attnscope.core.errors import ModelLoadError
from attnscope.core.session import Session
from tiny_models import save_tiny

SIZES = (
    "config.json's sizes (hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, "
    "head_dim) do not match the checkpoint"
)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cfg") / "good"
    save_tiny("llama", folder)  # 2 layers, hidden 64, 4 heads, 2 KV heads, intermediate 128
    return folder


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _variant(good, tmp_path, name, edit):
    folder = tmp_path / name
    shutil.copytree(good, folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _refused(folder) -> str:
    with pytest.raises(ModelLoadError) as info:
        Session.load(str(folder), device="cpu")
    msg = str(info.value)
    assert "\n" not in msg and "above report" not in msg
    return msg


def test_more_layers_than_the_weights_hold(good, tmp_path):
    folder = _variant(good, tmp_path, "layers", lambda c: c.update(num_hidden_layers=3))
    assert _refused(folder) == (
        "cannot load layers: config.json says 3 layers but the weights hold 2: layer 2 (9 tensors, "
        "e.g. model.layers.2.input_layernorm.weight, …) would be random weights; fix num_hidden_layers"
    )
    folder = _variant(good, tmp_path, "layers5", lambda c: c.update(num_hidden_layers=5))
    assert _refused(folder).startswith(
        "cannot load layers5: config.json says 5 layers but the weights hold 2: layers 2..4 (27 tensors, "
    )


def test_a_tensor_missing_from_the_weights(good, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nonorm"
    shutil.copytree(good, folder)
    weights = load_file(folder / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert _refused(folder) == (
        "cannot load nonorm: the weights lack 1 tensor the model's config.json asks for (model.norm.weight): "
        "they would be random weights; the checkpoint does not match its config.json"
    )


@pytest.mark.parametrize(
    ("name", "edit", "tensor", "ckpt", "model", "more"),
    [
        (
            "noheads",
            lambda c: c.pop("num_attention_heads"),
            "model.layers.0.self_attn.o_proj.weight",
            "(64, 64)",
            "(64, 512)",
            3,
        ),
        (
            "inter",
            lambda c: c.update(intermediate_size=96),
            "model.layers.0.mlp.down_proj.weight",
            "(64, 128)",
            "(64, 96)",
            5,
        ),
        (
            "kv",
            lambda c: c.update(num_key_value_heads=1),
            "model.layers.0.self_attn.k_proj.weight",
            "(32, 64)",
            "(16, 64)",
            3,
        ),
    ],
)
def test_a_shape_mismatch_names_the_tensor_and_both_shapes(
    good, tmp_path, name, edit, tensor, ckpt, model, more
):
    folder = _variant(good, tmp_path, name, edit)
    assert _refused(folder) == (
        f"cannot load {name}: {tensor} is {ckpt} in the weights but config.json makes it {model} "
        f"(and {more} more tensors): {SIZES}"
    )


def test_the_matching_folder_still_loads(good):
    s = Session.load(str(good), device="cpu")
    assert s.info.n_layers == 2


def test_the_streamed_int8_load_refuses_the_same(good, tmp_path):
    """--quantize int8 streams tensor by tensor (core/loading/stream_load.py), which put a checkpoint's
    own shape in silently: the intermediate_size mismatch loaded."""
    folder = _variant(good, tmp_path, "inter8", lambda c: c.update(intermediate_size=96))
    with pytest.raises(ModelLoadError) as info:
        Session.load(str(folder), device="cpu", quantize="int8")
    assert str(info.value) == (
        "cannot load inter8: model.layers.0.mlp.down_proj.weight is (64, 128) in the weights but config.json "
        f"makes it (64, 96) (and 5 more tensors): {SIZES}"
    )
    folder = _variant(good, tmp_path, "layers8", lambda c: c.update(num_hidden_layers=3))
    with pytest.raises(
        ModelLoadError, match="^cannot load layers8: config.json says 3 layers but the weights hold 2: "
    ):
        Session.load(str(folder), device="cpu", quantize="int8")
