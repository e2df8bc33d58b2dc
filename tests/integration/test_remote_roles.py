"""Head roles over a remote engine: ``role_table`` runs where the model is
(``@remotable``) and the window's table is the in-process one, scores and labels identical; the
wire carries string arrays (the labels) as strings, never pickled."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from attnscope.core.remote import wire  # noqa: E402
from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


def _same_table(a, b) -> None:
    assert type(a) is type(b)
    assert sorted(a.scores) == sorted(b.scores) == ["induction", "local", "previous_token", "sink"]
    for role in a.scores:
        x, y = a.scores[role], b.scores[role]
        assert x.dtype == y.dtype == np.float32 and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True), role  # bit-identical, not close
    assert a.labels.shape == b.labels.shape and a.labels.tolist() == b.labels.tolist()
    for f in ("threshold", "window", "probe_len", "n_probes", "group_size", "seq_len"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.rows() == b.rows() and a.to_json() == b.to_json()


# -- the wire: string arrays ------------------------------------------------------------------------
def test_wire_carries_string_arrays_as_strings_and_refuses_other_objects():
    labels = np.array([["sink", "mixed", "induction"], ["previous_token", "local", "mixed"]], dtype=object)
    names = np.array(["a", "bcd", ""], dtype="<U3")
    header, bufs = wire.encode({"labels": labels, "names": names, "empty": np.empty((0, 2), dtype=object)})
    assert bufs == [] and b"__str_nd__" in header
    got = wire.decode(header, bufs)
    assert got["labels"].dtype == object and got["labels"].shape == (2, 3)
    assert got["labels"].tolist() == labels.tolist()
    assert got["names"].dtype == np.dtype("<U3") and got["names"].tolist() == ["a", "bcd", ""]
    assert got["empty"].shape == (0, 2) and got["empty"].dtype == object
    with pytest.raises(ValueError, match="only strings travel"):
        wire.encode(np.array([1, "a"], dtype=object))  # an object array of anything else: refused
    with pytest.raises(ValueError, match="only strings travel"):
        wire.encode(np.array([None], dtype=object))


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"__str_nd__": ["a", 1], "dtype": "|O", "shape": [2]}', "list of strings"),
        ('{"__str_nd__": ["a"], "dtype": "|O", "shape": [2]}', "holds 1 strings"),
        ('{"__str_nd__": ["a"], "dtype": "<f4", "shape": [1]}', "bad string array"),
        ('{"__str_nd__": ["a"], "dtype": ">U1", "shape": [1]}', "bad string array"),
        ('{"__str_nd__": ["a"], "shape": [1]}', "malformed string array"),
        ('{"__str_nd__": "ab", "dtype": "|O", "shape": [2]}', "list of strings"),
    ],
)
def test_wire_refuses_malformed_string_arrays_in_one_line(body, message):
    with pytest.raises(wire.WireError, match=message):
        wire.decode(body.encode(), [])


# -- the table, remote vs in-process ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_remote_role_table_is_the_in_process_one(tmp_path, family):
    from attnscope.core.analysis.remotable import served
    from attnscope.core.analysis.roles import role_table
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    REGISTRY = served()
    assert "attnscope.core.analysis.roles.role_table" in REGISTRY
    folder = tmp_path / family
    save_tiny(family, folder, seed=3)
    prompt = "attention is all you need, and then some more attention"
    local = Session.load(str(folder), device="cpu")
    local.prefill(prompt, chat_template=False)
    local.step(2)
    want = role_table(local, window=3)
    want_no_probe = role_table(local, threshold=0.2, induction=False)
    engine = Session.load(str(folder), device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(prompt, chat_template=False)
            r.step(2)
            said = []
            got = role_table(r, window=3, progress=lambda m, f: said.append(m))
            _same_table(want, got)
            assert said == ["Induction probe 1/2", "Induction probe 2/2"]  # relayed from the engine
            assert np.isfinite(got.scores["induction"]).all()
            _same_table(want_no_probe, role_table(r, threshold=0.2, induction=False))
            assert np.isnan(role_table(r, induction=False).scores["induction"]).all()
            _same_table(want.relabel(0.1), got.relabel(0.1))  # relabelling works on this side
            with pytest.raises(ValueError, match="threshold must be in"):
                role_table(r, threshold=2.0)  # one line from the engine, which keeps serving
            _same_table(want, role_table(r, window=3))
            assert engine.ids == local.ids  # the probe ran in a separate cache on the engine
        finally:
            r.close()


@pytest.mark.slow
def test_roles_tab_on_a_remote_engine_shows_the_in_process_table(qtbot, tmp_path):
    pytest.importorskip("pytestqt")
    from attnscope.core.analysis.roles import DEFAULT_WINDOW, role_table
    from remote_window import remote_window, tiny_local_run

    prompt = "attention is all you need"
    folder, local = tiny_local_run(tmp_path, prompt)
    with remote_window(qtbot, folder, prompt) as w:
        view = w.views["roles"]
        w.show_view("roles")
        w.refresh_current_view()
        qtbot.waitUntil(lambda: view.table_data is not None, timeout=60000)
        assert w.engine.wait_idle(60) and w.last_error is None
        want = role_table(local, window=DEFAULT_WINDOW).relabel(view.threshold_spin.value())
        _same_table(want, view.table_data)
        assert view.table.rowCount() == want.n_layers * want.n_heads == 8
        w.grab().save("/work/notes/shots/h10_roles_remote.png")
