"""The catalog lists what is there, names it, and counts it once.

* A Hugging Face cache snapshot is named ``org/name`` everywhere (catalog, the loaded model's name,
  sidecars, session files); its revision is recorded apart (``model.revision``).
* One incomplete file (an unfinished ``.incomplete`` blob, a dangling link) never hides a repo: every
  complete model is listed and the entry says what is incomplete.
* The cache root is huggingface_hub's own (checked against a fresh ``huggingface_hub.constants``
  import in a child process, for each way of setting it).
* Parameters and sizes come from the files the loader reads: an mlx-lm quantised folder at its
  logical size, a second copy of the weights (``original/``, ``consolidated.safetensors``) not counted.
* The list and the loader agree: ``supported`` is exactly "``Session.load`` succeeds", over many
  kinds of broken folder.

Stores are built as the tools lay them out; models are tiny random ones (:mod:`tiny_models`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from attnscope.core.errors import ModelLoadError, UnsupportedModelError
from attnscope.core.loading import catalog, describe_model
from attnscope.core.loading.fit import estimate_entry
from attnscope.core.loading.resolve import hf_cache_snapshot, model_name, resolve
from tiny_models import save_tiny, tiny_model, write_llama_gguf

REV = "5eed0001c0ffee5eed0001c0ffee5eed0001c0ff"
GROUP = 64


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A sound tiny llama folder and its parameter count (every parameter, lm_head untied)."""
    folder = tmp_path_factory.mktemp("src") / "llama"
    model = save_tiny("llama", folder, seed=1)
    return folder, sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_llama_gguf(tiny_model("llama", seed=4), tmp_path_factory.mktemp("g") / "tiny-F32.gguf")


