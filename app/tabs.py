"""The window's tab widget: pages that scroll, and the overlay that covers a page until a prompt ran."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QComboBox, QFrame, QLabel, QScrollArea, QTabWidget, QVBoxLayout, QWidget


class PageLayout(QVBoxLayout):
    """A view's top layout that fills its tab page: it reports no height-for-width, so the page (a
    resizable QScrollArea) gives the view the page's height, not the preferred height its word-wrapped
    labels would ask for (Qt's QScrollArea sizes a height-for-width widget by ``heightForWidth``, from
    size hints: a view taller than the page, that scrolls). Inside, wrapped labels still get the
    lines they need; the page scrolls only below the view's minimum size."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt's name)
        return False


class ViewPage(QScrollArea):
    """A tab page that scrolls its view when the window is smaller than the view's minimum size."""


class FollowsPage:
    """Mixin (before ``QWidget`` in the bases) for a view shown in a scrolling tab page
    (:class:`ViewPage`) that fits itself to the page's visible size: :meth:`fit_to_page` runs when the
    view is shown and whenever the page's viewport (:attr:`_page_viewport`, the view's parent once shown;
    None before) is resized (:meth:`page_resized`)."""

    _page_viewport: QWidget | None = None

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)  # type: ignore[misc]
        holder = self.parentWidget()  # type: ignore[attr-defined]
        if holder is not self._page_viewport and isinstance(holder, QWidget):
            if self._page_viewport is not None:
                self._page_viewport.removeEventFilter(self)  # type: ignore[arg-type]
            self._page_viewport = holder
            holder.installEventFilter(self)  # type: ignore[arg-type]
        self.fit_to_page()

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        if obj is self._page_viewport and event.type() == QEvent.Type.Resize:
            self.page_resized()
        return False

    def page_resized(self) -> None:
        """The page's viewport was resized: fit now (a view may defer it)."""
        self.fit_to_page()

    def fit_to_page(self) -> None:
        """Fit the view to :attr:`_page_viewport`'s size (nothing by default)."""


class EmptyOverlay(QLabel):
    """Covers a tab page while there is no sequence (a new model, nothing run yet), so that a panel
    never shows the previous model's or prompt's results as if they were current."""

    TEXT = "Run a prompt to see this panel."

    def __init__(self, page: QWidget):
        super().__init__(self.TEXT, page)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setStyleSheet("background: rgba(255, 255, 255, 240); color: #666; font-size: 13pt;")
        page.installEventFilter(self)
        self.hide()

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.Resize:
            self.setGeometry(obj.rect())
        return False

    def set_shown(self, on: bool) -> None:
        parent = self.parentWidget()
        if on and parent is not None:
            self.setGeometry(parent.rect())
            self.raise_()
        self.setVisible(on)


class ViewTabs(QTabWidget):
    """Tabs whose pages scroll, so that no panel forces a large minimum window size.

    ``currentWidget()`` / ``setCurrentWidget()`` speak of the views themselves, not their pages.
    Views that scroll or scale by themselves (scroll areas; views with a true ``SCALES_ITSELF``, as the
    heatmap's plot) are added as they are;
    a view whose word-wrapped labels must not make its page scroll lays itself out in a
    :class:`PageLayout`.
    """

    #: the narrowest a view's combo box gets in a narrow window (its closed text elides; the list
    #: shows every item whole): rows of combos no longer make a 1000 px window's page scroll sideways
    COMBO_MIN_WIDTH = 96

    def addTab(self, widget: QWidget, title: str) -> int:  # type: ignore[override]  # no icon overload
        for combo in widget.findChildren(QComboBox):
            if combo.minimumWidth() == 0:  # a view that set its own minimum keeps it
                combo.setMinimumWidth(min(combo.sizeHint().width(), self.COMBO_MIN_WIDTH))
        page = widget
        if not (isinstance(widget, QScrollArea) or getattr(widget, "SCALES_ITSELF", False)):
            page = ViewPage()
            page.setWidgetResizable(True)
            page.setFrameShape(QFrame.Shape.NoFrame)
            page.setWidget(widget)
        return super().addTab(page, title)

    def currentWidget(self) -> QWidget | None:  # type: ignore[override]  # None with no tab, as in Qt
        w = super().currentWidget()
        return w.widget() if isinstance(w, ViewPage) else w

    def setCurrentWidget(self, widget: QWidget) -> None:
        page = self.page_of(widget)
        if page is not None:
            self.setCurrentIndex(self.indexOf(page))

    def page_of(self, widget: QWidget) -> QWidget | None:
        """The tab page holding view ``widget`` (the view itself, or its scrolling page)."""
        for i in range(self.count()):
            page = self.widget(i)
            if page is widget or (isinstance(page, ViewPage) and page.widget() is widget):
                return page
        return None
