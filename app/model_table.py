"""The model picker's table: catalog entries (:mod:`attnscope.core.loading.catalog`) as sortable rows, with
their attention geometry, size on disk and the fit estimate (:mod:`attnscope.core.loading.fit`) the picker
(:mod:`attnscope.app.model_picker`) computes for the chosen context, backend, device and dtype.

Unsupported rows stay selectable (greyed, the reason as a tooltip); with a device map the Fit cell's tooltip
says what each device holds (:mod:`attnscope.core.loading.fit_devices`). Also the cell wording the details
pane shares: :func:`count_label`, :func:`loads_at_label`, :func:`backend_refusal`.
"""

from __future__ import annotations

from attnscope.core import backend_registry as registry
from attnscope.core.loading import catalog
from attnscope.core.loading.catalog_entry import CatalogEntry
from attnscope.core.loading.fit import (
    FITS,
    NO_FIT,
    TIGHT,
    FitEstimate,
    human_bytes,
)
from attnscope.core.loading.fit_devices import DeviceMapFit
from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QBrush, QColor, QFont

COLUMNS = [
    "Name",
    "Source",
    "Architecture",
    "Params",
    "Layers",
    "Attention",
    "head_dim",
    "Max context",
    "dtype / quant",
    "Loads at",
    "Size",
    "Fit",
]
FIT_COLUMN = COLUMNS.index("Fit")
LOADS_AT_COLUMN = COLUMNS.index(
    "Loads at"
)  # the precision it loads at (attnscope.core.loading.precision; follows the dtype box)
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
GREY = QColor(150, 150, 150)
FIT_COLOURS = {FITS: QColor(200, 235, 200), TIGHT: QColor(250, 225, 160), NO_FIT: QColor(245, 190, 190)}
SOURCE_LABELS = {
    "embedded": "embedded",
    "hf-cache": "HF cache",
    "lmstudio": "LM Studio",
    "ollama": "Ollama",
    "user": "added",
}


def loads_at_label(f: FitEstimate | None) -> str:
    """The *Loads at* cell: the load dtype, and the quantisation of the linear layers when asked
    (``"bfloat16 + int8"``); ``"—"`` without an estimate."""
    if f is None:
        return "—"
    return f.dtype if f.quantize in ("", "none") else f"{f.dtype} + {f.quantize}"


def device_map_tooltip(d: DeviceMapFit) -> str:
    """The Fit cell's tooltip under a device map: the strategy, then one line per device."""
    how = {
        "auto": "auto (as balanced: the layers spread evenly over the GPUs, then CPU, then disk)",
        "balanced": "balanced (the layers spread evenly over the GPUs, then CPU, then disk)",
        "sequential": "sequential (GPU 0 filled first, then the next, then CPU, then disk)",
    }.get(d.strategy, d.strategy)
    return (
        f"Device map {how}, computed by accelerate on the model's skeleton at {d.dtype}"
        f"{'' if d.quantize in ('', 'none') else f' + {d.quantize}'}, {d.context:,} tokens:\n"
        + d.summary()
        + "\nKV cache and capture sit on the device each layer runs on (an offloaded layer runs on the "
        "first GPU, or the CPU without one)."
    )


def count_label(n: int) -> str:
    """``134515008`` → ``'134.5M'``."""
    if not n:
        return "?"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return False


BACKEND_LABELS = registry.labels()


def backend_refusal(e: CatalogEntry, backend: str) -> str | None:
    """Why ``backend`` cannot open the supported entry ``e``, in the window's words (the menu to use,
    not a flag), or None (:meth:`attnscope.core.loading.catalog_entry.CatalogEntry.problem_on`: its family,
    or this very file, e.g. an mlx-lm quantised folder on torch)."""
    problem = e.problem_on(backend) if e.supported else None
    if problem is None:
        return None
    others = [b for b in registry.names() if b != backend and e.problem_on(b) is None]
    where = (
        f" Choose {BACKEND_LABELS.get(others[0], others[0])} under Backend above to open it."
        if others
        else ""
    )
    return f"{problem[0].upper()}{problem[1:]}.{where}"


