"""The model picker: every local model (:mod:`attnscope.core.loading.catalog`), what it is, and whether it fits.

A sortable table of catalog entries (embedded default, Hugging Face cache, LM Studio, Ollama,
user-added paths) with their attention geometry, size on disk and a fit estimate
(:mod:`attnscope.core.loading.fit`) that follows the context length, backend, device and dtype chosen above it.
Unsupported models are greyed, with the reason as a tooltip and in the details pane.
Folders and GGUF files can be added with the buttons or dropped onto the dialog; they are
remembered (:func:`attnscope.core.loading.catalog.add_user_path`). The GGUF conversion cache can be listed and
cleared. Open (or a double-click) emits :attr:`ModelPickerDialog.modelChosen` with the entry's
``model_ref`` and accepts; the caller does the actual load.

With a *Device map* chosen (``auto|balanced|sequential``, as ``--device-map``) the Fit column shows
where accelerate will put the layers and what each device then holds
(:mod:`attnscope.core.loading.fit_devices`, computed off the GUI thread on a meta-device skeleton).

The scan reads metadata only (config.json, safetensors and GGUF headers), off the GUI thread;
the table shows "Scanning…" until it is back. No model math happens here: the numbers come from
core. The table's rows are :mod:`attnscope.app.model_table`, the worker threads
:mod:`attnscope.app.model_scan`, the cache dialog :mod:`attnscope.app.cache_dialog`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from attnscope.app.cache_dialog import ConvertedCacheDialog
from attnscope.app.model_scan import DeviceFitThread, ScanThread
from attnscope.app.model_table import (
    SORT_ROLE,
    CatalogModel,
    backend_refusal,
    count_label,
    cuda_available,
    esc_html,
)
from attnscope.core import backend_registry as registry
from attnscope.core.loading import catalog
from attnscope.core.loading.catalog_entry import CatalogEntry
from attnscope.core.loading.device_map import DEVICE_MAPS
from attnscope.core.loading.fit import (
    FITS,
    NO_FIT,
    TIGHT,
    FitEstimate,
    estimate_entry,
    human_bytes,
)
from attnscope.core.loading.fit_devices import DeviceMapFit, device_fit_entry, measured_free
from attnscope.core.loading.free_memory import free_memory
from attnscope.core.units import count
from PySide6.QtCore import QSortFilterProxyModel, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QTableView,
    QVBoxLayout,
)


class ModelPickerDialog(QDialog):
    """Choose a local model. ``selected_path()`` / :attr:`modelChosen` give what ``Session.load`` takes.

    Args:
        parent: the main window (or None).
        scanner: returns the entries (default :func:`attnscope.core.loading.catalog.scan`); runs on a worker thread.
        free_memory_fn: ``(backend, device) -> (free bytes | None, label)`` (default :func:`attnscope.core.loading.free_memory.free_memory`).
        context, backend, device, dtype: initial fit settings.
        scan_now: start scanning at once (tests may call :meth:`rescan` themselves).
        quantize, device_map: initial Quantise and Device map choices (``"none"``: one device).
        device_free_fn: ``() -> {0: bytes, "cpu": bytes, "disk": bytes}`` or None (default None: free
            memory as the load measures it, :func:`attnscope.core.loading.fit_devices.measured_free`).
    """

    deviceFitsFinished = Signal()

    modelChosen = Signal(str)
    scanFinished = Signal()

    def __init__(
        self,
        parent=None,
        *,
        scanner: Callable[[], list[CatalogEntry]] | None = None,
        free_memory_fn: Callable[[str, str], tuple[int | None, str]] | None = None,
        context: int = 4096,
        backend: str = registry.DEFAULT,
        device: str | None = None,
        dtype: str = "auto",
        scan_now: bool = True,
        quantize: str = "none",
        device_map: str | None = "none",
        device_free_fn: Callable[[], dict | None] | None = None,
    ):
        super().__init__(parent)
        from attnscope.app.engine import collect_garbage_on_gui_thread

        collect_garbage_on_gui_thread()  # the scan runs Python on a QThread
        self.setWindowTitle("Open model")
        self.setAcceptDrops(True)
        self.resize(1320, 560)
        self.scanner = scanner or catalog.scan
        self.free_memory_fn = free_memory_fn or free_memory
        self._thread: ScanThread | None = None
        self._free: dict[tuple[str, str], tuple[int | None, str]] = {}
        self._selected: str | None = None
        self._pending_select: str | None = None
        self.device_free_fn = device_free_fn
        self._dm_thread: DeviceFitThread | None = None
        self._dm_generation = 0
        self._dm_stale: list[DeviceFitThread] = []  # superseded threads still finishing
        self._device_free: dict | None = None  # free bytes per device for the Device map fits
        self._build(context, backend, device, dtype)
        self.quantize.setCurrentText(quantize)
        self.device_map.setCurrentText(device_map or "none")
        if scan_now:
            self.rescan()

    # -- layout --------------------------------------------------------------------------------------
    def _build(self, context: int, backend: str, device: str | None, dtype: str) -> None:
        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name, source or architecture…")
        self.filter.setClearButtonEnabled(True)
        top.addWidget(self.filter, 2)
        top.addSpacing(12)
        top.addWidget(QLabel("Context"))
        self.context = QSpinBox()
        self.context.setRange(1, 1 << 21)
        self.context.setSingleStep(1024)
        self.context.setSuffix(" tokens")
        self.context.setGroupSeparatorShown(True)
        self.context.setValue(context)
        self.context.setToolTip(
            "Tokens the fit estimate counts for the KV cache and capture buffers "
            "(capped at each model's max context)"
        )
        top.addWidget(self.context)
        top.addWidget(QLabel("Backend"))
        self.backend = QComboBox()
        self.backend.addItems(registry.names())
        self.backend.setCurrentText(backend)
        top.addWidget(self.backend)
        top.addWidget(QLabel("Device"))
        self.device = QComboBox()
        self.device.addItem("cpu")
        if cuda_available():
            self.device.addItem("cuda")
        if device and self.device.findText(device) < 0:
            self.device.addItem(device)
        self.device.setCurrentText(device or ("cuda" if self.device.findText("cuda") >= 0 else "cpu"))
        top.addWidget(self.device)
        top.addWidget(QLabel("dtype"))
        self.dtype = QComboBox()
        self.dtype.addItems(["auto", "float32", "bfloat16", "float16"])
        self.dtype.setCurrentText(dtype)
        self.dtype.setToolTip(
            "Load precision: auto is each checkpoint's own (float32 where this device has no fast "
            "bf16/fp16 matmul and float32 fits), shown per model under 'Loads at'; GGUF files are "
            "converted straight to it"
        )
        top.addWidget(self.dtype)
        top.addWidget(QLabel("Quantise"))
        self.quantize = (
            QComboBox()
        )  # attnscope.core.loading.quantize: weight-only int8/int4 of the linear layers after loading
        self.quantize.addItems(["none", "int8", "int4"])
        self.quantize.setToolTip(
            "Weight-only quantisation of the linear layers (torchao; MLX: mlx.nn.quantize): "
            "int8 ≈ half of bf16 weights, int4 ≈ a quarter and runs at bfloat16. Attention is "
            "unchanged, so the captured weights stay exact for the model that runs"
        )
        top.addWidget(self.quantize)
        top.addWidget(QLabel("Device map"))
        self.device_map = QComboBox()  # attnscope.core.loading.device_map: --device-map through accelerate
        self.device_map.addItems(["none", *DEVICE_MAPS])
        self.device_map.setToolTip(
            "Spread the layers over several devices with accelerate, as --device-map does: auto and "
            "balanced spread them evenly over the GPUs, sequential fills GPU 0 first; what is left "
            "goes to the CPU, then to disk (offloaded layers are copied in for each forward, so "
            "slower, and exact all the same). The Fit column then shows what each device holds. "
            "none: the whole model on the Device above. Torch only"
        )
        top.addWidget(self.device_map)
        lay.addLayout(top)

        self.model = CatalogModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.proxy.setFilterKeyColumn(-1)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(1, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(
            0, QHeaderView.ResizeMode.Stretch
        )  # long names elide in the middle, the tail is the quant
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        lay.addWidget(self.table, 1)

        self.status = QLabel("Scanning…")
        lay.addWidget(self.status)
        self.details = QLabel()
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setMinimumHeight(64)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.details.setStyleSheet(
            "QLabel { background: palette(base); border: 1px solid palette(mid); padding: 6px; }"
        )
        lay.addWidget(self.details)

        row = QHBoxLayout()
        self.add_folder_btn = QPushButton("Add folder…")
        self.add_gguf_btn = QPushButton("Add .gguf…")
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setToolTip("Forget a model you added (the files stay on disk)")
        self.rescan_btn = QPushButton("Rescan")
        self.cache_btn = QPushButton("Converted cache…")
        for b in (self.add_folder_btn, self.add_gguf_btn, self.remove_btn, self.rescan_btn, self.cache_btn):
            row.addWidget(b)
        row.addStretch(1)
        hint = self.drop_hint = QLabel("or drop a folder / .gguf here")
        hint.setStyleSheet("color: gray")
        row.addWidget(hint)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel
        )
        self.open_btn = self.buttons.button(QDialogButtonBox.StandardButton.Open)
        row.addWidget(self.buttons)
        lay.addLayout(row)

        self.filter.textChanged.connect(self.proxy.setFilterFixedString)
        self.context.valueChanged.connect(self.update_fits)
        self.backend.currentTextChanged.connect(self.update_fits)
        self.device.currentTextChanged.connect(self.update_fits)
        self.dtype.currentTextChanged.connect(self.update_fits)
        self.quantize.currentTextChanged.connect(self.update_fits)
        self.device_map.currentTextChanged.connect(self.update_fits)
        self.table.selectionModel().selectionChanged.connect(self._on_selection)
        self.table.doubleClicked.connect(self._on_double_click)
        self.add_folder_btn.clicked.connect(self._add_folder)
        self.add_gguf_btn.clicked.connect(self._add_gguf)
        self.remove_btn.clicked.connect(self._remove)
        self.rescan_btn.clicked.connect(lambda: self.rescan(remeasure=True))
        self.cache_btn.clicked.connect(self.show_cache)
        self.buttons.accepted.connect(self._open)
        self.buttons.rejected.connect(self.reject)
        self._on_selection()

    # -- scanning ------------------------------------------------------------------------------------
    def rescan(self, remeasure: bool = False, select: str | None = None) -> None:
        """Scan all sources on a worker thread; the table refills when it is done (:attr:`scanFinished`)."""
        if remeasure:
            self._free.clear()
            self._device_free = None
        self._pending_select = select or self._selected
        if self._thread is not None and self._thread.isRunning():
            return
        self.status.setText("Scanning…")
        self.rescan_btn.setEnabled(False)
        self._thread = ScanThread(self.scanner, self)
        self._thread.done.connect(self._on_scanned)
        self._thread.start()

    def _on_scanned(self, result) -> None:
        if self._thread is not None:
            self._thread.wait()
        self.rescan_btn.setEnabled(True)
        if isinstance(result, Exception):
            self.status.setText(f"Scanning failed: {result}")
            self.model.set_entries([], [])
        else:
            self.model.set_entries(result, self._fits(result))
            self._start_device_fits()
            self._update_status()
            if not (self._pending_select and self.select(self._pending_select)):
                first = next((e.model_ref for e in result if e.supported), None)
                if first is not None:
                    self.select(first)
        self.scanFinished.emit()

    # -- fit -----------------------------------------------------------------------------------------
    def fit_settings(self) -> tuple[int, str, str, str]:
        return (
            self.context.value(),
            self.backend.currentText(),
            self.device.currentText(),
            self.dtype.currentText(),
        )

    def _quantize_choice(self) -> str:
        q = getattr(self, "quantize", None)  # built after the fit settings' widgets
        return q.currentText() if q is not None else "none"

    def device_map_choice(self) -> str:
        """The Device map the load will use: ``"none"`` (one device), or a strategy; always
        ``"none"`` on MLX (accelerate's device maps are torch's)."""
        dm = getattr(self, "device_map", None)  # built after the fit settings' widgets
        if dm is None or not registry.get(self.backend.currentText()).takes_device_map:
            return "none"
        return dm.currentText()

    def _start_device_fits(self) -> None:
        """Recompute the per-device fits for the current settings on a worker thread; a newer
        request supersedes a running one (its result is dropped)."""
        dm = self.device_map_choice()
        self.device_map.setEnabled(registry.get(self.backend.currentText()).takes_device_map)
        self._dm_generation += 1
        if dm == "none" or getattr(self, "remote_engine", None) is not None or not self.model.entries:
            # one device, or an engine's models (this machine's memory says nothing about its devices)
            self.model.set_device_fits("none", {})
            return
        self.model.set_device_fits(dm, {})  # "placing layers…" until the thread is back
        entries = list(self.model.entries)
        ctx, _backend, _device, dtype = self.fit_settings()
        quantize = self._quantize_choice()
        free_fn = self.device_free_fn or measured_free
        known = self._device_free  # measured once per dialog (Rescan measures again)

        def work() -> dict:
            free = known if known is not None else free_fn()
            self._device_free = free
            return {
                r: device_fit_entry(e, dm, ctx, dtype, quantize, free=free)
                for r, e in enumerate(entries)
                if e.supported and e.n_layers
            } | {r: None for r, e in enumerate(entries) if not (e.supported and e.n_layers)}

        old = self._dm_thread
        if old is not None and old.isRunning():
            self._dm_stale.append(old)  # kept referenced until it finishes; its result is dropped
        t = DeviceFitThread(self._dm_generation, work, self)
        t.done.connect(self._on_device_fits)
        t.finished.connect(lambda t=t: self._dm_stale.remove(t) if t in self._dm_stale else None)
        self._dm_thread = t
        t.start()

    def _on_device_fits(self, generation: int, fits: dict) -> None:
        if generation != self._dm_generation:
            return  # superseded by a newer choice
        self.model.set_device_fits(self.device_map_choice(), fits)
        self._on_selection()
        self.deviceFitsFinished.emit()

    def _free_memory(self, backend: str, device: str) -> tuple[int | None, str]:
        key = (backend, device)
        if key not in self._free:
            self._free[key] = self.free_memory_fn(backend, device)
        return self._free[key]

    def _fits(self, entries: list[CatalogEntry]) -> list[FitEstimate | None]:
        ctx, backend, device, dtype = self.fit_settings()
        self.model.backend = backend
        free, label = self._free_memory(backend, device)
        return [
            estimate_entry(
                e,
                ctx,
                backend,
                device,
                dtype,
                free_bytes=free,
                memory=label,
                quantize=self._quantize_choice(),
            )
            if e.supported and e.n_layers
            else None
            for e in entries
        ]

    def update_fits(self, *_args) -> None:
        """Recompute the Fit column for the current context / backend / device / dtype."""
        self.model.set_fits(self._fits(self.model.entries))
        self._start_device_fits()
        self._update_status()
        self._on_selection()

    def _update_status(self) -> None:
        entries = self.model.entries
        ctx, backend, device, dtype = self.fit_settings()
        free, label = self._free_memory(backend, device)
        n_bad = sum(not e.supported for e in entries)
        bad = f" ({n_bad} not supported: hover for why)" if n_bad else ""
        dm = self.device_map_choice()
        where = (
            f"{backend} on {device}: {human_bytes(free)} free {label}"
            if dm == "none"
            else f"{backend}, device map {dm}: per device, where accelerate places the layers (hover Fit)"
        )
        self.status.setText(f"{len(entries)} model(s){bad}. Fit at {ctx:,} tokens, {dtype}, {where}.")

    # -- selection -----------------------------------------------------------------------------------
    def _entry_at(self, proxy_index) -> tuple[CatalogEntry, FitEstimate | None] | None:
        if not proxy_index.isValid():
            return None
        r = self.proxy.mapToSource(proxy_index).row()
        return self.model.entries[r], (self.model.fits[r] if r < len(self.model.fits) else None)

    def selected_entry(self) -> CatalogEntry | None:
        rows = self.table.selectionModel().selectedRows()
        got = self._entry_at(rows[0]) if rows else None
        return got[0] if got else None

    def selected_path(self) -> str | None:
        """What to pass to ``Session.load`` for the chosen model (``"default"`` for the embedded one)."""
        e = self.selected_entry()
        return e.model_ref if e is not None and e.supported and not self.backend_refusal(e) else None

    def backend_refusal(self, e: CatalogEntry) -> str | None:
        """Why the backend chosen above cannot open ``e`` (window wording), or None."""
        return backend_refusal(e, self.backend.currentText())

    def select(self, model_ref: str) -> bool:
        """Select the row whose ``model_ref`` (or path) is ``model_ref``; False if there is none."""
        for r, e in enumerate(self.model.entries):
            if e.model_ref == model_ref or str(e.path) == model_ref:
                idx = self.proxy.mapFromSource(self.model.index(r, 0))
                if idx.isValid():
                    self.table.selectRow(idx.row())
                    self.table.scrollTo(idx)
                    return True
        return False

    def _on_selection(self, *_args) -> None:
        rows = self.table.selectionModel().selectedRows()
        got = self._entry_at(rows[0]) if rows else None
        if got is None:
            self.details.setText("Choose a model to see where it is and what loading it will take.")
            self.open_btn.setEnabled(False)
            self.remove_btn.setEnabled(False)
            return
        e, f = got
        self._selected = e.model_ref
        refusal = self.backend_refusal(e)
        self.open_btn.setEnabled(e.supported and refusal is None)
        self.remove_btn.setEnabled(
            self._user_path_of(e) is not None and getattr(self, "remote_engine", None) is None
        )
        r = self.proxy.mapToSource(rows[0]).row()
        text = self.describe(e, f, self.model.device_fit(r))
        if self.model.device_map != "none" and r not in self.model.device_fits and e.supported:
            text += f"<br>Device map {self.model.device_map}: placing the layers…"
        if e.supported and refusal:
            text += f"<br><span style='color:#b00020'><b>Cannot open here:</b> {esc_html(refusal)}</span>"
        self.details.setText(text)

    @staticmethod
    def describe(e: CatalogEntry, f: FitEstimate | None, d: DeviceMapFit | None = None) -> str:
        """Rich text for the details pane (``d``: the per-device fit under a device map)."""
        head = f"<b>{esc_html(e.name)}</b> &nbsp;<span style='color:gray'>{esc_html(str(e.path))}</span><br>"
        if e.note:  # what is incomplete or left out beside it (catalog.CatalogEntry.note)
            head += f"<span style='color:#a06000'>Note: {esc_html(e.note)}</span><br>"
        if not e.supported:
            return head + f"<span style='color:#b00020'>Not supported: {esc_html(e.reason)}</span>"
        geo = (
            f"{e.architecture}, {count_label(e.n_params)} parameters, {count(e.n_layers, 'layer')}, "
            f"{count(e.n_heads, 'query head')} sharing {count(e.n_kv_heads, 'KV head')} "
            f"(GQA group of {e.group_size}), head_dim {e.head_dim}, "
            f"max context {e.max_context:,}"
            + (f", sliding window {e.sliding_window}" if e.sliding_window else "")
            + f"; {e.dtype}, {human_bytes(e.size_bytes)} on disk."
            + (f"<br>Attention: {esc_html(e.attention_kind)}." if e.attention_kind else "")
            + (
                f" Every expert is loaded ({e.n_experts} per MoE layer); {e.experts_active} run per token."
                if e.n_experts and e.experts_active
                else ""
            )
            + (
                "<br>Multimodal checkpoint: vision tower not loaded: text prompts only (images as input are "
                "not supported); the parameters and the fit count the language model alone."
                if e.text_only
                else ""
            )
        )
        if f is None:
            return head + geo
        colour = {FITS: "#1b7a1b", TIGHT: "#a06000", NO_FIT: "#b00020"}.get(f.verdict, "gray")
        free = (
            f"{human_bytes(f.free_bytes)} free {f.memory}"
            if f.free_bytes is not None
            else f"free {f.memory} unknown"
        )
        conv = f" (converted to {f.dtype})" if e.format == "gguf" else f" at {f.dtype}"
        if f.quantize not in ("", "none"):
            conv += f", linear layers {f.quantize}"
        runtime = f" + runtime {human_bytes(f.runtime_bytes)}" if f.runtime_bytes else ""
        fit = (
            f"<br><span style='color:{colour}'><b>{f.verdict}</b></span> at {f.context:,} tokens: weights "
            f"{human_bytes(f.weights_bytes)}{conv} + KV cache {human_bytes(f.kv_cache_bytes)} + capture "
            f"{human_bytes(f.capture_bytes)}{runtime} = <b>{human_bytes(f.total_bytes)}</b> of {free}."
        )
        if f.load_copy_bytes:  # core.loading.fit.LOAD_COPY: the peak is the load's, counted in the total
            fit += (
                f" While loading, the {html.escape(e.checkpoint_dtype)} file's "
                f"{human_bytes(f.load_copy_bytes)} stay mapped beside the {f.dtype} copy."
            )
        why = f"<br>Loads at {html.escape(f.dtype_reason)}." if f.dtype_reason else ""
        if d is not None:
            colour = {FITS: "#1b7a1b", TIGHT: "#a06000", NO_FIT: "#b00020"}.get(d.verdict, "gray")
            fit = (
                f"<br>Device map <b>{esc_html(d.strategy)}</b>: <span style='color:{colour}'><b>{d.verdict}</b></span>"
                f" at {d.context:,} tokens: <b>{esc_html(d.label())}</b>"
                "<br><span style='color:gray'>"
                + "; ".join(esc_html(line) for line in d.summary().splitlines())
                + "</span>"
            )
        return head + geo + fit + why

    def _on_double_click(self, index) -> None:
        got = self._entry_at(index)
        if got is not None and got[0].supported and self.backend_refusal(got[0]) is None:
            self.table.selectRow(index.row())
            self._open()

    def _open(self) -> None:
        ref = self.selected_path()
        if ref is None:
            return
        self.modelChosen.emit(ref)
        self.accept()

    # -- user paths ------------------------------------------------------------------------------------
    @staticmethod
    def _user_path_of(e: CatalogEntry) -> Path | None:
        """The user-added path that brought ``e`` in (itself, or a library folder above it)."""
        for p in catalog.user_paths():
            if e.path == p or p in e.path.parents:
                return p
        return None

    def add_path(self, path: str | Path) -> bool:
        """Remember ``path`` (folder or GGUF), rescan, and select it. Shows the reason and returns False if refused."""
        try:
            p = catalog.add_user_path(path)
        except (OSError, ValueError) as e:
            self._warn(str(e))
            return False
        self.rescan(select=str(p))
        return True

    def _add_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "Add a model folder (or a folder of models)", str(Path.home())
        )
        if path:
            self.add_path(path)

    def _add_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Add a GGUF model", str(Path.home()), "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.add_path(path)

    def _remove(self) -> None:
        e = self.selected_entry()
        p = self._user_path_of(e) if e is not None else None
        if p is not None:
            catalog.remove_user_path(p)
            self._selected = None
            self.rescan()

    def show_cache(self) -> ConvertedCacheDialog:
        dlg = ConvertedCacheDialog(self)
        dlg.open()
        return dlg

    def _warn(self, message: str) -> None:
        self.status.setText(message)

        if QApplication.platformName() not in ("offscreen", "minimal"):
            QMessageBox.warning(self, "Open model", message)

    # -- drag and drop ---------------------------------------------------------------------------------
    @staticmethod
    def _dropped_path(mime) -> Path | None:
        urls = mime.urls() if mime.hasUrls() else []
        if len(urls) != 1 or not urls[0].isLocalFile():
            return None
        p = Path(urls[0].toLocalFile())
        from attnscope.core.loading.gguf_meta import is_gguf_file

        return p if (p.is_dir() or p.suffix.lower() == ".gguf" or is_gguf_file(p)) else None

    def dragEnterEvent(self, e) -> None:
        if self._dropped_path(e.mimeData()) is not None:
            e.acceptProposedAction()

    def dropEvent(self, e) -> None:
        p = self._dropped_path(e.mimeData())
        if p is not None:
            e.acceptProposedAction()
            self.add_path(p)

    # -- closing -----------------------------------------------------------------------------------------
    def done(self, result: int) -> None:
        for t in [self._dm_thread, *self._dm_stale]:
            if t is not None and t.isRunning():  # as the scan below: the application owns it until it ends
                t.done.disconnect(self._on_device_fits)
                t.setParent(QApplication.instance())
                t.finished.connect(t.deleteLater)
        self._dm_thread, self._dm_stale = None, []
        scan = self._thread
        if scan is not None and scan.isRunning():
            # Close now; the scan finishes in the background and its result is dropped. The
            # application owns the thread until then (a QThread deleted while running aborts).
            scan.done.disconnect(self._on_scanned)
            scan.setParent(QApplication.instance())
            scan.finished.connect(scan.deleteLater)
            self._thread = None
        super().done(result)


def main() -> int:  # pragma: no cover - manual check: python -m attnscope.app.model_picker
    import sys

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    dlg = ModelPickerDialog(None)
    dlg.modelChosen.connect(lambda ref: print(ref))
    dlg.show()
    return app.exec()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
