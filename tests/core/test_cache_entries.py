"""The conversion cache and the quantised-weights cache are listed by one lister
(``resolve.cache_entries``): a damaged ``attnscope_source.json`` of either kind lists its entry with
the source unknown, and ``attnscope models --list-cache`` prints it, never a traceback."""

from __future__ import annotations

import json

import pytest
from attnscope.core.cli.main import main
from attnscope.core.loading import quant_cache
from attnscope.core.loading.cache_folder import cache_source_record
from attnscope.core.loading.conversion_cache import list_converted


@pytest.fixture
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_QUANT_CACHE_DIR", str(tmp_path / "cache" / "quantised"))
    return tmp_path / "cache"


def _entry(folder, record: str, weights: bytes = b"x" * 10):
    folder.mkdir(parents=True)
    (folder / quant_cache.SOURCE).write_text(record)
    (folder / quant_cache.WEIGHTS).write_bytes(weights)
    return folder


def test_quantised_entry_whose_source_record_is_a_list_is_listed(caches, capsys):
    e = _entry(caches / "quantised" / "m-abc-float32-int8", "[1, 2]")
    [c] = list_converted()
    assert (c.path, c.source, c.sha256, c.kind, c.complete) == (e, "", "", "int8 weights", True)
    assert main(["models", "--list-cache"]) == 0
    out = capsys.readouterr().out
    assert "m-abc-float32-int8  <- ?  [int8 weights]" in out
    assert "1 cache entry: 0 converted model(s), 1 quantised weight set(s)" in out


@pytest.mark.parametrize(
    "record", ["[1, 2]", '"text"', "null", "3", "{not json", '{"gguf": null, "sha256": [1]}', ""]
)
def test_every_damaged_record_of_either_cache_lists_both_entries(caches, capsys, record):
    _entry(caches / "quantised" / "q-key-bfloat16-int4", record, b"y" * 30)
    conv = _entry(caches / "converted" / "model-0123456789abcdef-float32", record, b"z" * 20)
    got = {c.name: c for c in list_converted()}
    assert list(got) == ["q-key-bfloat16-int4", conv.name]  # largest first (30 then 20 bytes, + record)
    assert got[conv.name].source == "" and got[conv.name].kind == ""
    assert got[conv.name].complete is False  # no config.json: not a finished conversion
    assert got["q-key-bfloat16-int4"].kind == "int4 weights"
    assert main(["models", "--list-cache"]) == 0
    assert "2 cache entries: 1 converted model(s), 1 quantised weight set(s)" in capsys.readouterr().out


def test_sound_record_keeps_its_fields(caches):
    rec = {"folder": "/models/llama", "key": "k123", "mode": "int8", "torchao": "0.9"}
    _entry(caches / "quantised" / "llama-k123-float32-int8", json.dumps(rec))
    assert cache_source_record(caches / "quantised" / "llama-k123-float32-int8") == rec
    [c] = list_converted()
    assert (c.source, c.sha256, c.kind) == ("/models/llama", "k123", "int8 weights (torchao 0.9)")
