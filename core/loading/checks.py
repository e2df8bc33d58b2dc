"""Checks of a model before transformers touches it, each failure one line: a GGUF's header
(:func:`check_gguf`), a Hugging Face folder's files and config (:func:`check_hf_folder`,
:func:`check_config`), a family (:func:`check_architecture`). Metadata only: no tensor is read.

Raises :class:`attnscope.core.errors.ModelLoadError` (broken, missing) or
:class:`attnscope.core.errors.UnsupportedModelError` (readable, but our attention path cannot run it).
"""

from __future__ import annotations

import json
from pathlib import Path

from attnscope.core import backend_registry as registry
from attnscope.core.errors import ModelLoadError, UnsupportedModelError, first_line
from attnscope.core.loading import support_rule
from attnscope.core.loading.safetensors_header import check_safetensors
from attnscope.core.loading.weight_files import weight_files

# Which decoders run is decided by a rule read from transformers' model code
# (attnscope.core.loading.support_rule); these are the families tests/core/test_families.py proves exact,
# the ones docs/models.md lists and the packaged app bundles model code for.
SUPPORTED_ARCHITECTURES = set(support_rule.TESTED_FAMILIES)


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
        raise ModelLoadError(f"cannot read {path.name}: {first_line(e)}") from None


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
        raise ModelLoadError(f"{cfg_path} is not valid JSON: {first_line(e)}") from None
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
