"""``attnscope export``: one head's weights after prefill + N decode steps, as PNG, NPY or CSV.

Rows are query positions, columns key positions (0-based), zero above the diagonal, each row
summing to 1. The tokens are printed, one per line, as ``position<TAB>id<TAB>label``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.cli import add_model_arguments, add_prompt_arguments, open_session

NAME = "export"
HELP = "export one head's attention weights (PNG, NPY or CSV)"
FORMATS = (".png", ".npy", ".csv")


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("--layer", type=int, required=True, help="layer (0-based)")
    p.add_argument("--head", type=int, required=True, help="query head (0-based)")
    p.add_argument("--out", required=True, help="output file: .png, .npy or .csv")
    p.add_argument("--cmap", default="viridis", help="colour map for PNG")


def write_weights(w: np.ndarray, out: Path, cmap: str = "viridis") -> None:
    """Write a weights matrix to ``out`` by its suffix (.png / .npy / .csv)."""
    suffix = out.suffix.lower()
    if suffix == ".npy":
        np.save(out, w.astype(np.float32))
    elif suffix == ".csv":
        np.savetxt(out, w, delimiter=",", fmt="%.8g")
    elif suffix == ".png":
        from core.render import save_heatmap_png

        save_heatmap_png(w, out, cmap=cmap)
    else:
        raise ValueError(f"unsupported output {out.name!r}: use one of {', '.join(FORMATS)}")


def run(args) -> int:
    out = Path(args.out)
    if out.suffix.lower() not in FORMATS:
        raise ValueError(f"unsupported output {out.name!r}: use one of {', '.join(FORMATS)}")
    if not out.parent.exists():
        raise FileNotFoundError(f"folder {out.parent} does not exist")
    s = open_session(args)
    w = s.weights(args.layer, args.head)
    write_weights(w, out, args.cmap)
    for t in s.tokens:
        print(f"{t.position}\t{t.id}\t{t.text!r}")
    return 0
