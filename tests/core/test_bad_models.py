"""Broken and unsupported model files each give their own one-line message, before anything half-loads.

Each case goes through :meth:`Session.load` (what the app and CLI call) and through the catalog
(what the picker shows), which must say the same thing.
"""

from __future__ import annotations

import json
import shutil

import gguf
import pytest
from attnscope.core.errors import ModelLoadError, UnsupportedModelError
from attnscope.core.loading.describe_model import describe_path
from tiny_models import save_tiny, set_tensor_type, tiny_model, write_llama_gguf


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    save_tiny("llama", root / "llama")
    write_llama_gguf(tiny_model("llama"), root / "tiny.gguf")
    return root


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _refused(path, exc, pattern):
    """Session.load raises ``exc`` matching ``pattern``; the catalog lists the path with the same reason."""
    from attnscope.core.loading.cache_folder import cache_root
    from attnscope.core.session import Session

    with pytest.raises(exc, match=pattern) as info:
        Session.load(str(path))
    msg = str(info.value)
    assert "\n" not in msg
    (entry,) = describe_path(path)
    assert not entry.supported and entry.reason == msg
    converted = cache_root() / "converted"
    assert not converted.exists() or not any(converted.iterdir()), (
        "nothing may be converted from a refused file"
    )
    return msg


def _copy(good, tmp_path, name):
    dst = tmp_path / name
    if (good / name).is_dir():
        shutil.copytree(good / name, dst)
    else:
        shutil.copyfile(good / name, dst)
    return dst


def test_truncated_safetensors(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    st = folder / "model.safetensors"
    size = st.stat().st_size
    with open(st, "r+b") as f:
        f.truncate(size - 1000)
    msg = _refused(folder, ModelLoadError, r"model\.safetensors is truncated: its header promises")
    assert f"the file has {size - 1000}" in msg


def test_safetensors_cut_inside_its_header(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(100)
    _refused(folder, ModelLoadError, r"model\.safetensors is truncated or not safetensors")


def test_config_not_json(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    (folder / "config.json").write_text('{"model_type": "llama", ')
    _refused(folder, ModelLoadError, r"config\.json is not valid JSON")


def test_config_without_model_type(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["model_type"]
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(folder, ModelLoadError, r"has no model_type: not a transformers model config")


def test_unknown_architecture(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(
        folder,
        UnsupportedModelError,
        r"mamba is not supported: its layers do not call transformers' attention interface",
    )


def test_quantised_checkpoint(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(
        folder,
        UnsupportedModelError,
        r"quantised with awq 4-bit: its kernels \(gptqmodel\) run on a CUDA GPU",
    )


def test_missing_shard(good, tmp_path):
    folder = _copy(good, tmp_path, "llama")
    # a sharded folder (transformers reads the index only when there is no model.safetensors)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {},
                "weight_map": {
                    "a": "model-00001-of-00002.safetensors",
                    "b": "model-00002-of-00002.safetensors",
                },
            }
        )
    )
    _refused(folder, ModelLoadError, r"shard model-00002-of-00002\.safetensors is missing")


def test_gguf_unknown_type_names_type_and_tensor(good, tmp_path):
    g = _copy(good, tmp_path, "tiny.gguf")
    set_tensor_type(g, "blk.1.attn_k.weight", 99)
    _refused(
        g,
        UnsupportedModelError,
        r"tiny\.gguf: tensor blk\.1\.attn_k\.weight is stored as unknown type id 99, "
        r"which transformers cannot dequantise; loadable types: F32, F16, .*Q4_K",
    )


def test_gguf_type_transformers_cannot_dequantise(good, tmp_path):
    g = _copy(good, tmp_path, "tiny.gguf")
    for t in ("blk.0.ffn_up.weight", "blk.1.ffn_up.weight"):
        set_tensor_type(g, t, int(gguf.GGMLQuantizationType.Q8_K))
    _refused(
        g,
        UnsupportedModelError,
        r"tensor blk\.0\.ffn_up\.weight is stored as Q8_K, which transformers cannot "
        r"dequantise \(and 1 more tensor\(s\)\)",
    )


def test_truncated_gguf(good, tmp_path):
    g = _copy(good, tmp_path, "tiny.gguf")
    with open(g, "r+b") as f:
        f.truncate(g.stat().st_size - 4096)
    _refused(g, ModelLoadError, r"tiny\.gguf is truncated: tensor \S+ runs past the end of the file")


def test_gguf_cut_inside_its_header(good, tmp_path):
    g = _copy(good, tmp_path, "tiny.gguf")
    with open(g, "r+b") as f:
        f.truncate(2000)
    _refused(g, ModelLoadError, r"tiny\.gguf: header is truncated")


def test_not_a_gguf(tmp_path):
    g = tmp_path / "fake.gguf"
    g.write_bytes(b"PK\x03\x04" + bytes(100))
    _refused(g, ModelLoadError, r"fake\.gguf is not a GGUF file \(bad magic bytes\)")


def test_split_gguf(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m-00001-of-00002.gguf"), "llama")
    w.add_uint16("split.no", 0)
    w.add_uint16("split.count", 2)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 4), dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(tmp_path / "m-00001-of-00002.gguf", ModelLoadError, r"part 1 of 2 of a split GGUF")


def test_gguf_of_an_architecture_transformers_cannot_convert(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "rwkv.gguf"), "rwkv7")
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 4), dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(
        tmp_path / "rwkv.gguf",
        UnsupportedModelError,
        r"GGUF architecture 'rwkv7' cannot be converted by transformers",
    )


def test_a_text_file_is_not_a_model(tmp_path):
    from attnscope.core.session import Session

    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="expected a .gguf file or a Hugging Face model folder"):
        Session.load(str(tmp_path / "notes.txt"))
