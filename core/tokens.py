"""Token labels for display.

Byte-level BPE tokenizers (GPT-2, Llama-3, SmolLM2, Qwen) store bytes as printable stand-ins
(``Ġ`` = space, ``Ċ`` = newline); SentencePiece uses ``▁`` for a space. Labels decode those for
display, while the raw token and id stay available for the hover readout (docs/window.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (Radford et al. 2019, encoder.py)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}

#: tokenizer kinds (:func:`tokenizer_kind`): how a raw token string maps to text.
BYTE_LEVEL = "byte_level"  # GPT-2 style: every byte stored as a printable stand-in (Ġ = space, Ċ = newline)
SENTENCEPIECE = "sentencepiece"  # ▁ = space, <0xNN> = byte fallback, other characters are themselves
PLAIN = "plain"  # anything else (WordPiece, character vocabularies): the string is the text


def visible_text(text: str) -> str:
    """``text`` with every character a file or a label cannot show drawn as a visible stand-in.

    ``\n`` ``\t`` ``\r`` → ``↵`` ``⇥`` ``␍``; the other C0 controls (U+0000–U+001F) → their Unicode
    Control Pictures (form feed ``␌``, ESC ``␛``, BEL ``␇``, NUL ``␀``), DEL → ``␡``; C1 controls
    (U+0080–U+009F), lone surrogates and the non-characters U+FFFE/U+FFFF → ``<U+XXXX>``. The result is
    legal in XML 1.0 (SVG ``<text>``, ``<desc>``) and PDF text. Other characters pass unchanged.

    >>> visible_text("a\x0cb\x1b[0m\x07")
    'a␌b␛[0m␇'
    """
    out = []
    for ch in text:
        o = ord(ch)
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif o < 0x20:
            out.append(chr(0x2400 + o))
        elif o == 0x7F:
            out.append("␡")
        elif 0x80 <= o <= 0x9F or 0xD800 <= o <= 0xDFFF or o in (0xFFFE, 0xFFFF):
            out.append(f"<U+{o:04X}>")
        else:
            out.append(ch)
    return "".join(out)


def tokenizer_kind(tokenizer) -> str:
    """How ``tokenizer``'s raw token strings encode text: :data:`BYTE_LEVEL`, :data:`SENTENCEPIECE` or :data:`PLAIN`.

    Read from the tokenizer itself, never from the characters of a token: a fast tokenizer's decoder /
    pre-tokenizer (``ByteLevel`` → byte-level; ``Metaspace``, a ``▁`` replace or ``ByteFallback`` →
    SentencePiece); a slow one's ``byte_decoder`` (GPT-2) or ``sp_model`` (SentencePiece). The answer is
    cached on the tokenizer object.
    """
    cached = getattr(tokenizer, "_attnscope_kind", None)
    if cached is not None:
        return cached
    kind = PLAIN
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = []
    if backend is not None:
        for attr in ("decoder", "pre_tokenizer"):
            obj = getattr(backend, attr, None)
            if obj is not None:
                try:
                    parts.append(
                        obj.__getstate__().decode("utf-8", "replace")
                        if hasattr(obj, "__getstate__")
                        else repr(obj)
                    )
                except Exception:  # an exotic component without a JSON state
                    parts.append(repr(obj))
        model = getattr(backend, "model", None)
        if getattr(model, "byte_fallback", False):
            parts.append("ByteFallback")
    desc = " ".join(parts)
    if "ByteLevel" in desc:
        kind = BYTE_LEVEL
    elif "Metaspace" in desc or "ByteFallback" in desc or "\u2581" in desc or "\\u2581" in desc:
        kind = SENTENCEPIECE
    elif getattr(tokenizer, "byte_decoder", None) is not None:
        kind = BYTE_LEVEL
    elif getattr(tokenizer, "sp_model", None) is not None:
        kind = SENTENCEPIECE
    try:
        tokenizer._attnscope_kind = kind
    except (AttributeError, TypeError):  # a tokenizer that refuses attributes: recompute next time
        pass
    return kind


def _bytes_text(data: bytes) -> str:
    """UTF-8 text of ``data``; bytes that do not form complete UTF-8 become ``<0xNN>`` (ASCII stays)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out, i = [], 0
    while i < len(data):  # decode the longest valid prefix at each point, escape what is left
        for j in range(min(len(data), i + 4), i, -1):
            try:
                out.append(data[i:j].decode("utf-8"))
                i = j
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{data[i]:02X}>")
            i += 1
    return "".join(out)


def _guess_kind(raw: str) -> str:
    """Without a tokenizer: SentencePiece when the piece carries its markers, else byte-level."""
    if "\u2581" in raw or (raw.startswith("<0x") and raw.endswith(">") and len(raw) == 6):
        return SENTENCEPIECE
    dec = _byte_decoder()
    return BYTE_LEVEL if all(ch in dec for ch in raw) else PLAIN


