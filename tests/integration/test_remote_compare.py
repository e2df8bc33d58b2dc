"""Compare over a remote engine: run B is loaded, run and compared on the engine
(``attnscope.core.analysis.compare_run_b``, ``@remotable``), held there for the maps, tiles and rows, and
everything arrives identical to in-process, bit for bit; a B the engine cannot hold is one line and
the engine keeps serving."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import weakref

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from test_compare import _perturbed_copy  # noqa: E402
from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402

PROMPT = "The cat sat on the mat. The dog sat on the log."


def _same_result(want, got) -> None:
    """Two CompareResults equal field by field: arrays bit-identical, run infos and alignment equal."""
    assert type(want) is type(got)
    for f in dataclasses.fields(want):
        a, b = getattr(want, f.name), getattr(got, f.name)
        if isinstance(a, np.ndarray):
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f.name
            assert np.array_equal(a, b), f.name  # bit-identical, not close
        else:
            assert a == b, f.name
    assert want.ranked() == got.ranked() and want.to_json() == got.to_json()


def _differently_tokenized_copy(src, dst) -> None:
    """``src`` with its tokenizer's byte tokens renumbered (same weights, another tokenizer)."""
    shutil.copytree(src, dst)
    p = dst / "tokenizer.json"
    tok = json.loads(p.read_text())
    vocab = tok["model"]["vocab"]
    byte_ids = sorted(i for t, i in vocab.items() if len(t) == 1)
    flip = dict(zip(byte_ids, reversed(byte_ids), strict=True))
    tok["model"]["vocab"] = {t: flip.get(i, i) for t, i in vocab.items()}
    p.write_text(json.dumps(tok))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("base")
    save_tiny("llama", base, seed=2)
    last = tmp_path_factory.mktemp("last")
    _perturbed_copy(base, last, layer=1, head=2)
    other_tok = tmp_path_factory.mktemp("tok") / "other_tokenizer"
    _differently_tokenized_copy(base, other_tok)
    return {"base": base, "last": last, "other_tok": other_tok}


