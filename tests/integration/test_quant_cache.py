"""The cache of quantised weights (core/loading/quant_cache.py).

The first ``--quantize int8|int4`` load of a folder writes its quantised state dict as safetensors
beside the GGUF conversion cache; the second load reads it back without calling torchao's
quantiser and gives the same model bit for bit (every parameter, every inner tensor of the
quantised weights, repr, runtime line, logits). A half-written entry is never read, a damaged one
is replaced, a changed checkpoint gets a new key, and an unwritable cache costs one line, not the
load.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("torchao")

from attnscope.core.backends.torch_backend import ATTN_NAME, register_attention  # noqa: E402
from attnscope.core.loading import quant_cache  # noqa: E402
from attnscope.core.loading import quantize as q  # noqa: E402
from attnscope.core.loading.quantize import is_quantised  # noqa: E402
from attnscope.core.loading.stream_load import load_quantised, safetensors_files  # noqa: E402
from tiny_models import COMMON, save_tiny, tiny_tokenizer  # noqa: E402

IDS = [1, 40, 41, 42, 7, 8, 9, 100, 101, 102]
# hidden 256, MLP 512: every projection's input is a multiple of the int4 group (128)
QCFG = dict(COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
INT4_CPU = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
MODES = [
    ("int8", "float32"),
    ("int8", "bfloat16"),
    pytest.param(
        "int4", "bfloat16", marks=pytest.mark.skipif(not INT4_CPU, reason="torch has no CPU int4 kernel")
    ),
]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(d))
    monkeypatch.delenv("ATTNSCOPE_QUANT_CACHE_DIR", raising=False)  # conftest's: here, under the cache
    register_attention()
    return d


@pytest.fixture
def folder(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    f = tmp_path / "llama-256"
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **QCFG)).eval()
    m.save_pretrained(f, max_shard_size="300KB")  # several shards
    tiny_tokenizer().save_pretrained(f)
    return f


class Quantiser:
    """Counts torchao quantisations (the streamed loader's ``quantize_one``); ``forbid`` makes one fail."""

    def __init__(self, monkeypatch, forbid: bool = False):
        self.calls = 0
        real = q.quantize_one

        def counted(*a, **k):
            self.calls += 1
            if forbid:
                raise AssertionError("the cached load called the quantiser")
            return real(*a, **k)

        monkeypatch.setattr(q, "quantize_one", counted)


def _plain(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as plain tensors; a quantised weight as its inner tensors."""
    out = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        if is_quantised(t):
            names, ctx = t.__tensor_flatten__()
            for n in names:
                out[f"{name}.{n}"] = getattr(t, n)
            out[f"{name}:type"] = type(t).__name__
            out[f"{name}:ctx"] = repr(ctx)
        else:
            out[name] = t.data
    return out


def _assert_same(a, b):
    pa, pb = _plain(a), _plain(b)
    assert sorted(pa) == sorted(pb)
    for k in pa:
        if isinstance(pa[k], str):
            assert pa[k] == pb[k], k
            continue
        assert pa[k].dtype == pb[k].dtype and pa[k].shape == pb[k].shape, k
        assert torch.equal(pa[k], pb[k]), k
    assert repr(a) == repr(b)
    with torch.inference_mode():
        la, lb = a(torch.tensor([IDS])).logits, b(torch.tensor([IDS])).logits
        l1a = a(torch.tensor([IDS]), logits_to_keep=1).logits
        l1b = b(torch.tensor([IDS]), logits_to_keep=1).logits
    assert torch.equal(la, lb) and torch.equal(l1a, l1b)


def _entries(complete=True):
    return [e for e in quant_cache.list_entries() if e.complete == complete]


@pytest.mark.parametrize("mode, dtype", MODES)
def test_second_load_comes_from_the_cache_bit_for_bit(folder, monkeypatch, mode, dtype):
    first = Quantiser(monkeypatch)
    fresh, line = load_quantised(folder, mode, dtype, "cpu", ATTN_NAME)
    assert first.calls == 14  # 2 layers x 7 linears, quantised once each
    [entry] = _entries()
    assert entry.path == quant_cache.entry_dir(folder, safetensors_files(folder), mode, dtype, "cpu")
    assert entry.name.endswith(f"-{dtype}-{mode}") and entry.source == str(folder.resolve())
    assert entry.kind == f"{mode} weights (torchao {q.library_version()})"
    Quantiser(monkeypatch, forbid=True)
    said: list[tuple[str, float]] = []
    cached, cached_line = load_quantised(
        folder, mode, dtype, "cpu", ATTN_NAME, progress=lambda m, f: said.append((m, f))
    )
    assert cached_line == line and line.endswith(", 14 linear layers")
    assert said[0] == (f"Loading llama-256 at {mode}: cached lm_head.weight", pytest.approx(1 / 21))
    assert said[-1][1] == 1.0 and len(said) == 21  # per tensor: 2 x (7 linears + 2 norms) + 3
    assert not cached.training
    _assert_same(cached, fresh)
    assert len(_entries()) == 1 and not _entries(complete=False)


def test_the_file_is_torchao_safetensors(folder):
    """No pickle: safetensors opens the file, and torchao's own unflatten rebuilds every int8
    weight from it (the layout is its flatten_tensor_state_dict's)."""
    from safetensors import safe_open
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    fresh, _ = load_quantised(folder, "int8", "bfloat16", "cpu", ATTN_NAME)
    [entry] = _entries()
    with safe_open(entry.path / quant_cache.WEIGHTS, "pt") as f:
        meta = f.metadata()
        flat = {k: f.get_tensor(k) for k in f.keys()}
    sd, leftover = unflatten_tensor_state_dict(flat, meta)
    assert not leftover
    w = fresh.model.layers[1].mlp.down_proj.weight
    got = sd["model.layers.1.mlp.down_proj.weight"]
    assert type(got) is type(w)
    for n in w.__tensor_flatten__()[0]:
        assert torch.equal(getattr(got, n), getattr(w, n))
    assert torch.equal(sd["model.embed_tokens.weight"], fresh.model.embed_tokens.weight)
    assert json.loads((entry.path / quant_cache.SOURCE).read_text())["mode"] == "int8"


@pytest.mark.skipif(not INT4_CPU, reason="torch has no CPU int4 kernel")
def test_cpu_int4_is_rebuilt_with_its_own_constructor(folder):
    """torchao 0.18's safetensors support lacks Int4OpaqueTensor: stored with our description."""
    load_quantised(folder, "int4", "bfloat16", "cpu", ATTN_NAME)
    [entry] = _entries()
    from safetensors import safe_open

    with safe_open(entry.path / quant_cache.WEIGHTS, "pt") as f:
        desc = json.loads(f.metadata()["model.layers.0.self_attn.q_proj.weight"])
        keys = set(f.keys())
    assert desc["_type"] == "Int4OpaqueTensor" and desc["_encoder"] == "attnscope"
    assert {
        "model.layers.0.self_attn.q_proj._weight_qdata",
        "model.layers.0.self_attn.q_proj._weight_scale_and_zero",
    } <= keys


def test_a_partial_entry_is_never_read(folder, monkeypatch):
    fresh, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME, cache=False)
    assert not _entries() and not _entries(complete=False)
    entry = quant_cache.entry_dir(folder, safetensors_files(folder), "int8", "float32", "cpu")
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: its partial entry is an interrupted write
    partial = entry.with_name(f"{entry.name}.partial-{os.getppid()}")  # a writer still running
    stale = entry.with_name(f"{entry.name}.partial-{gone.pid}")
    for d in (partial, stale):
        d.mkdir(parents=True)
        (d / quant_cache.WEIGHTS).write_bytes(b"\0" * 64)  # half written
        (d / quant_cache.SOURCE).write_text("{}")
    counter = Quantiser(monkeypatch)
    m, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    assert counter.calls == 14  # quantised again, the partial one ignored
    _assert_same(m, fresh)
    assert quant_cache.is_complete(entry) and not quant_cache.is_complete(partial)
    assert [e.name for e in _entries(complete=False)] == [partial.name]  # listed as incomplete
    assert not stale.exists()  # the dead writer's leftover was removed when the entry was written


def test_a_damaged_entry_is_replaced(folder, monkeypatch):
    fresh, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    [entry] = _entries()
    w = entry.path / quant_cache.WEIGHTS
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])  # truncated under its final name
    counter = Quantiser(monkeypatch)
    m, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    assert counter.calls == 14
    _assert_same(m, fresh)  # no cached tensor or repr of the damaged entry left behind
    Quantiser(monkeypatch, forbid=True)
    again, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)  # rewritten, whole
    _assert_same(again, fresh)


