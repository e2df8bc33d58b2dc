"""The "Which heads matter" tab's second prompt: the corrupted prompt of activation patching (with the
IOI-style Swap that builds it from the clean one) and the source of resample ablation.

Patching (:func:`attnscope.core.analysis.head_effects.patch_heads`, exact, and
:func:`~attnscope.core.analysis.head_effects.attribution_patching`, the gradient estimate) gives, for
every head, the fraction of the clean − corrupted target difference its patch restores (denoise: clean
into the corrupted run) or breaks (noise: corrupted into the clean run). "Both" runs the estimate first
and the exact sweep after it, and shows how well they agree (Spearman's rank correlation and the
largest error, :meth:`~attnscope.core.analysis.head_effects.PatchResult.agreement`).
"""

from __future__ import annotations

import re

from attnscope.app.flow import FlowLayout
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

#: where a head is patched: label, :data:`attnscope.core.analysis.head_effects.SITES` key
SITES = (("head outputs", "output"), ("queries", "query"), ("keys and values (KV head)", "kv"))
#: how: label, key ("both": the estimate, then the exact sweep, and their agreement)
PATCH_METHODS = (("exact", "exact"), ("attribution (gradient)", "attribution"), ("both", "both"))
STOPPED = "stopped"


def swap_words(text: str, a: str, b: str) -> str:
    """``text`` with every whole-word ``a`` turned into ``b`` and every ``b`` into ``a`` (the IOI-style
    corrupted prompt: "When Mary and John …, John gave …" → "When John and Mary …, Mary gave …").
    Leading and trailing spaces of ``a`` and ``b`` are ignored (" Mary" is the word "Mary").

    Raises:
        ValueError: an empty word, the same word twice, or a word that is not in ``text`` (one line)."""
    a, b = a.strip(), b.strip()
    if not a or not b:
        raise ValueError("Swap needs two words: type one in each box")
    if a == b:
        raise ValueError(f"Swap needs two different words, got {a!r} twice")
    pat = re.compile(rf"(?<!\w)({re.escape(a)}|{re.escape(b)})(?!\w)")
    missing = [w for w in (a, b) if not re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text)]
    if missing:
        raise ValueError(f"the prompt has no word {missing[0]!r} to swap")
    return pat.sub(lambda m: b if m.group(1) == a else a, text)


def length_job(clean_n: int, text: str):
    """Engine job: ``None`` when ``text`` encodes (as the session's prompt was) to ``clean_n`` tokens, else
    the one line saying the lengths differ."""

    def job(ctx):
        s = ctx.require()
        n = len(s.encode(text, s.chat_template))
        if n == clean_n:
            return None
        return (
            f"the corrupted prompt has {n} tokens and the clean one {clean_n}: patching needs prompts of the "
            "same length (swap words that are one token each)"
        )

    return job


def patch_job(
    ids: tuple, kind: str, token: str, other: str, corrupt: str, site: str, method: str, scope: str
):
    """Engine job: exact and/or attribution patching of every head for the sequence ``ids``.

    Returns ``{"exact": PatchResult | None, "attribution": PatchResult | None, "agreement": dict, "prov":
    dict, "target_text": str, "other_text": str}``, :data:`STOPPED` when cancelled, None when the
    sequence changed."""

    def job(ctx):
        from attnscope.core.analysis.head_effects import (
            attribution_patching,
            make_target,
            patch_heads,
            provenance,
        )
        from attnscope.core.errors import Cancelled

        s = ctx.require()
        if tuple(getattr(s, "ids", ids)) != ids:
            return None
        local = getattr(s, "remote_call", None) is None

        def cancelled() -> bool:
            if local:
                ctx.serve_views()
            return ctx.cancelled()

        def progress(i: int, n: int) -> None:
            ctx.progress(f"Patching heads {i}/{n}", i / n)

        t = make_target(s, kind, None, token or None, other or None)
        approx = exact = None
        if method in ("attribution", "both"):
            ctx.progress("Attribution patching (one forward and backward per direction)", -1.0)
            approx = attribution_patching(s, corrupt, t, scope=scope, site=site)
        if method in ("exact", "both"):
            try:
                exact = patch_heads(
                    s, corrupt, t, scope=scope, site=site, progress=progress, cancelled=cancelled
                )
            except Cancelled:
                return STOPPED
        agree = approx.agreement(exact) if approx is not None and exact is not None else {}
        text = s.tokenizer.decode
        prov = provenance(s, t, corrupt=corrupt, scope=scope, site=site, method=method)
        return {
            "exact": exact,
            "attribution": approx,
            "agreement": agree,
            "prov": prov,
            "target_text": text([t.token]),
            "other_text": text([t.other]) if t.other >= 0 else "",
        }

    return job


