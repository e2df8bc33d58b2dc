"""Reading back what :func:`attnscope.core.io.data_writers.write_data` wrote (the tests' check of the files)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from attnscope.core.io.data_writers import SAFETENSORS_KEY


def read_data(path: str | os.PathLike) -> np.ndarray:
    """The float32 matrix in a ``.npy``, ``.csv`` or ``.safetensors`` export (by suffix)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt == "npy":
        return np.load(path)
    if fmt == "csv":
        from attnscope.core.io.data_writers import read_map_csv

        return read_map_csv(path)[0]
    if fmt == "safetensors":
        from safetensors.numpy import load_file

        return load_file(str(path))[SAFETENSORS_KEY]
    raise ValueError(f"not a data export: {path.name!r}")
