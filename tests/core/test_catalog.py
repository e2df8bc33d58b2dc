"""The model catalog finds models where users keep them, describes them, and they run exactly.

Stores are built in a temporary folder as the real tools lay them out: the Hugging Face hub cache
(``models--org--name/{blobs,snapshots,refs}``, symlinks to blobs), LM Studio
(``publisher/repo/*.gguf``) and Ollama (manifest + ``blobs/sha256-<hex>``), filled with tiny random
models (:mod:`tiny_models`).
"""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
from attnscope.core.loading import catalog, describe_model
from attnscope.core.loading.fit import (
    FITS,
    NO_FIT,
    RUNTIME_BYTES,
    TIGHT,
    UNKNOWN,
    estimate,
    estimate_entry,
)
from attnscope.core.loading.free_memory import _meminfo_available
from tiny_models import (
    eager_reference,
    hf_cache_repo,
    lmstudio_file,
    ollama_model,
    save_tiny,
    tiny_model,
    write_llama_gguf,
)

IDS = list(range(5, 35))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Every store, with the reference (eager) models the entries came from."""
    root = tmp_path_factory.mktemp("stores")
    src = root / "src"
    refs = {}
    refs["llama"] = save_tiny("llama", src / "llama", seed=1)
    refs["qwen3"] = save_tiny("qwen3", src / "qwen3", seed=2)
    refs["gpt2"] = save_tiny("gpt2", src / "user-gpt2", seed=3)
    g_llama = tiny_model("llama", seed=4)
    refs["gguf"] = g_llama
    f32 = write_llama_gguf(g_llama, src / "tiny-llama-F32.gguf")
    q8 = write_llama_gguf(g_llama, src / "tiny-llama-Q8_0.gguf", qtype=gguf.GGMLQuantizationType.Q8_0)

    hf = root / "hf" / "hub"
    hf_cache_repo(hf, "tiny-org/tiny-llama", src / "llama")
    hf_cache_repo(hf, "tiny-org/tiny-qwen3", src / "qwen3")
    gg = src / "ggufrepo"
    gg.mkdir()
    shutil.copyfile(f32, gg / f32.name)
    hf_cache_repo(hf, "tiny-org/tiny-llama-GGUF", gg)

    lms = root / "lmstudio"
    lmstudio_file(lms, "tiny-pub", "tiny-llama-GGUF", q8)
    (lms / "tiny-pub" / "tiny-llama-GGUF" / "mmproj-tiny-F16.gguf").write_bytes(
        b"GGUF"
    )  # vision projector: skipped

    oll = root / "ollama"
    blob = ollama_model(oll, "tiny", "latest", f32)
    ollama_model(oll, "tiny", "q8", q8, namespace="someone")

    return dict(
        root=root, hf=hf, lms=lms, oll=oll, blob=blob, user=src / "user-gpt2", refs=refs, f32=f32, q8=q8
    )


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))


def _scan(stores, **kw):
    args = dict(
        hf_cache=stores["hf"],
        lmstudio=[stores["lms"]],
        ollama=stores["oll"],
        user=[stores["user"]],
        include_embedded=False,
    )
    args.update(kw)
    return {e.name: e for e in catalog.scan(**args)}


def test_every_store_is_found(stores):
    found = _scan(stores)
    assert {n: e.source for n, e in found.items()} == {
        "tiny-org/tiny-llama": "hf-cache",
        "tiny-org/tiny-llama-GGUF/tiny-llama-F32": "hf-cache",
        "tiny-org/tiny-qwen3": "hf-cache",
        "tiny-pub/tiny-llama-GGUF/tiny-llama-Q8_0": "lmstudio",
        "tiny:latest": "ollama",
        "someone/tiny:q8": "ollama",
        "user-gpt2": "user",
    }
    assert all(e.supported for e in found.values()), [e.reason for e in found.values()]


def test_entries_are_described_correctly(stores):
    found = _scan(stores)
    refs = stores["refs"]
    q3 = found["tiny-org/tiny-qwen3"]
    assert (
        q3.architecture,
        q3.n_layers,
        q3.n_heads,
        q3.n_kv_heads,
        q3.group_size,
        q3.head_dim,
        q3.max_context,
    ) == ("qwen3", 2, 4, 2, 2, 32, 256)
    assert q3.n_params == sum(p.numel() for p in refs["qwen3"].parameters())
    assert q3.dtype == "float32" and q3.format == "hf"
    # size on disk: the blobs the snapshot links to
    assert q3.size_bytes == sum(f.stat().st_size for f in (stores["root"] / "src" / "qwen3").iterdir())
    g2 = found["user-gpt2"]
    assert (g2.architecture, g2.n_layers, g2.n_heads, g2.n_kv_heads, g2.group_size, g2.head_dim) == (
        "gpt2",
        3,
        4,
        4,
        1,
        16,
    )
    n_llama = sum(p.numel() for p in refs["gguf"].parameters())
    for name, quant, path in (
        ("tiny:latest", "F32", stores["blob"]),
        ("tiny-pub/tiny-llama-GGUF/tiny-llama-Q8_0", "Q8_0", None),
        ("tiny-org/tiny-llama-GGUF/tiny-llama-F32", "F32", None),
    ):
        e = found[name]
        assert (e.format, e.architecture, e.n_layers, e.n_heads, e.n_kv_heads, e.head_dim, e.max_context) == (
            "gguf",
            "llama",
            2,
            4,
            2,
            16,
            256,
        ), name
        assert e.n_params == n_llama and e.dtype == quant
        assert e.size_bytes == e.path.stat().st_size
        if path is not None:
            assert e.path == path and e.model_ref == str(path)


def _run_ours(ref_str):
    from attnscope.core.session import Session

    s = Session.load(ref_str)
    return s, s.backend.forward(IDS, all_logits=True)


@pytest.mark.parametrize(
    "name", ["tiny-org/tiny-llama", "tiny-org/tiny-llama-GGUF/tiny-llama-F32", "tiny:latest"]
)
def test_found_models_run_exactly_against_eager(stores, name):
    """Float weights (a folder, or an F32 GGUF converted back): our weights equal eager's on the original."""
    e = _scan(stores)[name]
    ref = stores["refs"]["llama" if e.format == "hf" else "gguf"]
    s, logits = _run_ours(e.model_ref)
    ref_logits, ref_att = eager_reference(ref, IDS)
    assert np.abs(logits - ref_logits).max() < 1e-4
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(s.trace.weights(layer, head), ref_att[layer][head], atol=1e-5)


