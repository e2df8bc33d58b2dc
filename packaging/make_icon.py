"""Draw AttnScope's icon: a causal attention map (lower triangle) in the app's default colour map (viridis).

    python packaging/make_icon.py                 # writes assets/icons/attnscope.png (256 x 256)
    python packaging/make_icon.py --ico X.ico     # also a Windows .ico (16..256 px)
    python packaging/make_icon.py --icns X.icns   # also a macOS .icns

The cells are the softmax of a toy score pattern: every query row puts mass on token 0 (a sink),
on itself and on its neighbour, so the motif reads as "attention" and not as a bar chart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnscope.core.io.colormaps import lut  # noqa: E402

N = 7  # tokens


def attention_pattern(n: int = N) -> np.ndarray:
    """(n, n) float32 causal attention weights: rows sum to 1, zero above the diagonal."""
    i, j = np.indices((n, n))
    scores = np.where(j == 0, 2.2, 0.0) + np.where(j == i, 1.8, 0.0) + np.where(j == i - 1, 1.0, 0.0)
    scores = np.where(j <= i, scores, -np.inf)
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def draw(size: int = 256) -> Image.Image:
    """RGBA icon of ``size`` x ``size`` pixels (drawn at 4x and downsampled for smooth edges)."""
    s = 4 * size
    img = Image.new("RGBA", (s, s), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((0, 0, s - 1, s - 1), radius=s // 6, fill=(24, 22, 38, 255))
    colours = lut("viridis")  # (256, 3) uint8, the app's default colour map
    w = attention_pattern()
    margin, gap = s * 0.14, s * 0.012
    cell = (s - 2 * margin) / N
    for r in range(N):
        for c in range(r + 1):
            v = 0.18 + 0.82 * min(1.0, float(w[r, c]) / 0.75)  # lift small weights off the background
            rgb = tuple(int(x) for x in colours[int(v * 255)])
            x0, y0 = margin + c * cell + gap, margin + r * cell + gap
            d.rounded_rectangle(
                (x0, y0, x0 + cell - 2 * gap, y0 + cell - 2 * gap), radius=cell * 0.12, fill=rgb + (255,)
            )
    return img.resize((size, size), Image.LANCZOS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--png", type=Path, default=ROOT / "assets" / "icons" / "attnscope.png")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--ico", type=Path, help="also write a Windows .ico")
    p.add_argument("--icns", type=Path, help="also write a macOS .icns")
    args = p.parse_args(argv)
    img = draw(max(args.size, 256))
    args.png.parent.mkdir(parents=True, exist_ok=True)
    img.resize((args.size, args.size), Image.LANCZOS).save(args.png, optimize=True)
    print(args.png)
    if args.ico:
        img.save(args.ico, sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (128, 128), (256, 256)])
        print(args.ico)
    if args.icns:
        draw(1024).save(args.icns)
        print(args.icns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