@pytest.fixture(scope="module")
def sessions(folders):
    """(local session, remote session, the engine's own session) on the same tiny llama, same
    prompt prefilled with every position's logits, 3 decode steps."""
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    local = Session.load(str(folders["base"]), device="cpu")
    local.prefill(PROMPT, chat_template=False, all_logits=True)
    local.step(3)
    engine = Session.load(str(folders["base"]), device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(PROMPT, chat_template=False, all_logits=True)
            r.step(3)
            assert r.ids == local.ids
            yield local, r, engine, server
        finally:
            r.close()


def test_compare_b_is_offered_by_the_engine():
    from attnscope.core.analysis.remotable import served

    REGISTRY = served()
    for fn in ("run_b", "b_maps", "b_overview", "kept_all_logits"):
        assert f"attnscope.core.analysis.compare_run_b.{fn}" in REGISTRY


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, weighting, prompt_b",
    [
        ("model", "attention", PROMPT),  # another checkpoint sharing the tokenizer
        ("dtype", "attention", PROMPT),  # the same model at bfloat16
        ("prompt", "value-weighted", "The dog sat on the mat. The cat sat on the log."),
    ],
)
def test_remote_compare_is_the_in_process_one(sessions, folders, kind, weighting, prompt_b):
    from attnscope.core.analysis import compare_run_b as compare_b
    from attnscope.core.analysis.compare_run_b import b_maps, b_overview, held, kept_all_logits, run_b

    local, r, engine, server = sessions
    model = str(folders["last"]) if kind == "model" else None
    dtype = "bfloat16" if kind == "dtype" else "float32"
    assert kept_all_logits(local) and kept_all_logits(r)
    want, la, lb = run_b(local, kind, model, "torch", dtype, prompt_b, weighting)
    said = []
    got, ga, gb = run_b(
        r, kind, model, "torch", dtype, prompt_b, weighting, progress=lambda m, f: said.append(m)
    )
    _same_result(want, got)
    assert (la, lb) == (list(ga), list(gb)) and len(ga) == local.seq_len
    assert said[0] == "Loading run B (torch, float32)…".replace("float32", dtype)
    assert said[-1] == f"Comparing heads {local.info.n_layers * local.info.n_heads}/8…"  # relayed
    n = got.alignment.n
    assert got.alignment.n == local.seq_len and len(got.kl) == n  # A's decode fed to B, logits kept
    if kind == "model":
        assert (got.ranked()[0].layer, got.ranked()[0].head) == (1, 2)
        assert got.run_b.source == str(folders["last"]) and got.run_a.source == str(folders["base"])
    if kind == "prompt":
        assert got.alignment.first_difference is not None and got.weighting == "value-weighted"
    # B is held on the engine, one per session, and the maps, a tile and a row come from there
    held(engine)
    assert engine in compare_b._HELD and r not in compare_b._HELD
    for layer, head in ((1, 2), (0, 3)):
        wa, wb = b_maps(local, layer, head, n, weighting=weighting)
        ra, rb = b_maps(r, layer, head, n, weighting=weighting)
        assert ra.dtype == np.float32 and np.array_equal(wa, ra) and np.array_equal(wb, rb)
        tile = dict(rows=slice(3, 11), cols=slice(2, 9), weighting=weighting)
        assert all(
            np.array_equal(x, y)
            for x, y in zip(
                b_maps(local, layer, head, n, **tile), b_maps(r, layer, head, n, **tile), strict=True
            )
        )
        row = dict(rows=slice(n - 1, n), weighting=weighting)
        assert all(
            np.array_equal(x, y)
            for x, y in zip(
                b_maps(local, layer, head, n, **row), b_maps(r, layer, head, n, **row), strict=True
            )
        )
        ov_l = b_overview(local, layer, head, n, 5, weighting)
        ov_r = b_overview(r, layer, head, n, 5, weighting, cancelled=lambda: False)
        for f in ("a", "b", "d", "row_edges", "col_edges"):
            assert np.array_equal(getattr(ov_l, f), getattr(ov_r, f)), f
        assert ov_r.n == n and ov_r.a.shape == (5, 5)
    with pytest.raises(IndexError, match="out of range"):
        b_maps(r, local.info.n_layers, 0, n)  # one line from the engine, which keeps serving
    assert np.array_equal(b_maps(r, 0, 0, n)[1], b_maps(local, 0, 0, n)[1])


