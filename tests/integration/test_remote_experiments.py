"""Experiments over a remote engine: ``run_experiments`` runs where the model is
(``@remotable``; the engine decodes the ``Experiment`` data it is sent, nothing else) and the results
are the in-process ones, bit for bit; the engine's own sequence is untouched."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


def _same_results(want, got) -> None:
    assert len(want) == len(got)
    for a, b in zip(want, got, strict=True):
        assert type(a) is type(b) and a.experiment == b.experiment
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f.name
            elif isinstance(x, float):
                assert (np.isnan(x) and np.isnan(y)) or x == y, f.name  # identical, not close
            else:
                assert x == y, f.name
        assert a.to_json() == b.to_json()


@pytest.mark.slow
def test_remote_experiments_are_the_in_process_ones(tmp_path):
    from attnscope.core.analysis.experiments import Experiment, default_experiments, run_experiments
    from attnscope.core.analysis.remotable import served
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    REGISTRY = served()
    assert "attnscope.core.analysis.experiments.run_experiments" in REGISTRY
    folder = tmp_path / "llama"
    save_tiny("llama", folder, seed=11)
    prompt = "the cat sat on the mat and the dog sat on the log"
    local = Session.load(str(folder), device="cpu")
    local.prefill(prompt, chat_template=False)
    local.step(3)
    exps = default_experiments(local.seq_len) + [Experiment("evict_first", k=2, decode_from=5)]
    want = run_experiments(local, exps)
    engine = Session.load(str(folder), device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(prompt, chat_template=False)
            r.step(3)
            said = []
            got = run_experiments(r, exps, progress=lambda m, f: said.append((m, f)))
            _same_results(want, got)
            assert got[-1].experiment.decode_from == 5 and got[0].experiment.decode_from == local.n_prompt
            assert said and said[-1] == ("Experiments done", 1.0)  # relayed from the engine
            assert engine.ids == local.ids and r.ids == local.ids  # its sequence is untouched
            with pytest.raises(ValueError, match="past the sequence"):
                run_experiments(r, [Experiment("evict_first", decode_from=local.seq_len + 5)])
            bad = Experiment("evict_first")
            object.__setattr__(bad, "k", -1)  # what a hand-made message could carry
            with pytest.raises(ValueError, match="bad Experiment: k must be >= 0"):
                run_experiments(r, [bad])  # refused while decoding, in one line
            _same_results(want[:1], run_experiments(r, exps[:1]))  # and the engine keeps serving
        finally:
            r.close()


@pytest.mark.slow
def test_experiments_tab_on_a_remote_engine_shows_the_in_process_results(qtbot, tmp_path):
    pytest.importorskip("pytestqt")
    from attnscope.core.analysis.experiments import default_experiments, run_experiments
    from remote_window import remote_window, tiny_local_run

    prompt = "attention is all you need"
    folder, local = tiny_local_run(tmp_path, prompt)
    with remote_window(qtbot, folder, prompt) as w:
        view = w.views["experiments"]
        w.show_view("experiments")
        w.refresh_current_view()  # the tab runs one of each kind by itself on a short sequence
        want = run_experiments(local, default_experiments(local.seq_len))
        qtbot.waitUntil(lambda: len(view.results) == len(want) or w.last_error, timeout=60000)
        assert w.engine.wait_idle(60) and w.last_error is None, w.last_error
        _same_results(want, view.results)
        assert view.table.rowCount() == len(want) == len(default_experiments(local.seq_len)) >= 3
        w.grab().save("/work/notes/shots/h10_experiments_remote.png")
