"""Make Qt's SVG output draw the same in every viewer (librsvg, browsers, Inkscape).

QSvgGenerator writes what a Qt painter did, and three things in it depend on the viewer:

* **cosmetic pens** (pyqtgraph's outlines, frames and axes inside a scaled plot) become
  ``vector-effect="non-scaling-stroke"``, which librsvg ignores: a 1.5 px dashed outline inside a
  group scaled ×35 (one token = 35 px) is drawn 52 px wide and hides the row it marks. Each such
  element gets the stroke width and dash lengths divided by its group's scale, so the stroke is
  the intended pixels wide with or without ``vector-effect``.
* **images** (a map drawn as one picture) are resampled smoothly by most viewers (librsvg 2.54
  ignores ``image-rendering``): every ``<image>`` shown larger than its pixels is enlarged with
  nearest-neighbour to about its displayed size (at most :data:`MAX_IMAGE_PIXELS`), so a viewer's
  smoothing only touches the one-pixel seams between cells, and gets ``image-rendering: pixelated``
  for the viewers that honour it.
* **pattern fills** (the hatch of masked cells) are defined in pixels but used inside scaled
  groups; each use gets a copy of the pattern with the inverse ``patternTransform``.

Text that XML 1.0 forbids (control characters in a token, a title or the ``<desc>`` JSON) is
replaced by :func:`core.tokens.visible_text` stand-ins, so the file always parses.
"""

from __future__ import annotations

import math
import re

from core.tokens import visible_text

_TAG = re.compile(r'<(/?)([A-Za-z][\w:.-]*)((?:[^>"]|"[^"]*")*?)(/?)>', re.S)
_ATTR = re.compile(r'([\w:-]+)="([^"]*)"')
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
_SHAPES = {"rect", "path", "polyline", "polygon", "line", "ellipse", "circle"}
PIXELATED = "image-rendering:pixelated;image-rendering:crisp-edges"
MAX_IMAGE_PIXELS = 16_000_000  # an enlarged image stays below this many pixels (~4000 × 4000)


def _enlarged_png(href: str, shown_w: float, shown_h: float) -> str | None:
    """A ``data:image/png;base64`` href enlarged with nearest-neighbour to about ``shown`` pixels, or None."""
    import base64
    import io

    from PIL import Image

    head = "data:image/png;base64,"
    if not href.startswith(head):
        return None
    try:
        img = Image.open(io.BytesIO(base64.b64decode(href[len(head):])))
        img.load()
    except Exception:  # not a PNG Pillow reads: leave it
        return None
    w, h = img.size
    k = max(1, min(math.ceil(shown_w / max(w, 1)), math.ceil(shown_h / max(h, 1))))
    k = min(k, max(1, int(math.sqrt(MAX_IMAGE_PIXELS / max(1, w * h)))))
    if k <= 1:
        return None
    buf = io.BytesIO()
    img.resize((w * k, h * k), Image.NEAREST).save(buf, format="PNG")
    return head + base64.b64encode(buf.getvalue()).decode("ascii")


