"""The sequence as text, each token shaded by the weight the selected query row puts on it.

This is the current query's attention row shown as the prompt text: the outlined token is the
query, every other token's background is the weight that query puts on it. Click a token to make
it the query (``tokenClicked(position)``).
"""

from __future__ import annotations

import html

import numpy as np
from attnscope.core.io.colormaps import lut, normalize
from attnscope.core.tokens import Token
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QTextBrowser


def token_html(
    tokens: list[Token], weights: np.ndarray | None = None, query: int | None = None, cmap: str = "viridis"
) -> str:
    """HTML of ``tokens``; with ``weights`` ``(n_key,)`` each token's background is its weight's colour.

    The query token is outlined; generated tokens are bold. Newlines (shown as ↵ in labels) break lines.
    """
    # Text must stay readable: shade from white towards the colour map's top colour, with a
    # square-root ramp so that small weights (most of a row) are still visible.
    top = lut(cmap)[-1].astype(float) if cmap != "viridis" else np.array([255.0, 140.0, 0.0])
    parts = []
    for i, t in enumerate(tokens):
        style = ["padding:1px", "margin:0px"]
        if weights is not None and i < len(weights):
            x = float(normalize(np.array([weights[i]]), scale="power", gamma=0.5)[0])
            r, g, b = (int(round(255 + (c - 255) * x)) for c in top)
            style += [f"background-color: rgb({r},{g},{b})", "color:#000"]
        elif i % 2:
            style.append("background-color:#eef1f6")
        if t.generated:
            style.append("font-weight:bold")
        if query is not None and i == query:
            style.append("border:2px solid #d01c1c; text-decoration: underline")
        text = html.escape(t.text).replace(" ", "&nbsp;")
        title = html.escape(
            f"#{t.position} id {t.id} raw {t.raw!r}"
            + (f" weight {weights[i]:.4f}" if weights is not None and i < len(weights) else "")
        )
        if query is not None and i == query:
            parts.append('<a name="query"></a>')  # TokenStrip scrolls here
        parts.append(
            f'<a href="tok:{t.position}" style="text-decoration:none; color:#000">'
            f'<span style="{";".join(style)}" title="{title}">{text}</span></a>'
        )
        if t.text.endswith("↵") and i < len(tokens) - 1:  # no empty line after the last token
            parts.append("<br>")
    return "<div style='font-family:monospace; font-size:11pt; line-height:160%'>" + "".join(parts) + "</div>"


class TokenStrip(QTextBrowser):
    """Read-only view of the whole sequence; see :func:`token_html`. Emits ``tokenClicked(position)``."""

    tokenClicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_anchor)
        self.setMinimumHeight(70)
        self.setPlaceholderText("Tokens appear here after Run.")
        self.n_shown = 0  # tokens shown by the last show_tokens
        self._query: int | None = None  # the query row shown (None: the newest token)
        self._follow = False  # scroll to it again on a resize or show (until the user scrolls)
        self.verticalScrollBar().sliderPressed.connect(self._stop_following)

    def show_tokens(
        self,
        tokens: list[Token],
        weights: np.ndarray | None = None,
        query: int | None = None,
        cmap: str = "viridis",
    ) -> None:
        self.n_shown = len(tokens)
        self.setHtml(token_html(tokens, weights, query, cmap))
        self._query = query
        self._follow = True
        self._scroll_to_query()

    def _scroll_to_query(self) -> None:
        """Keep the query token (by default the newest) in sight: long chat prompts fill the pane. The
        document is laid out again at the pane's width when it is first shown or resized, which
        moves the text under a scroll value set before: :meth:`resizeEvent` and :meth:`showEvent`
        scroll again (until the user scrolls), so the pane never opens half-scrolled."""
        bar = self.verticalScrollBar()
        end = self._pad_to_whole_lines()
        if self._query is not None:
            self.scrollToAnchor("query")
            bar.setValue(round(self._line_top_at_or_above(bar.value())))
        else:
            bar.setValue(end)

    def _line_tops(self) -> list[float]:
        """The top of each laid-out line of the text, in document pixels, top to bottom."""
        doc = self.document()
        layout = doc.documentLayout()
        tops = []
        block = doc.begin()
        while block.isValid():
            y0 = layout.blockBoundingRect(block).top()
            lines = block.layout()
            tops += [y0 + lines.lineAt(i).y() for i in range(lines.lineCount())]
            block = block.next()
        return tops

    def _line_top_at_or_above(self, y: float) -> float:
        return max((t for t in self._line_tops() if t <= y + 0.5), default=0.0)

    def _pad_to_whole_lines(self) -> int:
        """Pad the text's bottom so that the scroll end puts a line's top at the pane's top; return
        that scroll value. Scrolled to its end, a text of several lines (a chat-template prompt) showed
        its top line cut in half, the pane being no whole number of lines high
        (tests/app/test_map_labels_fit_gui.py)."""
        doc = self.document()
        root = doc.rootFrame()
        fmt = root.frameFormat()
        base = doc.documentMargin()
        if fmt.bottomMargin() != base:
            fmt.setBottomMargin(base)
            root.setFrameFormat(fmt)
        end = doc.size().height() - self.viewport().height()
        if end <= 0:
            return 0
        top = min((t for t in self._line_tops() if t >= end - 0.5), default=end)
        fmt.setBottomMargin(base + max(0.0, top - end))
        root.setFrameFormat(fmt)
        return round(top)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self._follow:
            self._scroll_to_query()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._follow:
            self._scroll_to_query()

    def _stop_following(self) -> None:
        self._follow = False  # the user scrolls: a resize keeps their place

    def wheelEvent(self, event) -> None:
        self._stop_following()
        super().wheelEvent(event)

    def _on_anchor(self, url) -> None:
        text = url.toString()
        if text.startswith("tok:"):
            self.tokenClicked.emit(int(text[4:]))