@pytest.mark.slow
def test_remote_run_b_refusals_are_one_line_and_the_engine_keeps_serving(
    sessions, folders, tmp_path, monkeypatch
):
    from attnscope.core.analysis import compare_run_b as compare_b
    from attnscope.core.analysis.compare_run_b import b_maps, held, run_b
    from attnscope.core.errors import ModelLoadError, SessionError
    from attnscope.core.loading import fit

    local, r, engine, server = sessions
    run_b(r, "dtype", None, "torch", "float32", PROMPT)
    first = weakref.ref(held(engine))
    run_b(r, "dtype", None, "torch", "bfloat16", PROMPT)  # the next run B replaces the first
    assert first() is None and held(engine).info.dtype == "bfloat16"  # never two Bs held

    # B's model does not exist on the engine's machine
    with pytest.raises(ModelLoadError) as e:
        run_b(r, "model", str(tmp_path / "no-such-model"), "torch", "float32", PROMPT)
    assert "\n" not in str(e.value) and "no-such-model" in str(e.value)
    with pytest.raises(SessionError, match="run B first"):
        b_maps(r, 0, 0, 4)  # the previous B went before the refused one was tried
    # a model whose tokenizer gives A's prompt other ids
    with pytest.raises(SessionError, match="tokenizes A's prompt differently") as e:
        run_b(r, "model", str(folders["other_tok"]), "torch", "float32", PROMPT)
    assert "\n" not in str(e.value)
    assert engine not in compare_b._HELD
    with pytest.raises(SessionError, match="tokenizes A's prompt differently"):  # in-process alike
        run_b(local, "model", str(folders["other_tok"]), "torch", "float32", PROMPT)
    # no room next to A (the engine's free memory, measured there: this test's process)
    monkeypatch.setattr(fit, "free_memory", lambda backend="torch", device="cpu": (1_000_000, "RAM"))
    with pytest.raises(SessionError, match="run B does not fit next to run A: does not fit") as e:
        run_b(r, "dtype", None, "torch", "float32", PROMPT)
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    from attnscope.core.session import Session

    def no_room(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(Session, "load", no_room)  # out of memory while loading, on the engine
    with pytest.raises(
        SessionError, match=r"run B ran out of memory next to run A \(RuntimeError\); A is kept$"
    ):
        run_b(r, "dtype", None, "torch", "float32", PROMPT)
    monkeypatch.undo()
    # cancelled from here while the engine loads B: one Cancelled line, relayed; A untouched
    from attnscope.core.errors import Cancelled

    real_load = Session.load.__func__

    def load_then_wait_for_the_cancel(cls, *a, **k):
        b = real_load(cls, *a, **k)
        for _ in range(3000):  # the client's cancel message arrives at the engine's next poll
            if server._cancelled():
                break
            time.sleep(0.01)
        return b

    monkeypatch.setattr(Session, "load", classmethod(load_then_wait_for_the_cancel))
    said: list[str] = []
    with pytest.raises(Cancelled, match="compare cancelled"):
        run_b(
            r,
            "dtype",
            None,
            "torch",
            "float32",
            PROMPT,
            progress=lambda m, f: said.append(m),
            cancelled=lambda: bool(said),
        )
    monkeypatch.undo()
    assert said == ["Loading run B (torch, float32)…"] and engine not in compare_b._HELD
    # bad arguments, from a hand-made request
    with pytest.raises(ValueError, match="kind must be one of"):
        run_b(r, "nonsense", None, "torch", "float32", PROMPT)
    # the engine still serves, and a good run B works after all that
    res, _, _ = run_b(r, "model", str(folders["last"]), "torch", "float32", PROMPT)
    assert (res.ranked()[0].layer, res.ranked()[0].head) == (1, 2)
    assert r.ids == local.ids and engine.ids == local.ids  # A's sequence untouched by every B


@pytest.mark.slow
def test_loading_another_model_on_the_engine_drops_run_b(folders):
    from attnscope.core.analysis import compare_run_b as compare_b
    from attnscope.core.analysis.compare_run_b import run_b
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    engine = Session.load(str(folders["base"]), device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(PROMPT, chat_template=False, all_logits=True)
            run_b(r, "dtype", None, "torch", "float32", PROMPT)
            b = weakref.ref(compare_b.held(engine))
            r.load_model(str(folders["last"]), device="cpu")  # before the new model loads, B goes
            assert b() is None and engine not in compare_b._HELD
        finally:
            r.close()


@pytest.mark.slow
def test_compare_tab_on_a_remote_engine_shows_the_in_process_comparison(qtbot, folders, monkeypatch):
    pytest.importorskip("pytestqt")
    from attnscope.app import model_picker
    from attnscope.app.views import compare_jobs
    from attnscope.core.analysis.compare_run_b import b_maps, b_overview, run_b
    from attnscope.core.loading import catalog
    from attnscope.core.session import Session
    from remote_window import remote_window

    local = Session.load(str(folders["base"]), device="cpu")
    local.prefill(PROMPT, chat_template=False, all_logits=True)
    local.step(2)
    want, labels_a, labels_b = run_b(local, "model", str(folders["last"]), "torch", "float32", PROMPT)
    n = want.alignment.n
    seen = {}

    def exec_picker(dlg):  # Browse…: the engine's models, chosen as a user would
        qtbot.waitUntil(lambda: len(dlg.model.entries) == 1, timeout=30000)
        seen["title"] = dlg.windowTitle()
        assert dlg.select(str(folders["last"]))
        dlg._open()
        return 1

    monkeypatch.setattr(model_picker.ModelPickerDialog, "exec", exec_picker)
    with remote_window(qtbot, folders["base"], PROMPT, steps=2, size=(1400, 900)) as w:
        server_entries = catalog.describe_path(folders["last"], "user")
        monkeypatch.setattr(catalog, "scan", lambda *a, **k: server_entries)  # the engine's catalog
        assert w.engine.session.ids == local.ids
        w.show_view("compare")
        view = w.views["compare"]
        view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index("model"))
        assert w.engine.wait_idle(60)  # the engine answers one request at a time: the picker's scan waits
        view.browse_button.click()
        assert seen["title"].startswith("Open model on the engine at 127.0.0.1:")
        assert view.model_edit.text() == str(folders["last"])  # a path on the engine's machine
        view.dtype_combo.setCurrentText("float32")
        view.backend_combo.setCurrentText("torch")
        assert view.run_b() is not None
        qtbot.waitUntil(lambda: view.run_button.isEnabled(), timeout=120000)
        assert w.engine.wait_idle(60) and w.last_error is None, view.summary.text()
        assert view.result is not None, view.summary.text()
        _same_result(want, view.result)  # the window re-ran A with every logit on the engine first
        assert view.labels == (labels_a, labels_b)
        assert view.table.rowCount() == 8 and "most changed: L1 H2" in view.summary.text()
        cells = [[view.table.item(i, c).text() for c in range(1, 6)] for i in range(8)]
        rows = [
            [str(d.layer), str(d.head), f"{d.js_mean:.3g}", f"{d.js_max:.3g}", str(d.js_argmax)]
            for d in want.ranked()
        ]
        assert cells[0] == rows[0] and sorted(cells) == sorted(rows)  # ties (JS 0) sort as Qt likes
        # the selected head's maps, computed on the engine: the in-process ones, bit for bit
        assert view.map_key == (1, 2)
        wa, wb = b_maps(local, 1, 2, n)
        assert np.array_equal(view.maps[0], wa) and np.array_equal(view.maps[1], wb)
        w.resize(1400, 900)
        qtbot.wait(50)
        w.grab().save("/work/notes/shots/remote_compare.png")
        job = compare_jobs.row_job(1, 2, n - 1, n, "attention")  # a click on a row
        got = {}
        w.engine.enqueue(job, lambda p: got.setdefault("row", p), label="row")
        assert w.engine.wait_idle(60) and w.last_error is None
        row, ra, rb = got["row"]
        ea, eb = b_maps(local, 1, 2, n, rows=slice(n - 1, n))  # the in-process row job's call
        assert row == n - 1 and np.array_equal(ra, ea[0]) and np.array_equal(rb, eb[0])
        # a long head: the overview and an exact tile on zoom, from the engine
        monkeypatch.setattr(compare_jobs, "MAX_CELLS", 16)
        view.request_maps(0, 3)
        qtbot.waitUntil(lambda: view.map_key == (0, 3) and view.overview is not None, timeout=60000)
        assert w.engine.wait_idle(60)
        ov = b_overview(local, 0, 3, n, 16)
        for f in ("a", "b", "d", "row_edges", "col_edges"):
            assert np.array_equal(getattr(view.overview, f), getattr(ov, f)), f
        view.plots[1].vb.setRange(xRange=(n - 8, n - 2), yRange=(n - 7, n - 1), padding=0)
        qtbot.waitUntil(lambda: view.tile is not None, timeout=60000)
        assert w.engine.wait_idle(60) and w.last_error is None
        ta, tb, r0, c0 = view.tile
        ea, eb = b_maps(local, 0, 3, n, rows=slice(r0, r0 + ta.shape[0]), cols=slice(c0, c0 + ta.shape[1]))
        assert np.array_equal(ta, ea) and np.array_equal(tb, eb)
        # a B the engine does not have: one line in the tab, and the engine keeps serving
        view.model_edit.setText("/no/such/model/on/the/engine")
        assert view.run_b() is not None
        qtbot.waitUntil(lambda: view.run_button.isEnabled(), timeout=60000)
        assert w.engine.wait_idle(60)
        text = view.summary.text()
        assert text.startswith("Compare stopped: ") and "\n" not in text and "/no/such/model" in text, text
        w.state.select(1, 0)  # still serving: the heatmap's weights, from the engine
        assert w.engine.wait_idle(60) and w.last_error is None, w.last_error
        assert np.array_equal(w.heatmap.weights, local.weights(1, 0))
        # the refused B's predecessor went before it: its comparison left the tab with it (no table,
        # no maps; the head picked above asked for nothing) and the one line stays
        assert view.result is None and view.table.rowCount() == 0 and view.maps is None
        assert view.summary.text() == text
