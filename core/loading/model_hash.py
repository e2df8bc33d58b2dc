"""What identifies a model's weights on disk: one SHA-256 for a file or a Hugging Face folder, recorded in
every export's sidecar, saved session and comparison, and checked when a saved session is reopened.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def model_sha256(source: str | os.PathLike | None) -> str | None:
    """SHA-256 identifying a model's weights, or None when ``source`` is not on disk.

    A file (GGUF, safetensors) hashes as itself (:func:`attnscope.core.loading.cache_folder.file_sha256`, memoised). A
    Hugging Face folder hashes as the SHA-256 of the text ``"<name> <sha256>\\n"`` over its
    ``config.json`` and weight files (``*.safetensors``, ``*.bin``, ``*.gguf``) in name order.
    """
    from attnscope.core.loading.cache_folder import file_sha256

    if not source:
        return None
    p = Path(source)
    if p.is_file():
        return file_sha256(p)
    if p.is_dir():
        files = sorted(
            f
            for f in p.iterdir()
            if f.is_file() and (f.name == "config.json" or f.suffix in (".safetensors", ".bin", ".gguf"))
        )
        if not files:
            return None
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name} {file_sha256(f)}\n".encode())
        return h.hexdigest()
    return None