def _blob_repo(cache: Path, repo_id: str, files: dict[str, Path | None], rev: str = REV) -> Path:
    """A hub-cache repo as huggingface_hub writes it: ``blobs/<sha256>`` once per file, the snapshot
    linking to it (relative links, subfolders kept); a None source is a link to a blob that is missing."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    for rel, src in files.items():
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(src.read_bytes() if src else rel.encode()).hexdigest()
        if src is not None and not (repo / "blobs" / digest).exists():
            shutil.copyfile(src, repo / "blobs" / digest)
        up = Path(*[".."] * (len(Path(rel).parts) + 1))
        link.symlink_to(up / "blobs" / digest)
    return snap


def _folder_files(folder: Path) -> dict[str, Path | None]:
    return {str(f.relative_to(folder)): f for f in sorted(folder.rglob("*")) if f.is_file()}


# -- names -------------------------------------------------------------------------------------------
def test_snapshot_named_org_name_with_revision_apart(tmp_path, llama):
    """The sample: a model in the hub cache loads as ``org/name``, never its snapshot hash; the
    sidecar keeps the revision as ``model.revision`` and the session file the name."""
    from attnscope.core.io.provenance import session_metadata
    from attnscope.core.io.sessionfile import SessionFile
    from attnscope.core.session import Session

    snap = _blob_repo(tmp_path / "hub", "tiny-org/tiny-llama", _folder_files(llama[0]))
    assert hf_cache_snapshot(snap) == ("tiny-org/tiny-llama", REV)
    assert resolve(str(snap))[1] == "tiny-org/tiny-llama"
    s = Session.load(str(snap))
    assert s.info.name == "tiny-org/tiny-llama" and REV in s.info.source
    s.prefill("hi there", chat_template=False)
    meta = session_metadata(s)
    assert (meta["model"]["name"], meta["model"]["revision"]) == ("tiny-org/tiny-llama", REV)
    assert SessionFile.from_session(s).model_name == "tiny-org/tiny-llama"
    [e] = catalog.scan_hf_cache(tmp_path / "hub")
    assert e.name == "tiny-org/tiny-llama"


def test_names_beyond_the_sample(tmp_path, llama):
    """Repo ids with dots, dashes and underscores; a snapshot added by hand (a user path) is named the
    same; a GGUF inside a snapshot keeps its file name; folders elsewhere keep their own name."""
    for repo_id in ("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B", "a_b/c.d-e_f"):
        snap = _blob_repo(tmp_path / "hub", repo_id, _folder_files(llama[0]))
        assert model_name(snap) == repo_id and resolve(str(snap))[1] == repo_id
        [e] = describe_model.describe_path(snap)
        assert e.name == repo_id and e.supported
    sub = tmp_path / "hub" / "models--org--multi" / "snapshots" / REV / "base"
    shutil.copytree(llama[0], sub)
    assert model_name(sub) == "org/multi/base" and resolve(str(sub))[1] == "org/multi/base"
    g = tmp_path / "hub" / "models--x--y" / "snapshots" / REV / "sub" / "m-Q8_0.gguf"
    assert hf_cache_snapshot(g) == ("x/y", REV)
    assert model_name(llama[0]) == "llama" and hf_cache_snapshot(llama[0]) is None
    from attnscope.core.io.provenance import model_revision

    assert model_revision(str(llama[0])) is None and model_revision(None) is None


# -- incomplete files ---------------------------------------------------------------------------------
def test_partial_download_beside_a_complete_quantisation(tmp_path, gguf_file):
    """The sample: a GGUF repo with one complete file and another still downloading
    (``blobs/<etag>.incomplete``, not linked yet) lists the complete one and says what is unfinished."""
    hub = tmp_path / "hub"
    snap = _blob_repo(hub, "org/tiny-GGUF", {"tiny-F32.gguf": gguf_file})
    (snap.parent.parent / "blobs" / "0a1b2c3d.incomplete").write_bytes(b"\0" * 3_000_000)
    [e] = catalog.scan_hf_cache(hub)
    assert (e.name, e.format, e.supported) == ("org/tiny-GGUF/tiny-F32", "gguf", True)
    assert e.note.startswith("1 download in this cache repo not finished (3.00 MB so far")


def test_dangling_links_and_several_ggufs(tmp_path, llama, gguf_file):
    """Beyond the sample: a dangling README beside a complete folder; one GGUF of several whose blob
    is missing; a folder whose shard is missing; a repo with nothing complete yet. Each complete model
    is listed (supported), each incomplete one listed unsupported saying so, nothing disappears."""
    hub = tmp_path / "hub"
    _blob_repo(hub, "org/folder-readme", {**_folder_files(llama[0]), "README.md": None})
    _blob_repo(hub, "org/many-GGUF", {"a-F32.gguf": gguf_file, "b-Q8_0.gguf": None, "c-F32.gguf": gguf_file})
    files = _folder_files(llama[0])
    files["model.safetensors"] = None
    _blob_repo(hub, "org/folder-cut", files)
    only = hub / "models--org--only-partial" / "blobs"
    only.mkdir(parents=True)
    (only / "ffff.incomplete").write_bytes(b"\0" * 10)
    got = {e.name: e for e in catalog.scan_hf_cache(hub)}
    assert sorted(got) == [
        "org/folder-cut",
        "org/folder-readme",
        "org/many-GGUF/a-F32",
        "org/many-GGUF/b-Q8_0",
        "org/many-GGUF/c-F32",
        "org/only-partial",
    ]
    readme = got["org/folder-readme"]
    assert readme.supported and readme.note == "incomplete in the cache (blob missing): README.md"
    assert got["org/many-GGUF/a-F32"].supported and got["org/many-GGUF/c-F32"].supported
    b = got["org/many-GGUF/b-Q8_0"]
    assert not b.supported and b.reason.startswith("b-Q8_0.gguf is incomplete: its blob is missing")
    cut = got["org/folder-cut"]
    assert not cut.supported
    assert "is incomplete: shard model.safetensors is a dangling link" in cut.reason
    with pytest.raises(ModelLoadError) as err:
        resolve(str(cut.path))
    assert str(err.value) == cut.reason  # the same words at load time
    assert not got["org/only-partial"].supported
    assert got["org/only-partial"].reason.startswith(
        "org/only-partial: nothing complete to open yet (1 download"
    )


# -- the cache location --------------------------------------------------------------------------------
_HF_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HUGGINGFACE_CO_STAGING")


def _hub_says(env: dict) -> str:
    """``huggingface_hub.constants.HF_HUB_CACHE`` as a fresh import in a child process computes it."""
    code = "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(
    "setting",
    [
        {"HF_HOME": "~/hf home"},  # the sample
        {"HF_HOME": "$MYROOT/home"},
        {"HF_HUB_CACHE": "~/direct hub"},
        {"HF_HUB_CACHE": "${MYROOT}/hub"},
        {"HUGGINGFACE_HUB_CACHE": "~/legacy"},  # the legacy name
        {"HF_HOME": "~/ignored", "HF_HUB_CACHE": "$MYROOT/wins"},
        {"HUGGINGFACE_HUB_CACHE": "~/legacy", "HF_HUB_CACHE": "~/new"},
        {"XDG_CACHE_HOME": "$MYROOT/xdg"},
        {},
    ],
)
def test_cache_root_is_huggingface_hubs_own(tmp_path, monkeypatch, setting, llama):
    home = tmp_path / "home dir"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MYROOT", str(tmp_path / "my root"))
    for k in _HF_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in setting.items():
        monkeypatch.setenv(k, v)
    want = Path(_hub_says(dict(os.environ)))
    assert catalog.hf_hub_cache_dir() == want
    assert "~" not in str(want) and "$" not in str(want)
    _blob_repo(want, "tiny-org/tiny-llama", _folder_files(llama[0]))
    assert [
        e.name for e in catalog.scan(include_embedded=False, lmstudio=[], ollama=tmp_path / "o", user=[])
    ] == ["tiny-org/tiny-llama"]


def test_cache_root_follows_the_environment_when_it_changes(tmp_path, monkeypatch):
    """huggingface_hub reads its environment once, at import; the catalog reads it at each call."""
    import huggingface_hub.constants as hub_constants

    before = hub_constants.HF_HUB_CACHE
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "one"))
    assert catalog.hf_hub_cache_dir() == tmp_path / "one" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "two"))
    assert catalog.hf_hub_cache_dir() == tmp_path / "two" / "hub"
    assert hub_constants.HF_HUB_CACHE == before  # huggingface_hub's own module is left as it was


# -- counting what the loader reads ------------------------------------------------------------------------
def _mlx_quantised(
    src: Path, out: Path, bits: int, per_layer: dict[str, int] | None = None
) -> tuple[Path, int]:
    """An mlx-lm quantised folder (``nn.quantize`` layout): each linear and the embedding whose input
    size the group divides as packed ``uint32`` words + float16 ``scales``/``biases``, norms as they
    are, ``"quantization": {"group_size", "bits"}`` (and per-layer entries) in config.json. Returns
    the folder and its packed weight bytes at float16 (words + scales/biases/norms at 2 bytes)."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    state = load_file(str(src / "model.safetensors"))
    per_layer = per_layer or {}
    tensors: dict[str, np.ndarray] = {}
    packed_bytes = 0
    for k, w in state.items():
        layer = k.removesuffix(".weight")
        if w.ndim == 2 and w.shape[1] % GROUP == 0:
            b = per_layer.get(layer, bits)
            rows, cols = w.shape
            tensors[k] = np.zeros((rows, cols * b // 32), np.uint32)
            tensors[f"{layer}.scales"] = np.ones((rows, cols // GROUP), np.float16)
            tensors[f"{layer}.biases"] = np.zeros((rows, cols // GROUP), np.float16)
            packed_bytes += rows * cols * b // 8 + 2 * 2 * rows * cols // GROUP
        else:
            tensors[k] = w.astype(np.float16)
            packed_bytes += 2 * w.size
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "mlx"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization"] = {"group_size": GROUP, "bits": bits}
    for layer, b in per_layer.items():
        cfg["quantization"][layer] = {"group_size": GROUP, "bits": b}
    cfg["dtype"] = "float16"  # the scales' dtype (transformers 5 writes "dtype")
    (out / "config.json").write_text(json.dumps(cfg))
    for f in src.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return out, packed_bytes


def test_mlx_8bit_folder_counts_logical_parameters(tmp_path, llama):
    """The sample: an 8-bit mlx-lm folder has the float model's parameter count (not its packed
    words: 4x fewer at 8 bits), is quantised, and is supported on MLX while torch refuses it with
    the loader's own words."""
    from attnscope.core.session import Session

    folder, packed = _mlx_quantised(llama[0], tmp_path / "mlx8", 8)
    [e] = describe_model.describe_path(folder)
    assert e.n_params == llama[1]
    assert (e.quantised, e.dtype, e.checkpoint_dtype) == (True, "MLX 8-bit (group 64)", "float16")
    assert e.supported and e.reason == ""
    assert e.problem_on("mlx") is None
    with pytest.raises(UnsupportedModelError) as err:
        Session.load(str(folder))  # torch
    assert e.problem_on("torch") == str(err.value) and "MLX-quantised weights (8-bit)" in str(err.value)
    # on MLX the weights stay packed: the fit counts the words and the float16 scales, not n_params x 2
    fit = estimate_entry(e, 64, backend="mlx", device="gpu", dtype="float16", free_bytes=1 << 40)
    assert fit.weights_bytes == packed < 2 * e.n_params


def test_mlx_folder_beyond_the_sample(tmp_path, llama):
    """4-bit with one layer at 8 bits (mlx-lm's mixed layout): still the logical count; the picker
    points torch users at MLX; a family MLX does not run is unsupported (no backend opens it)."""
    pytest.importorskip("PySide6")
    from attnscope.app.model_table import backend_refusal
    from attnscope.core.backend_registry import problem as backend_problem
    from attnscope.core.loading.checks import SUPPORTED_ARCHITECTURES

    folder, _ = _mlx_quantised(llama[0], tmp_path / "mlx4", 4, {"model.layers.0.mlp.down_proj": 8})
    [e] = describe_model.describe_path(folder)
    assert e.n_params == llama[1] and e.quantised and e.dtype == "MLX 4-bit (group 64)"
    assert "Choose MLX under Backend above" in backend_refusal(e, "torch")
    assert backend_refusal(e, "mlx") is None
    others = sorted(f for f in SUPPORTED_ARCHITECTURES if backend_problem(f, "mlx"))
    if not others:
        pytest.skip("MLX runs every family")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = others[0]
    (folder / "config.json").write_text(json.dumps(cfg))
    [e] = describe_model.describe_path(folder)
    assert not e.supported and "MLX-quantised" in e.reason


def test_original_copy_is_not_counted(tmp_path, llama):
    """The sample: a sharded folder with Meta's ``original/`` copy (consolidated .pth) counts its
    parameters and size once, from the index's shards, in a user folder and in the hub cache alike;
    the fit is not doubled and the note names the copy."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(llama[0])
    folder = tmp_path / "sharded"
    m.save_pretrained(folder, max_shard_size="60KB")
    for f in llama[0].glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    top = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    (folder / "original").mkdir()
    torch.save(m.state_dict(), folder / "original" / "consolidated.00.pth")
    (folder / "original" / "params.json").write_text("{}")
    snap = _blob_repo(tmp_path / "hub", "meta/tiny", _folder_files(folder))
    for e in (describe_model.describe_path(folder)[0], catalog.scan_hf_cache(tmp_path / "hub")[0]):
        assert e.supported and e.n_params == llama[1]
        assert e.size_bytes == top
        assert e.note == "not read, so not counted: original/ (another copy of the weights)"
        fit = estimate_entry(e, 64, dtype="float32", free_bytes=1 << 40)
        assert fit.weights_bytes == 4 * llama[1]
    assert e.path == snap


def test_consolidated_copy_beside_shards_is_not_counted(tmp_path, llama):
    """Mistral's layout: ``consolidated.safetensors`` (the same weights under Mistral's names) beside
    ``model.safetensors``: counted once; alone, it is no folder transformers loads, and the list says
    so with the loader."""
    from attnscope.core.session import Session
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "mistral"
    shutil.copytree(llama[0], folder)
    state = load_file(str(folder / "model.safetensors"))
    save_file({f"consolidated.{k}": v for k, v in state.items()}, str(folder / "consolidated.safetensors"))
    [e] = describe_model.describe_path(folder)
    assert e.supported and e.n_params == llama[1]
    assert (
        e.size_bytes
        == sum(f.stat().st_size for f in folder.iterdir())
        - (folder / "consolidated.safetensors").stat().st_size
    )
    assert "consolidated.safetensors" in e.note
    (folder / "model.safetensors").unlink()
    [e] = describe_model.describe_path(folder)
    assert (
        not e.supported and "it holds consolidated.safetensors, which transformers does not read" in e.reason
    )
    with pytest.raises(ModelLoadError) as err:
        Session.load(str(folder))
    assert str(err.value) == e.reason


# -- the list and the loader agree ------------------------------------------------------------------------
def _rewrite_header(path: Path, edit) -> None:
    """Rewrite a safetensors file's JSON header through ``edit(header) -> header`` (data kept)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = edit(json.loads(raw[8 : 8 + n]))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def _first(header: dict) -> str:
    return sorted(k for k in header if k != "__metadata__")[0]


def _metadata_int(f):  # the sample: a non-string value in __metadata__
    _rewrite_header(f / "model.safetensors", lambda h: {**h, "__metadata__": {"format": "pt", "step": 1000}})


def _metadata_null(f):
    _rewrite_header(f / "model.safetensors", lambda h: {**h, "__metadata__": None})


def _metadata_nested(f):
    _rewrite_header(
        f / "model.safetensors", lambda h: {**h, "__metadata__": {"format": "pt", "a": {"b": "c"}}}
    )


def _extra_bytes(f):
    with open(f / "model.safetensors", "ab") as fh:
        fh.write(b"\0" * 16)


def _unknown_dtype(f):
    def edit(h):
        h[_first(h)]["dtype"] = "Q4"
        return h

    _rewrite_header(f / "model.safetensors", edit)


def _shape_mismatch(f):
    def edit(h):
        k = _first(h)
        h[k]["shape"] = [*h[k]["shape"][:-1], h[k]["shape"][-1] + 1]
        return h

    _rewrite_header(f / "model.safetensors", edit)


def _overlap(f):  # the second tensor starts inside the first
    def edit(h):
        names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        (b0, _), (b1, e1) = h[names[0]]["data_offsets"], h[names[1]]["data_offsets"]
        h[names[1]]["data_offsets"] = [b0 + 4, b0 + 4 + e1 - b1]
        return h

    _rewrite_header(f / "model.safetensors", edit)


def _stale_index(f):  # transformers reads model.safetensors first: the index is never opened
    (f / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))


def _only_index(f):
    (f / "model.safetensors").rename(f / "model-00001-of-00001.safetensors")
    (f / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00001.safetensors"}})  # no "metadata"
    )


def _sound_index(f):
    (f / "model.safetensors").rename(f / "model-00001-of-00001.safetensors")
    (f / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"a": "model-00001-of-00001.safetensors"}})
    )


def _dangling_weights(f):
    (f / "model.safetensors").unlink()
    (f / "model.safetensors").symlink_to(f / "no-such-blob")


def _no_tokenizer(f):
    for t in f.glob("tokenizer*"):
        t.unlink()


def _truncated(f):
    st = f / "model.safetensors"
    with open(st, "r+b") as fh:
        fh.truncate(st.stat().st_size - 8)


def _sound(f):
    pass


KINDS = [
    _sound,
    _metadata_int,
    _metadata_null,
    _metadata_nested,
    _extra_bytes,
    _unknown_dtype,
    _shape_mismatch,
    _overlap,
    _stale_index,
    _only_index,
    _sound_index,
    _dangling_weights,
    _no_tokenizer,
    _truncated,
]


#: the kinds transformers loads all the same (a null __metadata__ is none; an index beside
#: model.safetensors is never read, transformers takes model.safetensors first)
LOADS = {_sound, _metadata_null, _stale_index, _sound_index}


@pytest.mark.parametrize("damage", KINDS, ids=[k.__name__.strip("_") for k in KINDS])
def test_supported_exactly_when_it_loads(tmp_path, llama, damage):
    """``supported`` equals "``Session.load`` succeeds", and a refusal says the same line in both."""
    from attnscope.core.session import Session

    folder = tmp_path / "m"
    shutil.copytree(llama[0], folder)
    damage(folder)
    [e] = describe_model.describe_path(folder)
    try:
        s = Session.load(str(folder))
    except ModelLoadError as err:
        loaded, why = False, str(err)
    else:
        loaded, why = True, ""
        assert s.info.n_params == e.n_params  # the count the list showed is the one that loaded
    assert e.supported == loaded, (e.reason, why)
    assert e.reason == why
    assert loaded == (damage in LOADS)  # each kind does what it is meant to: the test cannot pass idly
    if damage is _metadata_int:  # the sample: refused by both, in the safetensors library's words
        assert why.startswith("model.safetensors has an invalid safetensors header (invalid JSON in header: ")
        assert "expected a string" in why


def test_cli_models_says_what_is_incomplete_and_which_backend_refuses(tmp_path, monkeypatch, capsys, llama):
    """``attnscope models`` prints the notes and, for the chosen backend, the models it cannot open."""
    from attnscope.core.cli.main import main

    hub = tmp_path / "hub"
    _blob_repo(hub, "org/tiny-llama", {**_folder_files(llama[0]), "README.md": None})
    mlx, _ = _mlx_quantised(llama[0], tmp_path / "tiny-8bit", 8)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("ATTNSCOPE_LMSTUDIO_MODELS", "")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    assert main(["models", "--add", str(mlx)]) == 0
    capsys.readouterr()
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "\nnotes:\n  org/tiny-llama: incomplete in the cache (blob missing): README.md" in out
    assert "\nnot on torch:\n  tiny-8bit: llama checkpoint holds MLX-quantised weights (8-bit)" in out
    [row] = [line for line in out.splitlines() if line.startswith("tiny-8bit ")]
    assert row.rstrip().endswith("not on torch") and "108.9K" in row and "MLX 8-bit (group 64)" in row
    assert main(["models", "--backend", "mlx"]) == 0
    assert "not on mlx:" not in capsys.readouterr().out
