"""The model picker's worker threads: the catalog scan (config.json, safetensors and GGUF headers; metadata
only) and the per-device fits of a device map (a meta-device skeleton per row), both off the GUI thread so
the picker (:mod:`attnscope.app.model_picker`) stays responsive; a failure comes back as a value, never a
crash of the dialog.
"""

from __future__ import annotations

from collections.abc import Callable

from attnscope.core.loading.catalog_entry import CatalogEntry
from PySide6.QtCore import QThread, Signal


class ScanThread(QThread):
    done = Signal(object)  # list[CatalogEntry], or an Exception

    def __init__(self, scanner: Callable[[], list[CatalogEntry]], parent=None):
        super().__init__(parent)
        self.scanner = scanner

    def run(self) -> None:
        try:
            self.done.emit(list(self.scanner()))
        except Exception as e:  # noqa: BLE001 - shown to the user, never a crash of the dialog
            self.done.emit(e)


class DeviceFitThread(QThread):
    """Per-device fits (:func:`attnscope.core.loading.fit_devices.device_fit_entry`) of every row, off
    the GUI thread: building a skeleton imports transformers, and a GGUF's config takes seconds."""

    done = Signal(object, object)  # (generation, {row: DeviceMapFit | None})

    def __init__(self, generation: int, work: Callable[[], dict], parent=None):
        super().__init__(parent)
        self.generation, self.work = generation, work

    def run(self) -> None:
        try:
            result = self.work()
        except Exception:  # noqa: BLE001 - no per-device fit (the single-device one stays), never a crash
            result = {}
        self.done.emit(self.generation, result)
