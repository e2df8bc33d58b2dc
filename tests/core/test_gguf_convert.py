"""Streamed GGUF conversion (attnscope.core.loading.gguf_convert) equals transformers' own GGUF loader, tensor for tensor.

float32: bit-exact; bfloat16/float16: transformers' float32 result rounded to the dtype (torch's
round-to-nearest-even), for every family AttnScope runs that transformers converts from GGUF.
"""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from attnscope.core.errors import Cancelled
from attnscope.core.loading import gguf_convert
from gguf_families import GGUF_FAMILIES, transformers_tensors, write_family_gguf

Q = gguf.GGMLQuantizationType


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    from attnscope.core.loading.quiet import quiet_transformers

    quiet_transformers()


def _reference(family, path, qtype, tmp_path):
    if family == "mistral":  # transformers cannot map a llama.cpp Mistral file: convert its llama twin
        path = write_family_gguf("mistral", tmp_path / "twin.gguf", qtype, name="tiny-llama")
    return transformers_tensors(path)


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=["F32", "Q8_0"])
@pytest.mark.parametrize("family", list(GGUF_FAMILIES))
def test_streamed_equals_transformers(family, qtype, tmp_path):
    path = write_family_gguf(family, tmp_path / f"{family}.gguf", qtype)
    ref = _reference(family, path, qtype, tmp_path)
    f32 = dict(gguf_convert.iter_tensors(path, "float32"))
    assert sorted(f32) == sorted(ref) and len(ref) > 10
    for k, v in ref.items():
        assert f32[k].dtype == torch.float32 and torch.equal(f32[k], v), k
    bf16 = dict(gguf_convert.iter_tensors(path, "bfloat16"))
    for k, v in ref.items():
        assert bf16[k].dtype == torch.bfloat16 and torch.equal(bf16[k], v.to(torch.bfloat16)), k


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.F16, Q.BF16], ids=["Q4_0", "Q4_1", "F16", "BF16"])
def test_other_types_llama(qtype, tmp_path):
    path = write_family_gguf("llama", tmp_path / "l.gguf", qtype)
    ref = transformers_tensors(path)
    for dtype in ("float32", "bfloat16", "float16"):
        got = dict(gguf_convert.iter_tensors(path, dtype))
        tdt = getattr(torch, dtype)
        assert all(torch.equal(got[k], v.to(tdt)) for k, v in ref.items()), dtype


def test_qk_rows_are_in_hugging_face_order(tmp_path):
    # a llama.cpp-style file (q/k rows permuted as convert_hf_to_gguf does) converts back to the model
    from tiny_models import tiny_model, write_llama_gguf

    model = tiny_model("llama")
    path = write_llama_gguf(model, tmp_path / "perm.gguf")
    got = dict(gguf_convert.iter_tensors(path, "float32"))
    for k, v in model.state_dict().items():
        assert torch.equal(got[k], v), k


def test_row_blocks_equal_whole_tensors(tmp_path, monkeypatch):
    path = write_family_gguf("gemma3_text", tmp_path / "g.gguf", Q.Q8_0)  # norms are w - 1: elementwise
    whole = dict(gguf_convert.iter_tensors(path, "bfloat16"))
    monkeypatch.setattr(gguf_convert, "CHUNK_BYTES", 1000)  # every matrix in blocks of a few rows
    blocks = dict(gguf_convert.iter_tensors(path, "bfloat16"))
    assert all(torch.equal(blocks[k], v) for k, v in whole.items())