def test_a_changed_checkpoint_gets_a_new_key(folder, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    files = safetensors_files(folder)
    key = quant_cache.cache_key(folder, files, "int8", "float32", "cpu")
    old, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    # other keys for another dtype, mode or device type
    assert (
        len(
            {key}
            | {
                quant_cache.cache_key(folder, files, *o)
                for o in [
                    ("int8", "bfloat16", "cpu"),
                    ("int4", "float32", "cpu"),
                    ("int8", "float32", "cuda"),
                ]
            }
        )
        == 4
    )
    torch.manual_seed(1)  # new weights, same shapes (same file sizes)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **QCFG)).eval()
    m.save_pretrained(folder, max_shard_size="300KB")
    new_key = quant_cache.cache_key(folder, safetensors_files(folder), "int8", "float32", "cpu")
    assert new_key != key
    counter = Quantiser(monkeypatch)
    new, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    assert counter.calls == 14  # not the old entry
    with torch.inference_mode():
        assert not torch.equal(new(torch.tensor([IDS])).logits, old(torch.tensor([IDS])).logits)
    assert sorted(e.name.split("-")[-3] for e in _entries()) == sorted([key, new_key])
    os.utime(safetensors_files(folder)[0], ns=(1, 1))  # same bytes, another mtime: a new key too
    assert quant_cache.cache_key(folder, safetensors_files(folder), "int8", "float32", "cpu") != new_key


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2"])
def test_tied_embeddings_and_biases_from_the_cache(tmp_path, monkeypatch, family):
    folder = tmp_path / family
    save_tiny(family, folder)
    fresh, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    Quantiser(monkeypatch, forbid=True)
    cached, _ = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    _assert_same(cached, fresh)
    if json.loads((folder / "config.json").read_text()).get("tie_word_embeddings"):
        assert cached.lm_head.weight is cached.get_input_embeddings().weight


def test_an_unwritable_cache_folder_costs_one_line(folder, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(blocker / "cache"))
    notes: list[str] = []
    m, line = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME, notes=notes)
    assert line.endswith(", 14 linear layers") and is_quantised(m.model.layers[0].mlp.up_proj.weight)
    assert len(notes) == 1 and notes[0].startswith("quantised weights not cached (")
    assert notes[0].endswith("the next load quantises again") and "\n" not in notes[0]


