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
replaced by :func:`attnscope.core.tokens.visible_text` stand-ins, so the file always parses.
"""

from __future__ import annotations

import math
import re

from attnscope.core.tokens import visible_text

_ATTR = re.compile(r'([\w:-]+)="([^"]*)"')
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
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
        img = Image.open(io.BytesIO(base64.b64decode(href[len(head) :])))
        img.load()
    except Exception:  # not a PNG Pillow reads: leave it
        return None
    w, h = img.size
    k = max(1, min(math.ceil(shown_w / max(w, 1)), math.ceil(shown_h / max(h, 1))))
    k = min(k, max(1, int(math.sqrt(MAX_IMAGE_PIXELS / max(1, w * h)))))
    if k <= 1:
        return None
    buf = io.BytesIO()
    img.resize((w * k, h * k), Image.Resampling.NEAREST).save(buf, format="PNG")
    return head + base64.b64encode(buf.getvalue()).decode("ascii")


def _matrix(transform: str | None) -> tuple[float, ...]:
    """``matrix(a,b,c,d,e,f)`` / ``translate`` / ``scale`` as a 6-tuple (identity when absent)."""
    if not transform:
        return (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    out: tuple[float, ...] = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    m: tuple[float, ...]
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
    """The affine product ``p · q`` of two SVG matrices ``(a, b, c, d, e, f)``."""
    a, b, c, d, e, f = p
    A, B, C, D, E, F = q
    return (a * A + c * B, b * A + d * B, a * C + c * D, b * C + d * D, a * E + c * F + e, b * E + d * F + f)


def _scale(m: tuple[float, ...]) -> float:
    return math.sqrt(abs(m[0] * m[3] - m[1] * m[2])) or 1.0


def _set_attr(attrs: str, name: str, value: str) -> str:
    if re.search(rf'(?<![\w-]){re.escape(name)}="', attrs):
        return re.sub(rf'(?<![\w-]){re.escape(name)}="[^"]*"', f'{name}="{value}"', attrs, count=1)
    return f' {name}="{value}"' + attrs


_GTAG = re.compile(r'<g\b((?:[^>"]|"[^"]*")*)>|</g>')
_IMAGE = re.compile(r'<image\b((?:[^>"]|"[^"]*")*?)(/?)>', re.S)


def _fix_image(m: re.Match, s: float) -> str:
    attrs, close = m.group(1), m.group(2)
    a = dict(_ATTR.findall(attrs))
    href_key = "xlink:href" if "xlink:href" in a else "href"
    try:
        bigger = _enlarged_png(
            a.get(href_key, ""), float(a.get("width", 0)) * s, float(a.get("height", 0)) * s
        )
    except ValueError:
        bigger = None
    new = attrs.replace(a[href_key], bigger, 1) if bigger is not None else attrs
    style = a.get("style", "")
    new = _set_attr(new, "style", (style + ";" if style else "") + PIXELATED)
    return f"<image{new}{close}>"


def fix_svg(svg: str) -> str:
    """``svg`` (QSvgGenerator output) with the viewer-independent fixes of this module applied.

    QSvgGenerator writes flat groups (one ``<g transform=…>`` per painter state, holding the shapes
    drawn in it), so each innermost group is handled as one block: its scale, stroke and fill apply
    to every shape inside. Linear in the file's size (a 256 × 256-cell figure: 5.7 MB in ~0.5 s).
    """
    svg = _XML_BAD.sub(lambda m: visible_text(m.group(0)), svg)
    patterns = {m.group(1): m.group(0) for m in re.finditer(r'<pattern id="([^"]+)".*?</pattern>', svg, re.S)}
    extra: dict[str, str] = {}

    def block(attrs: str, body: str) -> str:
        a = dict(_ATTR.findall(attrs))
        s = _scale(_matrix(a.get("transform")))
        if "<image" in body:
            body = _IMAGE.sub(lambda im: _fix_image(im, s), body)
        if abs(s - 1.0) > 1e-6:
            if "non-scaling-stroke" in body:
                extra_attrs = f' stroke-width="{float(a.get("stroke-width", "1") or 1) / s:.6g}"'
                dash = a.get("stroke-dasharray")
                if dash and dash != "none":
                    extra_attrs += (
                        f' stroke-dasharray="{",".join(f"{float(x) / s:.6g}" for x in _NUM.findall(dash))}"'
                    )
                body = body.replace(
                    'vector-effect="non-scaling-stroke"', 'vector-effect="non-scaling-stroke"' + extra_attrs
                )
            pm = re.fullmatch(r"url\(#([^)]+)\)", a.get("fill", ""))
            if pm and pm.group(1) in patterns:
                pid = f"{pm.group(1)}_s{round(s * 1000)}"
                if pid not in extra:
                    body_p = patterns[pm.group(1)].replace(f'id="{pm.group(1)}"', f'id="{pid}"', 1)
                    extra[pid] = body_p.replace(
                        "<pattern ", f'<pattern patternTransform="scale({1 / s:.6g})" ', 1
                    )
                attrs = _set_attr(attrs, "fill", f"url(#{pid})")
        return f"<g{attrs}>{body}</g>"

    pieces, pos, open_tag = [], 0, None
    for m in _GTAG.finditer(svg):
        if m.group(0).startswith("</"):
            if open_tag is not None:  # an innermost group: open_tag .. this close
                om = open_tag
                body = svg[om.end() : m.start()]
                if "<image" in body or "non-scaling-stroke" in body or "url(#" in om.group(1):
                    pieces.append(svg[pos : om.start()])
                    pieces.append(block(om.group(1), body))
                    pos = m.end()
            open_tag = None
        else:
            open_tag = m
    pieces.append(svg[pos:])
    text = "".join(pieces)
    if extra:
        defs = "<defs>\n" + "\n".join(extra.values()) + "\n</defs>\n"
        text = re.sub(r"(<svg\b(?:[^>\"]|\"[^\"]*\")*>)", lambda mm: mm.group(1) + "\n" + defs, text, count=1)
    return text
