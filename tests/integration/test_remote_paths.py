"""While the window is connected to an engine, a path on this machine is not sent there to load.

File → Open folder… and dropping a folder or .gguf name a path on the *window's* machine; the
engine would look for it on its own disk. Connected, both say so in the status bar and load
nothing (File → Open model… lists the engine's own models instead); not connected, they load.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")


class _Url:
    def __init__(self, path):
        self.path = path

    def toLocalFile(self):
        return self.path


class _Mime:
    def __init__(self, path):
        self._urls = [_Url(path)]

    def urls(self):
        return self._urls


class _Drop:
    def __init__(self, path):
        self._mime = _Mime(path)

    def mimeData(self):
        return self._mime


@pytest.fixture
def window(qtbot, monkeypatch):
    from attnscope.app.main_window import MainWindow

    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    loads = []
    monkeypatch.setattr(w.commands, "load_model", loads.append)
    return w, loads


@pytest.mark.parametrize("action", ["drop", "open_folder"])
def test_connected_window_refuses_a_local_path_in_one_line(window, monkeypatch, action):
    from attnscope.app import main_window, remote_picker

    w, loads = window
    monkeypatch.setattr(remote_picker, "is_remote", lambda session: True)
    opened = []
    monkeypatch.setattr(main_window.QFileDialog, "getExistingDirectory", lambda *a: opened.append(a) or "/x")
    if action == "drop":
        w.dropEvent(_Drop("/home/me/models/llama"))
    else:
        w.open_folder_dialog()
    assert loads == [] and opened == []  # nothing loaded, no dialog shown
    assert w.statusBar().currentMessage() == main_window.REMOTE_PATH_REFUSAL
    assert "\n" not in main_window.REMOTE_PATH_REFUSAL


def test_not_connected_a_drop_loads_the_path(window):
    w, loads = window
    w.dropEvent(_Drop("/home/me/models/llama"))
    assert loads == ["/home/me/models/llama"]