def display_label(raw: str, kind: str | None = None) -> str:
    """Human-readable label of one raw token string of a tokenizer of ``kind`` (:func:`tokenizer_kind`).

    * byte-level (GPT-2, Llama-3, SmolLM2, Qwen): the stand-ins decode to their bytes (``Ġ`` → space,
      ``Ċ`` → newline); bytes that do not form complete UTF-8 on their own are shown as ``<0xNN>``.
    * SentencePiece (Gemma, Llama-2, Mistral): ``▁`` → space, a byte-fallback piece ``<0xNN>`` is its
      character when ASCII and stays ``<0xNN>`` otherwise (a lone byte ≥ 0x80 is incomplete UTF-8);
      every other character is itself (``"ör"`` stays ``"ör"``: what ``tokenizer.decode([id])`` gives).
    * plain: the string as is.

    Then :func:`visible_text` (``↵``, ``⇥``, ``␌``, ``␛`` …). ``kind=None`` guesses from the string
    (for callers without a tokenizer); code that has the tokenizer passes its kind.

    >>> display_label("Ġcat", BYTE_LEVEL), display_label("Ċ", BYTE_LEVEL), display_label("▁the", SENTENCEPIECE)
    (' cat', '↵', ' the')
    """
    kind = kind or _guess_kind(raw)
    if kind == SENTENCEPIECE:
        if raw.startswith("<0x") and raw.endswith(">") and len(raw) == 6:  # byte fallback
            try:
                b = int(raw[3:5], 16)
            except ValueError:
                b = None
            text = chr(b) if b is not None and b < 128 else raw
        else:
            text = raw.replace("\u2581", " ")
    elif kind == BYTE_LEVEL:
        dec = _byte_decoder()
        if all(ch in dec for ch in raw):
            text = _bytes_text(bytes(dec[ch] for ch in raw))
        else:  # a special or added token (<|im_start|>): itself
            text = raw
    else:
        text = raw
    return visible_text(text)


#: why a token reads ``<id N>`` (the next-token panel's legend and tooltip, the CLI's note, sidecars)
UNKNOWN_ID_NOTE = (
    "<id N> is a token id the tokenizer does not know: the model's vocabulary is padded past the "
    "tokenizer's size (as Qwen and Phi-3 pad theirs), so the id has no text"
)


def unknown_label(token_id: int) -> str:
    """The label of an id the tokenizer has no token for: ``<id 50211>``."""
    return f"<id {int(token_id)}>"


def is_unknown(raw: str, token_id: int) -> bool:
    """Whether ``raw`` is :func:`unknown_label` of ``token_id`` (a token the tokenizer does not know)."""
    return raw == unknown_label(token_id)


def _raw_token(tokenizer, token_id: int) -> str | None:
    """The tokenizer's string for ``token_id``; None when it has none (an id past its vocabulary:
    fast tokenizers answer None, SentencePiece raises)."""
    try:
        raw = tokenizer.convert_ids_to_tokens(int(token_id))
    except (IndexError, KeyError, ValueError, OverflowError, RuntimeError):
        return None
    return None if raw is None else raw if isinstance(raw, str) else str(raw)


def token_text(tokenizer, token_id: int) -> tuple[str, str]:
    """``(raw, label)`` of one id of ``tokenizer``: its own string and :func:`display_label` by the
    tokenizer's kind. The one place token text comes from (session tokens, next-token lists, exports).

    An id the tokenizer does not know (a model vocabulary padded past the tokenizer's size) is
    ``("<id N>", "<id N>")`` (:func:`unknown_label`, :data:`UNKNOWN_ID_NOTE`), never ``"None"``.
    """
    raw = _raw_token(tokenizer, token_id)
    if raw is None:
        label = unknown_label(token_id)
        return label, label
    return raw, display_label(raw, tokenizer_kind(tokenizer))


def decode_text(tokenizer, ids) -> str:
    """``tokenizer.decode(ids)``, with each id the tokenizer does not know written as ``<id N>`` where it
    stands (``decode`` alone drops it silently). Ids it knows decode as one run each, so the text is
    ``decode(ids)`` itself when every id is known."""
    ids = [int(i) for i in ids]
    unknown = [_raw_token(tokenizer, i) is None for i in ids]
    if not any(unknown):
        return tokenizer.decode(ids)
    out: list[str] = []
    run: list[int] = []
    for i, u in zip(ids, unknown, strict=True):
        if not u:
            run.append(i)
            continue
        if run:
            out.append(tokenizer.decode(run))
            run = []
        out.append(unknown_label(i))
    if run:
        out.append(tokenizer.decode(run))
    return "".join(out)


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


NO_TOKENS = (
    "the prompt has no tokens: the tokenizer keeps none of its characters (and this model adds no BOS token)"
)


def roundtrip_notice(tokenizer, text: str, limit: int = 3) -> str | None:
    """One line saying how ``tokenizer`` changes ``text``, or None when ``decode(encode(text)) == text``.

    Encoded without special tokens and the chat template, decoded without clean-up, so only what the
    vocabulary drops or replaces (unknown characters, normalisation such as NFKC) shows. The line names
    up to ``limit`` changed spans with :func:`visible_text` stand-ins, e.g.
    ``the tokenizer changes the prompt (decoded text differs from what was typed): '␌' → '' at 6``.
    """
    import difflib

    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception as e:  # a tokenizer that cannot round-trip at all: say so, never fail the run
        return f"the tokenizer could not decode the prompt back ({type(e).__name__}): labels may not match the text"
    if back == text or back == text.lstrip(" ") or (" " + back) == text:  # dummy-prefix space only
        return None
    sm = difflib.SequenceMatcher(None, text, back, autojunk=False)
    changes = [(i1, text[i1:i2], back[j1:j2]) for op, i1, i2, j1, j2 in sm.get_opcodes() if op != "equal"]
    if not changes:
        return None
    shown = ", ".join(f"{visible_text(a)!r} → {visible_text(b)!r} at {i}" for i, a, b in changes[:limit])
    more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
    return f"the tokenizer changes the prompt (decoded text differs from what was typed): {shown}{more}"