def test_quantised_gguf_runs_exactly_against_eager_on_its_dequantised_weights(stores):
    """A Q8_0 file: exact against eager on the same (dequantised) weights, close to the float original."""
    from attnscope.core.loading.conversion_cache import converted_dir
    from transformers import AutoModelForCausalLM

    e = _scan(stores)["tiny-pub/tiny-llama-GGUF/tiny-llama-Q8_0"]
    s, logits = _run_ours(e.model_ref)
    ref = AutoModelForCausalLM.from_pretrained(converted_dir(e.path), attn_implementation="eager").eval()
    ref_logits, ref_att = eager_reference(ref, IDS)
    assert np.abs(logits - ref_logits).max() < 1e-4
    np.testing.assert_allclose(s.trace.weights(1, 3), ref_att[1][3], atol=1e-5)
    orig_logits, _ = eager_reference(stores["refs"]["gguf"], IDS)
    assert 0 < np.abs(logits - orig_logits).max() < 0.05  # Q8_0 rounding: different, but close


def test_hf_cache_root_follows_the_environment(stores, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(stores["hf"].parent))
    assert catalog.hf_hub_cache_dir() == stores["hf"]
    assert {e.name for e in catalog.scan_hf_cache()} >= {"tiny-org/tiny-llama", "tiny-org/tiny-qwen3"}
    monkeypatch.setenv("HF_HUB_CACHE", str(stores["root"] / "elsewhere"))
    assert catalog.hf_hub_cache_dir() == stores["root"] / "elsewhere"
    assert catalog.scan_hf_cache() == []


def test_lmstudio_and_ollama_roots_follow_the_environment(stores, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_LMSTUDIO_MODELS", str(stores["lms"]))
    monkeypatch.setenv("OLLAMA_MODELS", str(stores["oll"]))
    assert [e.name for e in catalog.scan_lmstudio()] == ["tiny-pub/tiny-llama-GGUF/tiny-llama-Q8_0"]
    assert sorted(e.name for e in catalog.scan_ollama()) == ["someone/tiny:q8", "tiny:latest"]


def test_ollama_missing_blob_and_bad_manifest_are_listed_with_reason(tmp_path):
    m = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "gone" / "latest"
    m.parent.mkdir(parents=True)
    m.write_text(
        json.dumps(
            {"layers": [{"mediaType": catalog.OLLAMA_MODEL_MEDIA_TYPE, "digest": "sha256:" + "ab" * 32}]}
        )
    )
    bad = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "bad" / "1b"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    found = {e.name: e for e in catalog.scan_ollama(tmp_path)}
    assert not found["gone:latest"].supported and "is missing" in found["gone:latest"].reason
    assert not found["bad:1b"].supported and "unreadable" in found["bad:1b"].reason


def test_user_paths_are_remembered(stores, tmp_path):
    assert catalog.user_paths() == []
    p = catalog.add_user_path(stores["user"])
    catalog.add_user_path(stores["q8"])
    catalog.add_user_path(stores["user"])  # twice: kept once
    saved = json.loads((tmp_path / "config" / "models.json").read_text())
    assert saved["paths"] == [str(stores["user"]), str(stores["q8"])]
    assert catalog.user_paths() == [p, stores["q8"]]
    names = [
        e.name
        for e in catalog.scan(
            hf_cache=tmp_path / "none", lmstudio=[], ollama=tmp_path / "none", include_embedded=False
        )
    ]
    assert names == ["user-gpt2", "tiny-llama-Q8_0.gguf"]
    assert catalog.remove_user_path(stores["user"]) is True
    assert catalog.remove_user_path(stores["user"]) is False
    assert catalog.user_paths() == [stores["q8"]]
    with pytest.raises(FileNotFoundError):
        catalog.add_user_path(tmp_path / "nothing")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="not a GGUF"):
        catalog.add_user_path(tmp_path / "notes.txt")


