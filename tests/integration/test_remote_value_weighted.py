"""Value-weighted maps over a remote engine: the value norms need the model's weights,
so ``value_weighted_tile``, ``value_weighted_thumbnails``, ``value_weighted_sink_rows`` (and the
helpers under them) run where the model is (``@remotable``) and arrive identical to in-process."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402

PROMPT = "attention is all you need, and then some more attention"


def _same(a, b) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True)  # bit-identical, not close


def test_value_weighted_functions_are_offered_by_the_engine():

    from attnscope.core.analysis.remotable import served

    REGISTRY = served()  # what the server does at start
    vw = "attnscope.core.analysis.value_weighted"
    for fn in ("value_norms", "value_weighted", "value_weighted_sink_rows", "value_weighted_sink_scores"):
        assert f"{vw}.{fn}" in REGISTRY
    assert f"{vw}.value_weighted_tile" in REGISTRY
    assert "attnscope.core.analysis.value_weighted_grid.value_weighted_thumbnails" in REGISTRY


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_remote_value_weighted_maps_are_the_in_process_ones(tmp_path, family):
    from attnscope.core.analysis.value_weighted import (
        value_norms,
        value_weighted,
        value_weighted_sink_rows,
        value_weighted_sink_scores,
        value_weighted_tile,
    )
    from attnscope.core.analysis.value_weighted_grid import value_weighted_thumbnails
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    folder = tmp_path / family
    save_tiny(family, folder, seed=3)
    local = Session.load(str(folder), device="cpu")
    local.prefill(PROMPT, chat_template=False)
    local.step(2)
    info, n = local.info, local.seq_len
    engine = Session.load(str(folder), device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(PROMPT, chat_template=False)
            r.step(2)
            for layer in range(info.n_layers):
                got = value_norms(r, layer)
                _same(value_norms(local, layer), got)
                assert got.shape == (info.n_heads, n) and got.dtype == np.float32 and (got > 0).all()
            _same(value_weighted(local, 1, 2), value_weighted(r, 1, 2))
            _same(value_weighted(local, 0, 1, normalise=True), value_weighted(r, 0, 1, normalise=True))
            for mode in ("head", "group", "layer", "all"):
                want = value_weighted_tile(local, 1, 1, mode, slice(0, n), slice(0, n))
                got = value_weighted_tile(r, 1, 1, mode, slice(0, n), slice(0, n), cancelled=lambda: False)
                _same(want, got)
                assert got.shape == (n, n)
                np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)  # rows normalised
            _same(
                value_weighted_tile(local, 0, 0, "head", slice(3, 7), slice(0, 5)),
                value_weighted_tile(r, 0, 0, "head", slice(3, 7), slice(0, 5)),
            )
            said = []
            got = value_weighted_sink_rows(r, progress=lambda *a: said.append(a), cancelled=lambda: False)
            _same(value_weighted_sink_rows(local), got)
            assert got.shape[:2] == (info.n_layers, info.n_heads)
            _same(value_weighted_sink_scores(local, key=1), value_weighted_sink_scores(r, key=1))
            for size, pooling in ((4, "max"), (n + 5, "mean")):
                want = value_weighted_thumbnails(local, n, size, pooling, fast=False)
                got = value_weighted_thumbnails(r, n, size, pooling, fast=False, partial=lambda *a: None)
                _same(want, got)
            _same(value_weighted_thumbnails(local, 5, 4), value_weighted_thumbnails(r, 5, 4))
            with pytest.raises(IndexError):
                value_norms(r, info.n_layers)  # one line from the engine, which keeps serving
            _same(value_norms(local, 0), value_norms(r, 0))
        finally:
            r.close()
