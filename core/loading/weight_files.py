"""Which files of a model folder hold the weights the loader reads (transformers' own choice), so that the
catalog's counts, the fit estimate and the loaders read the same files. A leaf of ``core/loading``."""

from __future__ import annotations

import json
from pathlib import Path

from attnscope.core.errors import ModelLoadError, first_line

#: transformers' own names for a folder's weights, in the order ``from_pretrained`` looks for them
#: (modeling_utils._get_resolved_checkpoint_files: safetensors, its shard index, then the torch pickles)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def weight_files(folder: Path, cfg: dict | None = None) -> list[Path]:
    """The weight files the loader reads from a model folder, in name order; [] when there are none.

    transformers' own selection (``from_pretrained`` on a local folder): the file a config's
    ``transformers_weights`` names, else the first of :data:`WEIGHT_FILES` present, a shard index
    standing for the files of its ``weight_map``. Other copies of the same weights beside them
    (Mistral's ``consolidated.safetensors``, Meta's ``original/`` folder) are not read, so they are
    not counted either (the catalog's parameters and size, the fit).

    Raises:
        ModelLoadError: a shard index that is not valid JSON with a ``weight_map`` of file names.
    """
    folder = Path(folder)
    named = (cfg or {}).get("transformers_weights")
    candidates = (named,) if isinstance(named, str) and named else WEIGHT_FILES
    for name in candidates:
        f = folder / name
        if not (f.is_file() or f.is_symlink()):
            continue
        if not name.endswith(".index.json") or not f.exists():  # a dangling link: said incomplete
            return [f]
        try:
            index = json.loads(f.read_text())
            shards = index["weight_map"].values()
            files = sorted({folder / str(w) for w in shards})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{f} is not a valid safetensors index: {first_line(e)}") from None
        if not isinstance(index.get("metadata"), dict):  # transformers reads index["metadata"]
            raise ModelLoadError(f'{f} is not a valid safetensors index: it has no "metadata" object')
        return files
    return []