def test_a_full_disk_costs_one_line_and_leaves_nothing(folder, cache_dir, monkeypatch):
    def enospc(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quant_cache, "write_safetensors", enospc)
    notes: list[str] = []
    load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME, notes=notes)
    assert notes == [
        "quantised weights not cached ([Errno 28] No space left on device): the next load quantises again"
    ]
    assert not any((cache_dir / quant_cache.SUBDIR).iterdir())  # no partial entry left


def test_too_little_free_space_is_not_even_tried(folder, cache_dir, monkeypatch):
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 10**9, 1000))
    notes: list[str] = []
    load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME, notes=notes)
    [note] = notes
    assert note.startswith("quantised weights not cached: ") and "needed, 1.00 kB free" in note
    assert not any((cache_dir / quant_cache.SUBDIR).iterdir())


def test_load_torch_records_the_note(folder, tmp_path, monkeypatch):
    from attnscope.core.backends.torch_load import load_torch

    _, _, info = load_torch(str(folder), dtype="float32", quantize="int8")
    assert info.load_note == ""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(blocker))
    _, _, info = load_torch(str(folder), dtype="float32", quantize="int8")
    assert info.load_note.startswith("quantised weights not cached")


def test_listed_and_cleared_with_the_conversion_cache(folder, capsys):
    from attnscope.core.cli.main import main
    from attnscope.core.loading.conversion_cache import clear_converted, list_converted
    from attnscope.core.loading.fit import human_bytes

    load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    load_quantised(folder, "int8", "bfloat16", "cpu", ATTN_NAME)
    items = list_converted()
    assert len(items) == 2 and all(c.kind.startswith("int8 weights") for c in items)
    sizes = {c.name: sum(f.stat().st_size for f in c.path.iterdir()) for c in items}
    assert {c.name: c.size_bytes for c in items} == sizes
    assert main(["models", "--list-cache"]) == 0
    out = capsys.readouterr().out
    for c in items:
        assert f"{human_bytes(c.size_bytes):>9}  {c.name}  <- {folder.resolve()}  [{c.kind}]" in out
    assert "2 cache entries: 0 converted model(s), 2 quantised weight set(s)" in out  # not "2 converted"
    assert main(["models", "--remove-cached", items[0].name]) == 0
    assert f"removed {items[0].name}: {human_bytes(items[0].size_bytes)} freed" in capsys.readouterr().out
    assert [c.name for c in list_converted()] == [items[1].name] and not items[0].path.exists()
    assert main(["models", "--remove-cached", "no-such-entry"]) == 1
    assert "no-such-entry is not in the conversion cache" in capsys.readouterr().err
    assert clear_converted() == items[1].size_bytes and list_converted() == []


def test_cancelled_while_caching_leaves_no_entry(folder, cache_dir):
    from attnscope.core.errors import Cancelled

    def progress(msg, _frac):
        if msg.startswith("Caching"):
            raise Cancelled("cancelled")

    with pytest.raises(Cancelled):
        load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME, progress=progress)
    assert not any((cache_dir / quant_cache.SUBDIR).iterdir())
    load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)  # the next load writes it
    assert len(_entries()) == 1
