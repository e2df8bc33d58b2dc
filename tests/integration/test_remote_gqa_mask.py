"""The GQA groups tab and the Mask tab over a remote engine: ``group_report``,
``layer_table`` and ``mask_report`` run where the model is (``@remotable``) and arrive identical
to the in-process reports, arrays bit-for-bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402

PROMPT = "attention is all you need, and then some more attention"


def _same(a, b) -> None:
    """Two report dataclasses (or tuples of arrays) equal field by field, arrays bit-identical."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b)
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
        return
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=True)
        return
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        return
    assert a == b, (a, b)  # None, ints, strings; a float32 scalar arrives as the same float


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """(local session, remote session) on the same tiny qwen3 model, same prompt and 2 steps."""
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("qwen3")
    save_tiny("qwen3", folder, seed=3)
    local = Session.load(str(folder), device="cpu")
    local.prefill(PROMPT, chat_template=False)
    local.step(2)
    engine = Session.load(str(folder), device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(PROMPT, chat_template=False)
            r.step(2)
            yield local, r
        finally:
            r.close()


def test_gqa_and_mask_are_offered_by_the_engine():

    from attnscope.core.analysis.remotable import served

    REGISTRY = served()  # what the server does at start
    for mod, fns in (("gqa", ("group_report", "layer_table")), ("maskview", ("mask_report",))):
        for fn in fns:
            assert f"attnscope.core.analysis.{mod}.{fn}" in REGISTRY


@pytest.mark.slow
def test_remote_group_report_and_layer_table_are_the_in_process_ones(sessions):
    from attnscope.core.analysis.gqa import group_report, layer_table

    local, r = sessions
    info = local.info
    assert info.group_size > 1
    for layer in range(info.n_layers):
        for kv in range(info.n_kv_heads):
            want = group_report(local, layer, kv)
            got = group_report(r, layer, kv, cancelled=lambda: False)
            _same(want, got)
            assert got.heads == tuple(info.group(kv)) and got.maps.dtype == np.float32
    # pooled maps, sampled rows, the per-layer table, an earlier n
    want = group_report(local, 1, 0, n=9, size=4, max_rows=5, all_layers=True, layer_rows=3)
    got = group_report(r, 1, 0, n=9, size=4, max_rows=5, all_layers=True, layer_rows=3)
    _same(want, got)
    assert got.pooled and got.maps.shape == (info.group_size, 4, 4) and got.rows_used == 5
    assert got.layers_within.shape == (info.n_layers,) and got.layer_rows == 3
    _same(layer_table(local, 9, 3), layer_table(r, 9, 3))
    _same(layer_table(local), layer_table(r, cancelled=lambda: False))
    with pytest.raises(IndexError, match="out of range"):
        group_report(r, info.n_layers, 0)  # one line from the engine, which keeps serving
    with pytest.raises(IndexError, match="out of range"):
        group_report(r, 0, 0, n=local.seq_len + 1)
    _same(group_report(local, 0, 0), group_report(r, 0, 0))


@pytest.mark.slow
def test_remote_mask_report_is_the_in_process_one(sessions):
    from attnscope.core.analysis.maskview import mask_report

    local, r = sessions
    info = local.info
    for step in (None, 0, 1, 2):
        for layer in range(info.n_layers):
            for head in (0, info.n_heads - 1):
                want = mask_report(local, layer, head, step)
                got = mask_report(r, layer, head, step)
                _same(want, got)
                assert got.allowed.dtype == bool and got.scores.dtype == np.float32
                assert got.window_note == want.window_note and got.formula == want.formula
    got = mask_report(r, 0, 0, 0, max_rows=4)  # prefill, only the last 4 rows
    _same(mask_report(local, 0, 0, 0, max_rows=4), got)
    assert got.kind == "prefill" and got.row_stop - got.row_start == 4
    assert np.isneginf(got.scores[~got.allowed]).all()
    np.testing.assert_allclose(got.weights.sum(axis=1), 1.0, rtol=1e-5)
    with pytest.raises(IndexError):
        mask_report(r, 0, info.n_heads, None)  # one line from the engine
    with pytest.raises(IndexError):
        mask_report(r, 0, 0, 3)
    _same(mask_report(local, 0, 0), mask_report(r, 0, 0))


@pytest.mark.slow
def test_gqa_and_mask_tabs_on_a_remote_engine_show_the_in_process_reports(qtbot, tmp_path):
    pytest.importorskip("pytestqt")
    from attnscope.core.analysis.gqa import group_report
    from attnscope.core.analysis.maskview import mask_report
    from remote_window import remote_window, tiny_local_run

    prompt = "attention is all you need"
    folder, local = tiny_local_run(tmp_path, prompt)
    with remote_window(qtbot, folder, prompt) as w:
        for key in ("gqa", "mask"):
            view = w.views[key]
            view.report = None
            w.show_view(key)
            w.refresh_current_view()
            qtbot.waitUntil(lambda v=view: v.report is not None, timeout=60000)
            assert w.engine.wait_idle(60) and w.last_error is None
            got = view.report
            if key == "gqa":
                _same(group_report(local, got.layer, got.kv_head, got.n), got)
            else:
                _same(mask_report(local, got.layer, got.head, got.step), got)
            w.grab().save(f"/work/notes/shots/h11_{key}_remote.png")