def _matrix(transform: str | None) -> tuple[float, ...]:
    """``matrix(a,b,c,d,e,f)`` / ``translate`` / ``scale`` as a 6-tuple (identity when absent)."""
    if not transform:
        return (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    out = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    for name, args in re.findall(r"(\w+)\s*\(([^)]*)\)", transform):
        v = [float(x) for x in _NUM.findall(args)]
        if name == "matrix" and len(v) == 6:
            m = tuple(v)
        elif name == "translate" and v:
            m = (1.0, 0.0, 0.0, 1.0, v[0], v[1] if len(v) > 1 else 0.0)
        elif name == "scale" and v:
            m = (v[0], 0.0, 0.0, v[1] if len(v) > 1 else v[0], 0.0, 0.0)
        else:
            continue
        out = _mul(out, m)
    return out


def _mul(p: tuple[float, ...], q: tuple[float, ...]) -> tuple[float, ...]:
    a, b, c, d, e, f = p
    A, B, C, D, E, F = q
    return (a * A + c * B, b * A + d * B, a * C + c * D, b * C + d * D, a * E + c * F + e, b * E + d * F + f)


def _scale(m: tuple[float, ...]) -> float:
    return math.sqrt(abs(m[0] * m[3] - m[1] * m[2])) or 1.0


def _set_attr(attrs: str, name: str, value: str) -> str:
    if re.search(rf'(?<![\w-]){re.escape(name)}="', attrs):
        return re.sub(rf'(?<![\w-]){re.escape(name)}="[^"]*"', f'{name}="{value}"', attrs, count=1)
    return f' {name}="{value}"' + attrs


def fix_svg(svg: str) -> str:
    """``svg`` (QSvgGenerator output) with the viewer-independent fixes of this module applied."""
    svg = _XML_BAD.sub(lambda m: visible_text(m.group(0)), svg)
    patterns = {m.group(1): m.group(0) for m in re.finditer(r'<pattern id="([^"]+)".*?</pattern>', svg, re.S)}
    extra: dict[str, str] = {}
    stack: list[tuple[tuple[float, ...], dict]] = [((1.0, 0.0, 0.0, 1.0, 0.0, 0.0), {})]
    out, pos = [], 0
    for m in _TAG.finditer(svg):
        closing, name, attrs, selfclose = m.group(1), m.group(2), m.group(3), m.group(4)
        out.append(svg[pos:m.start()])
        pos = m.end()
        if closing:
            if name == "g" and len(stack) > 1:
                stack.pop()
            out.append(m.group(0))
            continue
        a = dict(_ATTR.findall(attrs))
        mat = _mul(stack[-1][0], _matrix(a.get("transform")))
        inherited = dict(stack[-1][1])
        for k in ("stroke-width", "stroke-dasharray", "fill"):
            if k in a:
                inherited[k] = a[k]
        new = attrs
        s = _scale(mat)
        if name == "image":
            style = a.get("style", "")
            href_key = "xlink:href" if "xlink:href" in a else "href"
            try:
                bigger = _enlarged_png(a.get(href_key, ""), float(a.get("width", 0)) * s, float(a.get("height", 0)) * s)
            except ValueError:
                bigger = None
            if bigger is not None:
                new = new.replace(a[href_key], bigger, 1)
            new = _set_attr(new, "style", (style + ";" if style else "") + PIXELATED)
        elif name in _SHAPES and abs(s - 1.0) > 1e-6:
            if a.get("vector-effect") == "non-scaling-stroke":
                w = float(inherited.get("stroke-width", "1") or 1)
                new = _set_attr(new, "stroke-width", f"{w / s:.6g}")
                dash = inherited.get("stroke-dasharray")
                if dash and dash != "none":
                    new = _set_attr(new, "stroke-dasharray", ",".join(f"{float(x) / s:.6g}" for x in _NUM.findall(dash)))
            fill = inherited.get("fill", "")
            pm = re.fullmatch(r"url\(#([^)]+)\)", fill)
            if pm and pm.group(1) in patterns:
                pid = f"{pm.group(1)}_s{round(s * 1000)}"
                if pid not in extra:
                    body = patterns[pm.group(1)].replace(f'id="{pm.group(1)}"', f'id="{pid}"', 1)
                    extra[pid] = body.replace("<pattern ", f'<pattern patternTransform="scale({1 / s:.6g})" ', 1)
                new = _set_attr(new, "fill", f"url(#{pid})")
        if name == "g" and not selfclose:
            stack.append((mat, inherited))
        out.append(f"<{name}{new}{selfclose}>" if new != attrs else m.group(0))
    out.append(svg[pos:])
    text = "".join(out)
    if extra:
        defs = "<defs>\n" + "\n".join(extra.values()) + "\n</defs>\n"
        text = re.sub(r"(<svg\b(?:[^>\"]|\"[^\"]*\")*>)", lambda mm: mm.group(1) + "\n" + defs, text, count=1)
    return text
