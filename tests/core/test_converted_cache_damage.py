"""A damaged conversion-cache entry is detected and converted again, with a status line (new-user trial:
a truncated ``<cache>/converted/<entry>/model.safetensors`` made every later load of the same .gguf end
in ``cannot load …: Error while deserializing header: incomplete metadata, file not fully covered``);
an unwritable cache folder is one line naming it and ATTNSCOPE_CACHE_DIR (it said ``[Errno 2] No such
file or directory: '/proc/attn'``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.errors import ModelLoadError
from attnscope.core.loading import conversion_cache as R
from tiny_models import tiny_model, write_llama_gguf


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_llama_gguf(tiny_model("llama"), tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def entry(gguf, cache):
    """A finished conversion of the tiny GGUF at float32 in a fresh cache."""
    out = R.convert_gguf(gguf)
    assert out.parent == cache / "converted" and R.converted_damage(out) == ""
    return out


def _cut(path, keep: int) -> int:
    """Keep the first ``keep`` bytes of ``path`` (negative: drop that many from the end); its old size."""
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    return len(data)


def _header_end(path) -> int:
    import struct

    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def test_a_sound_entry_is_used_as_it_is(gguf, entry):
    stamp = (entry / "model.safetensors").stat().st_mtime_ns
    said = []
    assert R.convert_gguf(gguf, lambda m, f: said.append(m)) == entry
    assert said == [] and (entry / "model.safetensors").stat().st_mtime_ns == stamp
    assert [c.complete for c in R.list_converted() if c.name == entry.name] == [True]


def test_each_kind_of_damage_is_named(entry):
    st = entry / "model.safetensors"
    size = _cut(st, -100)
    want = f"model.safetensors is truncated: its header promises {size} bytes, the file has {size - 100}"
    assert R.converted_damage(entry) == want
    _cut(st, 4)
    assert R.converted_damage(entry) == "model.safetensors is truncated: 4 bytes, no safetensors header"
    st.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    assert R.converted_damage(entry) == (
        "model.safetensors is truncated or not safetensors: header of 1000000000 bytes in a 10-byte file"
    )
    st.write_bytes((4).to_bytes(8, "little") + b"{x:1")
    assert R.converted_damage(entry).startswith("model.safetensors has a corrupt safetensors header: ")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_a_cut_json_file_is_named(entry, name):
    _cut(entry / name, 20)
    why = R.converted_damage(entry)
    assert why.startswith(f"{name} is truncated or not JSON: ") and "\n" not in why


def test_a_large_json_file_is_checked_by_its_ends(entry, monkeypatch):
    monkeypatch.setattr(R, "_FULL_JSON_BYTES", 100)
    assert R.converted_damage(entry) == ""
    size = _cut(entry / "tokenizer.json", -5)
    assert (
        R.converted_damage(entry)
        == f"tokenizer.json is truncated or not JSON ({size - 5} bytes, no closing brace)"
    )


def test_a_missing_tokenizer_and_a_bad_index(entry):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (entry / f).unlink()
    assert R.converted_damage(entry) == "its tokenizer is missing"


def test_a_damaged_shard_of_a_sharded_entry(entry):
    """Entries above 2 GB are sharded: every shard the index names is checked."""
    import shutil

    shutil.move(entry / "model.safetensors", entry / "model-00001-of-00001.safetensors")
    (entry / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}})
    )
    assert R.converted_damage(entry) == ""
    size = _cut(entry / "model-00001-of-00001.safetensors", -1)
    assert R.converted_damage(entry) == (
        f"model-00001-of-00001.safetensors is truncated: its header promises {size} bytes, the file has {size - 1}"
    )


def test_the_trials_truncated_entry_is_converted_again_with_a_status_line(gguf, entry):
    """The trial: truncate model.safetensors, load the same .gguf again: it loads (the same numbers), the
    progress says why it converts, the load's note says it was done, and the entry is sound again."""
    from attnscope.core.session import Session

    first = Session.load(str(gguf), dtype="float32")
    first.prefill("the quick brown fox", chat_template=False)
    want = first.weights(0, 1)
    st = entry / "model.safetensors"
    size = _cut(st, _header_end(st) + 64)  # the header is whole, most of the data is gone
    why = f"model.safetensors is truncated: its header promises {size} bytes, the file has {_header_end(st) + 64}"
    assert [c.complete for c in R.list_converted() if c.name == entry.name] == [False]
    said = []
    s = Session.load(str(gguf), dtype="float32", progress=lambda m, f: said.append(m))
    assert f"The cached conversion of tiny.gguf is damaged ({why}): converting it again…" in said
    assert s.info.load_note == f"the cached conversion of tiny.gguf was damaged ({why}): converted again"
    assert st.stat().st_size == size and R.converted_damage(entry) == ""
    s.prefill("the quick brown fox", chat_template=False)
    np.testing.assert_array_equal(s.weights(0, 1), want)
    again = Session.load(str(gguf), dtype="float32")  # sound now: nothing more to say
    assert again.info.load_note == ""