class CatalogModel(QAbstractTableModel):
    """Catalog entries as table rows; the Fit column comes from :meth:`set_fits`."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.entries: list[CatalogEntry] = []
        self.fits: list[FitEstimate | None] = []
        self.backend = registry.DEFAULT  # the backend the Fit column is for (a family it cannot run says so)
        self.device_map = "none"  # the Device map choice the Fit column is for ("none": one device)
        self.device_fits: dict[int, DeviceMapFit | None] = {}  # row -> per-device fit (absent: pending)

    def set_device_fits(self, device_map: str, fits: dict[int, DeviceMapFit | None]) -> None:
        """Per-device fits for ``device_map`` (row -> fit; None where the config cannot be read)."""
        self.device_map, self.device_fits = device_map, dict(fits)
        if self.entries:
            self.dataChanged.emit(self.index(0, FIT_COLUMN), self.index(len(self.entries) - 1, FIT_COLUMN))

    def device_fit(self, row: int) -> DeviceMapFit | None:
        return self.device_fits.get(row) if self.device_map != "none" else None

    def set_entries(self, entries: list[CatalogEntry], fits: list[FitEstimate | None]) -> None:
        self.beginResetModel()
        self.entries, self.fits = list(entries), list(fits)
        self.endResetModel()

    def set_fits(self, fits: list[FitEstimate | None]) -> None:
        self.fits = list(fits)
        if self.entries:
            self.dataChanged.emit(
                self.index(0, LOADS_AT_COLUMN), self.index(len(self.entries) - 1, FIT_COLUMN)
            )

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.entries)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if (
            orientation == Qt.Orientation.Horizontal
            and role == Qt.ItemDataRole.ToolTipRole
            and section == FIT_COLUMN
        ):
            return (
                "weights (at the Quantise choice) + KV cache + capture buffers at the chosen context "
                "+ the runtime, against free memory now; with a Device map, what each device holds "
                "(cuda:0 · cuda:1 · cpu · disk) where accelerate places the layers"
            )
        return None

    def _cell(self, e: CatalogEntry, f: FitEstimate | None, col: int):
        """(display text, sort key) of one cell."""
        if col == 0:
            return e.name, e.name.lower()
        if col == 1:
            return SOURCE_LABELS.get(e.source, e.source), catalog.SOURCES.index(
                e.source
            ) if e.source in catalog.SOURCES else 9
        if (
            col == 2
        ):  # a multimodal checkpoint loads its language model alone (attnscope.core.loading.text_only)
            return (e.architecture or "?") + (" · text only" if e.text_only else ""), e.architecture
        if col == 3:
            return count_label(e.n_params), e.n_params
        if col == 4:
            return str(e.n_layers or "?"), e.n_layers
        if (
            col == 5
        ):  # the attention kind (attnscope.core.loading.attention_kind): "GQA 32/8 · 128 experts, 8 active"
            heads = f"{e.n_heads} / {e.n_kv_heads} ({e.group_size})" if e.n_heads else "?"
            return (e.attention_kind or heads), (
                e.group_size,
                e.n_heads,
            )
        if col == 6:
            return str(e.head_dim or "?"), e.head_dim
        if col == 7:
            return (f"{e.max_context:,}" if e.max_context else "?"), e.max_context
        if col == 8:
            return e.dtype, e.dtype
        if col == LOADS_AT_COLUMN:
            return loads_at_label(f), (f.dtype if f is not None else "")
        if col == 10:  # what the loader would read: nothing for a folder it cannot load ("0 B" read as empty)
            if not e.size_bytes:
                return ("—" if not e.supported else "?"), -1
            return human_bytes(e.size_bytes), e.size_bytes
        if not e.supported:
            return "unsupported", float("inf")
        if e.problem_on(self.backend):
            return f"not on {BACKEND_LABELS.get(self.backend, self.backend)}", float("inf")
        if self.device_map != "none":
            row = self.entries.index(e) if e in self.entries else -1
            if row not in self.device_fits:
                return "placing layers…", 0
            d = self.device_fits[row]
            if d is not None and d.problem:  # the load will refuse it (hover: why)
                return f"refused · Quantise {d.quantize} needs one device", float("inf")
            if d is not None:
                return f"{d.verdict} · {d.label()}", d.total_bytes
        if f is None:
            return "…", 0
        return f"{f.verdict} · {human_bytes(f.total_bytes)}", f.total_bytes

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        e = self.entries[index.row()]
        f = self.fits[index.row()] if index.row() < len(self.fits) else None
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._cell(e, f, col)[0]
        if role == SORT_ROLE:
            key = self._cell(e, f, col)[1]
            # Qt compares sort keys as QVariants: pass numbers as floats (a Python int above 2**31, such as
            # 70e9 parameters, is not a comparable QVariant in PySide6 6.11) and tuples as one number.
            if isinstance(key, tuple):
                return float(key[0] or 0) * 1e6 + float(key[1] or 0)
            if isinstance(key, bool) or key is None:
                return -1.0 if key is None else float(key)
            return float(key) if isinstance(key, int | float) else key
        if role == Qt.ItemDataRole.ForegroundRole and not e.supported:
            return QBrush(GREY)
        d = self.device_fit(index.row()) if col == FIT_COLUMN else None
        verdict = d.verdict if d is not None else (f.verdict if f is not None else None)
        if (
            role == Qt.ItemDataRole.BackgroundRole
            and col == FIT_COLUMN
            and e.supported
            and verdict in FIT_COLOURS
            and not e.problem_on(self.backend)  # "not on torch" is no fit verdict
        ):
            return QBrush(FIT_COLOURS[verdict])
        if role == Qt.ItemDataRole.ToolTipRole:
            if not e.supported:
                return f"Not supported: {e.reason}"
            problem = backend_refusal(e, self.backend)
            if col == FIT_COLUMN and problem:
                return problem
            if col == FIT_COLUMN and d is not None:
                return device_map_tooltip(d)
            if col == FIT_COLUMN and f is not None:
                return f.summary()
            if col == LOADS_AT_COLUMN and f is not None and f.dtype_reason:
                return f.dtype_reason
            return f"{e.path}\n{e.note}" if e.note else str(e.path)
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (3, 4, 6, 7, 10):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.FontRole and col == 0 and e.source == "embedded":
            font = QFont()
            font.setBold(True)
            return font
        return None

    def flags(self, index):
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return (
            Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        )  # unsupported rows stay selectable to read why


def esc_html(text: str) -> str:
    """``text`` safe inside the details pane's rich text (``&``, ``<``, ``>`` escaped; quotes kept)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
