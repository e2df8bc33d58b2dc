"""``Session.load`` pauses the garbage collector only on the main thread, and leaves it as it found it:
the window collects on its GUI thread only (attnscope.app.engine) and loads on its engine thread, where
a load that switched the collector back on let it free Qt objects on that thread (a crash)."""

from __future__ import annotations

import gc
import threading

import pytest
from attnscope.core import backend_registry
from attnscope.core.session import Session


class _Stop(Exception):
    pass


@pytest.fixture()
def seen(monkeypatch):
    """The collector's state inside the backend's load (which then stops the load)."""
    states: list[bool] = []

    class Spec:
        def load(self, *args, **kwargs):
            states.append(gc.isenabled())
            raise _Stop

    monkeypatch.setattr(backend_registry, "get", lambda name: Spec())
    was = gc.isenabled()
    yield states
    gc.enable() if was else gc.disable()


def _load():
    with pytest.raises(_Stop):
        Session.load("unused", backend="torch")


@pytest.mark.parametrize("enabled", [True, False])
def test_main_thread_load_pauses_the_collector_and_restores_it(seen, enabled):
    gc.enable() if enabled else gc.disable()
    _load()
    assert seen == [False] and gc.isenabled() is enabled


@pytest.mark.parametrize("enabled", [True, False])
def test_a_load_on_another_thread_leaves_the_collector_alone(seen, enabled):
    gc.enable() if enabled else gc.disable()
    errors: list[BaseException] = []

    def run():
        try:
            _load()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not errors and seen == [enabled] and gc.isenabled() is enabled
