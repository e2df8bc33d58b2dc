"""Token labels for display.

Byte-level BPE tokenizers (GPT-2, Llama-3, SmolLM2, Qwen) store bytes as printable stand-ins
(``Ġ`` = space, ``Ċ`` = newline); SentencePiece uses ``▁`` for a space. Labels decode those for
display, while the raw token and id stay available for the hover readout (DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (Radford et al. 2019, encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}


def display_label(raw: str) -> str:
    """Human-readable label of one raw token string.

    ``Ġ``/``▁`` become a space, ``Ċ`` becomes ``↵``; bytes that do not form complete UTF-8 on
    their own are shown as ``<0xNN>``.

    >>> display_label("Ġcat"), display_label("Ċ"), display_label("▁the")
    (' cat', '↵', ' the')
    """
    dec = _byte_decoder()
    if raw.startswith("<0x") and raw.endswith(">") and len(raw) == 6:  # SentencePiece byte fallback
        text = chr(int(raw[3:5], 16)) if int(raw[3:5], 16) < 128 else raw
    elif all(ch in dec for ch in raw):
        data = bytes(dec[ch] for ch in raw)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = "".join(f"<0x{b:02X}>" if b >= 128 else chr(b) for b in data)
    else:
        text = raw.replace("▁", " ")
    return "".join(_VISIBLE.get(ch, ch) for ch in text)


@dataclass(frozen=True)
class Token:
    """One position of the sequence.

    Attributes:
        position: 0-based index in the sequence.
        id: vocabulary id.
        raw: the tokenizer's own string for the id (e.g. ``"Ġcat"``).
        text: display label (e.g. ``" cat"``), see :func:`display_label`.
        generated: True for tokens produced by decode, False for the prompt.
    """

    position: int
    id: int
    raw: str
    text: str
    generated: bool = False