def test_the_cli_says_the_note(gguf, entry, capsys, tmp_path):
    from attnscope.core.cli.main import main

    st = entry / "model.safetensors"
    _cut(st, -10)
    rc = main(
        ["sinks", "--model", str(gguf), "--prompt", "a b c", "--no-chat-template", "--dtype", "float32"]
        + ["--json", str(tmp_path / "sinks.json")]
    )
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err
    notes = [line for line in err.splitlines() if "cached conversion" in line]
    assert notes == [
        "attnscope: note: the cached conversion of tiny.gguf was damaged (model.safetensors is truncated: "
        f"its header promises {st.stat().st_size} bytes, the file has {st.stat().st_size - 10}): converted again"
    ]


@pytest.mark.parametrize("where", ["/proc/attn", "/proc/attn/deeper"])
def test_an_unwritable_cache_folder_is_one_line(gguf, monkeypatch, where):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", where)
    with pytest.raises(ModelLoadError) as e:
        R.convert_gguf(gguf)
    assert str(e.value) == (
        f"cannot convert tiny.gguf: the cache folder {where} (ATTNSCOPE_CACHE_DIR) cannot be created or written "
        "(No such file or directory); set ATTNSCOPE_CACHE_DIR to a folder you can write, with room for the model"
    )


def test_a_read_only_cache_folder_is_one_line(gguf, tmp_path, monkeypatch):
    import os

    if os.geteuid() == 0:
        # root writes anywhere: a read-only folder is simulated by the error the mkdir would raise
        real = R.Path.mkdir

        def refuse(self, *a, **kw):
            if "converted" in self.parts and ".partial" in self.name:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *a, **kw)

        monkeypatch.setattr(R.Path, "mkdir", refuse)
    root = tmp_path / "ro"
    (root / "converted").mkdir(parents=True)
    root.chmod(0o555)
    (root / "converted").chmod(0o555)
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(root))
    try:
        with pytest.raises(ModelLoadError) as e:
            R.convert_gguf(gguf)
    finally:
        (root / "converted").chmod(0o755)
        root.chmod(0o755)
    assert str(e.value) == (
        f"cannot convert tiny.gguf: the cache folder {root} (ATTNSCOPE_CACHE_DIR) cannot be created or written "
        "(Permission denied); set ATTNSCOPE_CACHE_DIR to a folder you can write, with room for the model"
    )


def test_a_full_disk_during_conversion_names_the_cache(gguf, cache, monkeypatch):
    import errno

    from attnscope.core.loading import gguf_convert

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf_convert, "convert", full)
    with pytest.raises(ModelLoadError) as e:
        R.convert_gguf(gguf)
    assert str(e.value) == (
        f"cannot convert tiny.gguf: the cache folder {cache} (ATTNSCOPE_CACHE_DIR) cannot be created or written "
        "(No space left on device); set ATTNSCOPE_CACHE_DIR to a folder you can write, with room for the model"
    )


def test_a_hand_edited_source_record_does_not_break_the_listing(entry):
    (entry / "attnscope_source.json").write_text("[1, 2]")
    [c] = [c for c in R.list_converted() if c.name == entry.name]
    assert c.source == "" and c.complete