def agreement_line(agree: dict) -> str:
    """``"denoise ρ 0.93, largest error 0.12 · noise ρ …"``: the estimate against the exact patch."""
    parts = []
    for name, label in (("denoise", "denoise"), ("noise", "noise"), ("denoise_kv", "groups denoise")):
        a = agree.get(name)
        if a:
            parts.append(f"{label} ρ {a['spearman']:.3f}, largest error {a['max_error']:.3f}")
    return " · ".join(parts)


def patch_to_json(patch: dict) -> dict:
    """A patching result (:func:`patch_job`'s dict) as JSON: the provenance, each method's arrays, the
    agreement."""
    return {
        **patch["prov"],
        "exact": patch["exact"].to_json() if patch["exact"] is not None else None,
        "attribution": patch["attribution"].to_json() if patch["attribution"] is not None else None,
        "agreement": patch["agreement"],
    }


def patch_from_json(data: dict) -> dict:
    """:func:`patch_to_json` read back.

    Raises:
        KeyError, TypeError, ValueError: a dict that is not such an export."""
    import numpy as np
    from attnscope.core.analysis.head_effects import PatchResult, Target

    def one(d):
        if not isinstance(d, dict):
            return None
        t = Target(**{k: d["target"][k] for k in ("kind", "position", "token", "other")})
        arr = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
        return PatchResult(
            arr(d["denoise"]),
            arr(d["noise"]),
            arr(d["denoise_kv"]),
            arr(d["noise_kv"]),
            float(d["clean"]),
            float(d["corrupt"]),
            t,
            str(d["scope"]),
            tuple(int(i) for i in d["layers"]),
            str(d["site"]),
            str(d["method"]),
        )

    exact, approx = one(data.get("exact")), one(data.get("attribution"))
    if exact is None and approx is None:
        raise ValueError("no patching result")
    prov = {k: v for k, v in data.items() if k not in ("exact", "attribution", "agreement")}
    return {
        "exact": exact,
        "attribution": approx,
        "agreement": dict(data.get("agreement") or {}),
        "prov": prov,
        "target_text": data.get("target_text") or "",
        "other_text": data.get("other_text") or "",
    }


class PatchForm(QWidget):
    """Two rows: the second prompt with the Swap helper; the patching site and method with Patch
    (:attr:`controls`, a row the tab adds its own controls to)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        first = row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Corrupted"))
        self.corrupt_edit = QLineEdit()
        self.corrupt_edit.setPlaceholderText("a second prompt of the same length (or Swap two words)")
        self.corrupt_edit.setToolTip(
            "The corrupted prompt of activation patching, and the source of resample ablation: it must "
            "have as many tokens as the clean prompt (encoded the same way, chat template or not)"
        )
        row.addWidget(self.corrupt_edit, 3)
        row.addWidget(QLabel("Swap"))
        self.swap_a = QLineEdit()
        self.swap_a.setPlaceholderText("Mary")
        self.swap_a.setMaximumWidth(70)
        self.swap_b = QLineEdit()
        self.swap_b.setPlaceholderText("John")
        self.swap_b.setMaximumWidth(70)
        row.addWidget(self.swap_a)
        row.addWidget(QLabel("⇄"))
        row.addWidget(self.swap_b)
        self.swap_button = QPushButton("Swap")
        self.swap_button.setToolTip(
            "Build the corrupted prompt from the clean one with the two words swapped everywhere "
            "(the indirect-object swap: Mary ⇄ John)"
        )
        row.addWidget(self.swap_button)
        # the patching row wraps instead of cutting its combos in a narrow tab; the tab adds its own
        # units to it (add_unit)
        controls = QWidget()
        self.controls = flow = FlowLayout(controls)
        self.site_combo = QComboBox()
        for label, key in SITES:
            self.site_combo.addItem(label, key)
        self.site_combo.setToolTip(
            "What is patched per head: its output (and each GQA group's outputs together), its query "
            "projection, or its KV head's keys and values"
        )
        self.patch_method_combo = QComboBox()
        for label, key in PATCH_METHODS:
            self.patch_method_combo.addItem(label, key)
        self.patch_method_combo.setToolTip(
            "Exact: a forward per head (from its layer on). Attribution: one forward and backward per "
            "direction, the first-order estimate of every patch. Both: the estimate, the exact sweep, and "
            "how well they agree"
        )
        self.patch_button = QPushButton("Patch")
        self.patch_button.setToolTip(
            "Patch every head between the clean and the corrupted prompt: the fraction of the target "
            "difference each restores (denoise) and breaks (noise)"
        )
        flow.add_unit(QLabel("Patch"), self.site_combo)
        flow.add_unit(self.patch_method_combo)
        flow.add_unit(self.patch_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(3)
        lay.addLayout(first)
        lay.addWidget(controls)