def test_convert_writes_shards_index_config_tokenizer(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_family_gguf("qwen2", tmp_path / "q.gguf", Q.Q8_0)
    out = gguf_convert.convert(
        path, tmp_path / "out", "bfloat16", shard_bytes=20_000, source={"gguf": str(path)}
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    for s in shards:
        with safe_open(str(out / s), "pt") as f:
            assert all(f.get_slice(k).get_dtype() == "BF16" for k in f.keys())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / "attnscope_source.json").read_text()) == {
        "gguf": str(path),
        "conversion": gguf_convert.CONVERSION_VERSION,
        "notes": [],
    }
    m = AutoModelForCausalLM.from_pretrained(out)
    ref = transformers_tensors(path)
    assert m.dtype == torch.bfloat16
    assert all(torch.equal(m.state_dict()[k], v.to(torch.bfloat16)) for k, v in ref.items())
    assert AutoTokenizer.from_pretrained(out).encode("a t") == AutoTokenizer.from_pretrained(
        path.parent, gguf_file=path.name
    ).encode("a t")
    assert not list(tmp_path.glob("out.partial*"))


def test_cancel_between_tensors_leaves_nothing(tmp_path):
    path = write_family_gguf("llama", tmp_path / "l.gguf", Q.Q8_0)
    seen = []

    def progress(msg, frac):
        seen.append(msg)
        if msg.startswith("tensor 3/"):
            raise Cancelled("loading cancelled")

    with pytest.raises(Cancelled):
        gguf_convert.convert(path, tmp_path / "out", "float32", progress)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial*"))
    assert seen[-1].startswith("tensor 3/21: ")


def test_cache_is_keyed_by_hash_and_dtype(tmp_path):
    from attnscope.core.loading.conversion_cache import convert_gguf, converted_dir, list_converted

    path = write_family_gguf("llama", tmp_path / "l.gguf", Q.Q8_0)
    msgs = []
    a = convert_gguf(path, lambda m, f: msgs.append((m, f)), dtype="float32")
    b = convert_gguf(path, dtype="bfloat16")
    assert a == converted_dir(path, "float32") and b == converted_dir(path, "bfloat16") and a != b
    assert a.name.endswith("-float32") and b.name.endswith("-bfloat16")
    assert any("tensor 21/21: output.weight" in m for m, _ in msgs)
    fracs = [f for _, f in msgs]
    assert fracs == sorted(fracs) and 0 < fracs[0] and fracs[-1] <= 1
    assert sorted(c.name for c in list_converted() if c.complete) == sorted([a.name, b.name])
    # a second call finds the cache: no progress, same folder
    again = []
    assert convert_gguf(path, lambda m, f: again.append(m), dtype="bfloat16") == b and again == []


def test_half_written_cache_is_not_used(tmp_path):
    from attnscope.core.loading.conversion_cache import convert_gguf, converted_dir

    path = write_family_gguf("llama", tmp_path / "l.gguf", Q.Q8_0)
    out = converted_dir(path, "float32")
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")  # config but no weights: an interrupted old-style write
    res = convert_gguf(path, dtype="float32")
    assert res == out and (out / "model.safetensors").is_file()


def test_mistral_gguf_converts_where_transformers_cannot(tmp_path):
    from transformers import AutoModelForCausalLM

    path = write_family_gguf("mistral", tmp_path / "m.gguf", Q.Q8_0)
    with pytest.raises(NotImplementedError, match="mistral"):
        AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    out = gguf_convert.convert(path, tmp_path / "out", "float32")
    assert json.loads((out / "config.json").read_text())["model_type"] == "mistral"


@pytest.mark.slow
def test_default_model_equals_transformers(tmp_path):
    """SmolLM2-135M Q4_1: the whole converted model equals transformers' from_pretrained(gguf_file=)."""
    from attnscope.core.loading.resolve import default_gguf_path
    from transformers import AutoModelForCausalLM

    g = default_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32).state_dict()
    for dtype in ("float32", "bfloat16"):
        got = dict(gguf_convert.iter_tensors(g, dtype))
        tdt = getattr(torch, dtype)
        assert set(got) == set(ref) - {"lm_head.weight"}  # tied to the embedding
        assert all(torch.equal(got[k], ref[k].to(tdt)) for k in got), dtype