def test_user_library_folder_is_scanned_two_levels(stores, tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(stores["user"], lib / "gpt2-tiny")
    (lib / "pub" / "repo").mkdir(parents=True)
    shutil.copyfile(stores["q8"], lib / "pub" / "repo" / "m-Q8_0.gguf")
    shutil.copyfile(
        stores["f32"], lib / "pub" / "repo" / "m-00002-of-00003.gguf"
    )  # a later split part: skipped
    names = sorted(e.name for e in describe_model.describe_path(lib))
    assert names == ["gpt2-tiny", "pub/repo/m-Q8_0"]


def test_same_file_in_two_stores_is_listed_once(stores):
    found = catalog.scan(
        hf_cache=stores["hf"],
        lmstudio=[stores["lms"]],
        ollama=stores["oll"],
        user=[stores["blob"], stores["lms"] / "tiny-pub" / "tiny-llama-GGUF" / stores["q8"].name],
        include_embedded=False,
    )
    paths = [e.path.resolve() for e in found]
    assert len(paths) == len(set(paths)) == 6  # 3 in the HF cache, 1 in LM Studio, 2 in Ollama


def test_embedded_default_is_listed_first():
    entries = catalog.scan(hf_cache="/nonexistent", lmstudio=[], ollama="/nonexistent", user=[])
    e = entries[0]
    assert (
        e.source,
        e.model_ref,
        e.architecture,
        e.n_layers,
        e.n_heads,
        e.n_kv_heads,
        e.head_dim,
        e.max_context,
        e.dtype,
    ) == ("embedded", "default", "llama", 30, 9, 3, 64, 8192, "Q4_1")
    assert e.n_params == 134_515_008 and e.supported


def test_embedded_falls_back_to_the_packaged_conversion(stores, monkeypatch):
    import attnscope.core.loading.catalog as cat
    from attnscope.core.errors import ModelLoadError

    def missing():
        raise ModelLoadError("not installed")

    monkeypatch.setattr(cat, "default_gguf_path", missing)
    monkeypatch.delenv("ATTNSCOPE_DEFAULT_MODEL", raising=False)
    assert cat.scan_embedded() == []
    monkeypatch.setenv("ATTNSCOPE_DEFAULT_MODEL", str(stores["root"] / "src" / "llama"))
    (e,) = cat.scan_embedded()
    assert (e.source, e.model_ref, e.format, e.architecture, e.n_layers) == (
        "embedded",
        "default",
        "hf",
        "llama",
        2,
    )


# -- fit ---------------------------------------------------------------------------------------------
def test_fit_components_by_hand():
    # SmolLM2-135M at 8192 tokens, float32: weights 134.5M × 4; KV 2·30·3·64·8192·4; capture 30·9·8192·(64·4 + 8)
    f = estimate(
        n_params=134_515_008,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        context=8192,
        free_bytes=16 * 10**9,
    )
    assert f.weights_bytes == 538_060_032
    assert f.kv_cache_bytes == 377_487_360
    assert f.capture_bytes == 583_925_760
    assert f.runtime_bytes == RUNTIME_BYTES["torch"]
    assert f.total_bytes == 538_060_032 + 377_487_360 + 583_925_760 + RUNTIME_BYTES["torch"]
    assert f.verdict == FITS
    bf = estimate(
        n_params=1000,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        context=10,
        dtype="bfloat16",
        free_bytes=10**9,
    )
    assert (bf.weights_bytes, bf.kv_cache_bytes, bf.capture_bytes) == (
        2000,
        2 * 2 * 2 * 8 * 10 * 2,
        2 * 4 * 10 * (8 * 2 + 8),
    )
    gg = estimate(
        n_params=1000,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        context=10,
        fmt="gguf",
        dtype="bfloat16",
        free_bytes=10**9,
    )
    assert (
        gg.weights_bytes == 2000
    )  # a GGUF is converted straight to the load dtype (attnscope.core.loading.gguf_convert)


@pytest.mark.parametrize(
    ("free", "verdict"), [(None, UNKNOWN), (1250, FITS), (1249, TIGHT), (1000, TIGHT), (999, NO_FIT)]
)
def test_fit_verdict_thresholds(free, verdict, monkeypatch):
    import attnscope.core.loading.fit as fit

    monkeypatch.setattr(fit, "free_memory", lambda *a: (None, "RAM"))
    # total = 1000 bytes: weights 250 × 4, no context
    f = estimate(
        n_params=250,
        n_layers=1,
        n_heads=1,
        n_kv_heads=1,
        head_dim=1,
        context=0,
        free_bytes=free,
        runtime=False,
    )
    assert f.total_bytes == 1000 and f.verdict == verdict


def test_fit_caps_context_at_the_model_max(stores):
    e = _scan(stores)["tiny-org/tiny-qwen3"]
    f = estimate_entry(e, 100_000, free_bytes=10**9)
    assert f.context == 256 and f.kv_cache_bytes == 2 * 2 * 2 * 32 * 256 * 4


def test_free_memory_from_meminfo(tmp_path):
    m = tmp_path / "meminfo"
    m.write_text("MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   20000000 kB\n")
    assert _meminfo_available(str(m)) == 20_000_000 * 1024
    assert _meminfo_available(str(tmp_path / "none")) is None


def test_free_memory_real_machine():
    from attnscope.core.loading.fit import free_memory

    free, label = free_memory("torch", "cpu")
    assert label == "RAM" and free is not None and 10**8 < free < 10**13
    free, label = free_memory("mlx", "cpu")
    assert label == "unified memory"


# -- the CLI -----------------------------------------------------------------------------------------
def _cli(argv, capsys):
    from attnscope.core.cli.main import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_lists_and_writes_json(stores, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(stores["hf"]))
    monkeypatch.setenv("ATTNSCOPE_LMSTUDIO_MODELS", str(stores["lms"]))
    monkeypatch.setenv("OLLAMA_MODELS", str(stores["oll"]))
    out_json = tmp_path / "models.json"
    rc, out, _ = _cli(["models", "--context", "128", "--json", str(out_json)], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["name", "source", "arch", "params"]
    row = next(line for line in lines if line.startswith("tiny-org/tiny-qwen3"))
    assert row.split()[1:9] == [
        "hf-cache",
        "qwen3",
        f"{sum(p.numel() for p in stores['refs']['qwen3'].parameters()) / 1e3:.1f}K",
        "2",
        "GQA",  # the attention kind: "GQA 4/2"
        "4/2",
        "32",
        "256",
    ]
    doc = json.loads(out_json.read_text())
    names = [m["name"] for m in doc["models"]]
    assert names[0] == "SmolLM2-135M-Instruct (embedded)" and "tiny:latest" in names
    q3 = next(m for m in doc["models"] if m["name"] == "tiny-org/tiny-qwen3")
    assert q3["fit"]["kv_cache_bytes"] == 2 * 2 * 2 * 32 * 128 * 4 and q3["group_size"] == 2


def test_cli_add_remove_and_cache(stores, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    monkeypatch.setenv("ATTNSCOPE_LMSTUDIO_MODELS", "")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    rc, out, _ = _cli(["models", "--add", str(stores["q8"])], capsys)
    assert rc == 0 and f"added {stores['q8']}" in out and "tiny-llama-Q8_0.gguf" in out
    rc, out, err = _cli(["models", "--remove", str(tmp_path / "never-added")], capsys)
    assert rc == 1 and "is not a user-added path" in err
    rc, out, _ = _cli(["models", "--remove", str(stores["q8"])], capsys)
    assert rc == 0 and out.startswith("removed") and "tiny-llama-Q8_0.gguf" not in out.split("\n", 1)[1]
    # conversion cache: empty, then one model after a load, then cleared
    rc, out, _ = _cli(["models", "--list-cache"], capsys)
    assert "0 converted model(s)" in out
    from attnscope.core.loading.conversion_cache import converted_dir, list_converted
    from attnscope.core.loading.resolve import resolve

    resolve(str(stores["q8"]))
    assert [c.name for c in list_converted()] == [converted_dir(stores["q8"]).name]
    rc, out, _ = _cli(["models", "--list-cache"], capsys)
    assert "1 converted model(s)" in out and converted_dir(stores["q8"]).name in out
    rc, out, _ = _cli(["models", "--clear-cache"], capsys)
    assert rc == 0 and "freed" in out and list_converted() == []
    rc, _, err = _cli(["models", "--context", "0"], capsys)
    assert rc == 1 and "--context must be >= 1" in err
