"""The Python API's errors: every public Session / export_head / Sampling entry point checks its
arguments and raises an ``attnscope.AttnScopeError`` subclass that is also the matching builtin,
with one line naming the argument, the value and what is allowed (found by a new-user trial).

A tiny random llama (2 layers, 4 query heads, 2 KV heads, context 256) stands in for the default
model: the checks depend only on the counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from attnscope import AttnScopeError, Sampling, Session, export_head
from attnscope.core.errors import BadArgument, BadPath, OutOfRange, SessionError, WrongType
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api_errors") / "llama"
    save_tiny("llama", folder)
    return Session.load(str(folder), device="cpu")


@pytest.fixture()
def ran(tiny):
    tiny.prefill("the cat sat", chat_template=False)  # 11 tokens (one per byte)
    return tiny


def _raises(exc, builtin, message, fn, *args, **kw):
    """``fn(*args, **kw)`` raises ``exc`` (an AttnScopeError and ``builtin``) with exactly ``message``."""
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    e = info.value
    assert isinstance(e, AttnScopeError) and isinstance(e, builtin), type(e).__mro__
    assert str(e) == message
    assert "\n" not in str(e)


def test_the_error_classes_are_also_the_builtins():
    import attnscope

    assert (attnscope.OutOfRange, attnscope.BadArgument, attnscope.WrongType, attnscope.BadPath) == (
        OutOfRange,
        BadArgument,
        WrongType,
        BadPath,
    )
    assert issubclass(OutOfRange, IndexError) and issubclass(OutOfRange, SessionError)
    assert issubclass(BadArgument, ValueError) and issubclass(BadArgument, SessionError)
    assert issubclass(WrongType, TypeError) and issubclass(WrongType, BadArgument)
    assert issubclass(BadPath, FileNotFoundError) and issubclass(BadPath, BadArgument)


def test_weights_layer_and_head(ran):
    assert ran.seq_len == 11
    _raises(OutOfRange, IndexError, "layer 30 out of range 0..1", ran.weights, 30, 0)
    _raises(OutOfRange, IndexError, "layer -1 out of range 0..1", ran.weights, -1, 0)
    _raises(OutOfRange, IndexError, "head 4 out of range 0..3", ran.weights, 0, 4)
    _raises(WrongType, TypeError, "layer must be a whole number (int), got float 1.5", ran.weights, 1.5, 0)
    _raises(WrongType, TypeError, "head must be a whole number (int), got bool True", ran.weights, 0, True)
    _raises(WrongType, TypeError, "layer must be a whole number (int), got str '0'", ran.weights, "0", 0)
    assert ran.weights(np.int64(1), np.int32(3)).shape == (11, 11)  # numpy integers are whole numbers


def test_weights_rows_and_cols(ran):
    _raises(
        WrongType,
        TypeError,
        "rows must be a slice or None, got int 3: for one position use rows=slice(3, 4)",
        ran.weights,
        0,
        0,
        rows=3,
    )
    _raises(
        BadArgument,
        ValueError,
        "rows=slice(0, 8, 2) has step 2: selections are contiguous (step 1 or None)",
        ran.weights,
        0,
        0,
        rows=slice(0, 8, 2),
    )
    _raises(
        OutOfRange,
        IndexError,
        "cols=slice(0, 12) out of range: bounds must be within -11..11 (length 11)",
        ran.weights,
        0,
        0,
        cols=slice(0, 12),
    )
    _raises(
        WrongType,
        TypeError,
        "rows=slice(0.5, 3): the start must be a whole number or None, got 0.5",
        ran.weights,
        0,
        0,
        rows=slice(0.5, 3),
    )
    full = ran.weights(0, 1)
    np.testing.assert_array_equal(ran.weights(0, 1, rows=slice(-4, None), cols=slice(0, 11, 1)), full[-4:])
    np.testing.assert_array_equal(ran.weights(0, 1, rows=slice(2, 5), cols=slice(None, 6)), full[2:5, :6])
    assert ran.weights(0, 1, rows=slice(5, 5)).shape == (0, 11)  # empty, but in range
    # the trace checks the same way for callers that go to it directly
    _raises(OutOfRange, IndexError, "layer 2 out of range 0..1", ran.trace.weights, 2, 0)
    _raises(
        BadArgument,
        ValueError,
        "rows=slice(0, 8, 2) has step 2: selections are contiguous (step 1 or None)",
        ran.trace.weights,
        0,
        0,
        slice(0, 8, 2),
    )


def test_other_session_calls(ran):
    _raises(WrongType, TypeError, "steps must be a whole number, got float 2.0", ran.step, 2.0)
    _raises(BadArgument, ValueError, "steps must be >= 1, got 0", ran.step, 0)
    _raises(WrongType, TypeError, "sampling must be an attnscope.Sampling, got dict", ran.set_sampling, {})
    _raises(
        OutOfRange,
        IndexError,
        "cannot step back n=1: no generated tokens yet (prefill keeps the prompt)",
        ran.step_back,
    )
    _raises(OutOfRange, IndexError, "step 1 out of range 0..0", ran.logits_at, 1)
    _raises(OutOfRange, IndexError, "key 11 out of range 0..10", ran.sink_scores, 11)
    _raises(OutOfRange, IndexError, "k 0 out of range 1..272", ran.next_token_probs, 0)
    _raises(OutOfRange, IndexError, "seq_len=-1 out of range: it must be >= 0", ran.kv_cache_bytes, -1)
    assert ran.sink_scores(0).shape == (2, 4)


def test_before_prefill_says_to_run_a_prompt(tiny, tmp_path):
    tiny.clear()
    _raises(
        SessionError,
        Exception,
        "nothing has run yet: run a prompt first (call prefill(prompt))",
        tiny.weights,
        0,
        0,
    )
    _raises(SessionError, Exception, "run a prompt before stepping: call prefill(prompt) first", tiny.step, 1)
    _raises(
        SessionError,
        Exception,
        "nothing has run yet: run a prompt first (call prefill(prompt)), then export",
        export_head,
        tiny,
        0,
        0,
        tmp_path / "h.npy",
    )


def test_export_head_arguments(ran, tmp_path):
    out = tmp_path / "h.npy"
    _raises(OutOfRange, IndexError, "layer 30 out of range 0..1", export_head, ran, 30, 0, out)
    _raises(OutOfRange, IndexError, "head 9 out of range 0..3", export_head, ran, 0, 9, out)
    _raises(
        WrongType,
        TypeError,
        "layer must be a whole number (int), got float 0.0",
        export_head,
        ran,
        0.0,
        0,
        out,
    )
    _raises(OutOfRange, IndexError, "n 12 out of range 1..11", export_head, ran, 0, 0, out, n=12)
    _raises(
        BadArgument,
        ValueError,
        "unsupported output 'h.txt': use .png, .svg, .pdf, .npy, .csv, .safetensors",
        export_head,
        ran,
        0,
        0,
        tmp_path / "h.txt",
    )
    _raises(
        BadArgument,
        ValueError,
        "unknown mode 'heads': choose head, group, layer, all",
        export_head,
        ran,
        0,
        0,
        out,
        mode="heads",
    )
    missing = tmp_path / "no" / "h.npy"
    _raises(
        BadPath,
        FileNotFoundError,
        f"cannot write {str(missing)!r}: the folder {str(missing.parent)!r} does not exist (create it first)",
        export_head,
        ran,
        0,
        0,
        missing,
    )
    for suffix in ("svg", "pdf"):
        _raises(
            BadArgument,
            ValueError,
            f"{suffix.upper()} figures need the window's Qt renderer: pass "
            "renderer=attnscope.app.figure.save_heatmap_figure (needs PySide6), or write .png, .npy, .csv or .safetensors",
            export_head,
            ran,
            0,
            0,
            tmp_path / f"h.{suffix}",
        )
    assert not list(tmp_path.iterdir())  # nothing written by a refused call
    written = export_head(ran, 1, 3, out)
    assert [p.name for p in written] == ["h.npy", "h.npy.json"]
    np.testing.assert_array_equal(np.load(out), ran.weights(1, 3))


@pytest.mark.parametrize(
    ("kw", "exc", "message"),
    [
        ({"temperature": -1}, BadArgument, "temperature must be >= 0, got -1"),
        ({"temperature": float("nan")}, BadArgument, "temperature must be >= 0, got nan"),
        ({"temperature": "hot"}, WrongType, "temperature must be a number, got str 'hot'"),
        ({"top_k": 2.5}, WrongType, "top_k must be a whole number (int), got float 2.5"),
        ({"top_k": -3}, BadArgument, "top_k must be >= 0, got -3"),
        ({"top_p": 0}, BadArgument, "top_p must be in (0, 1], got 0"),
        ({"top_p": 1.5}, BadArgument, "top_p must be in (0, 1], got 1.5"),
        ({"seed": True}, WrongType, "seed must be a whole number (int), got bool True"),
    ],
)
def test_sampling_arguments(kw, exc, message):
    _raises(exc, ValueError, message, Sampling, **kw)


def test_sampling_accepts_what_it_documents():
    s = Sampling(temperature=np.float32(0.7), top_k=np.int64(5), top_p=1, seed=2**40)
    assert (s.top_k, s.top_p) == (5, 1)


def test_steps_past_the_context_are_refused_before_any_step(tiny):
    tiny.prefill("the cat sat", chat_template=False)
    tiny.step(2)
    assert tiny.seq_len == 13
    _raises(
        BadArgument,
        ValueError,
        "steps=1000000000 does not fit the model's context of 256 tokens: 13 are used, room for 243 more",
        tiny.step,
        10**9,
    )
    _raises(
        BadArgument,
        ValueError,
        "steps=244 does not fit the model's context of 256 tokens: 13 are used, room for 243 more",
        tiny.step,
        244,
    )
    _raises(
        BadArgument,
        ValueError,
        "300 token ids does not fit the model's context of 256 tokens: 13 are used, room for 243 more",
        tiny.feed,
        [5] * 300,
    )
    assert tiny.seq_len == 13  # nothing ran
    _raises(
        OutOfRange,
        IndexError,
        "cannot step back n=3: 2 generated token(s), so n must be in 1..2",
        tiny.step_back,
        3,
    )
    tiny.step(243)  # exactly fills the context
    assert tiny.seq_len == 256
    _raises(
        BadArgument,
        ValueError,
        "steps=1 does not fit the model's context of 256 tokens: 256 are used, room for 0 more",
        tiny.step,
        1,
    )


def test_prefill_flags_are_bools(tiny):
    _raises(
        WrongType, TypeError, "chat_template must be True or False, got str 'no'", tiny.prefill, "hi", "no"
    )
    _raises(
        WrongType,
        TypeError,
        "all_logits must be True or False, got int 1",
        tiny.prefill,
        "hi",
        False,
        all_logits=1,
    )
    assert len(tiny.prefill("hi", np.bool_(False))) == 2


def test_trace_arguments(ran):
    t = ran.trace
    _raises(
        OutOfRange, IndexError, "key -1 out of range 0..10", t.weight_on_key, -1
    )  # read from the end before
    _raises(OutOfRange, IndexError, "key 11 out of range 0..10", t.weight_on_key, 11)
    _raises(BadArgument, ValueError, "offset must be >= 0, got -1", t.diagonal, -1)
    _raises(WrongType, TypeError, "offset must be a whole number (int), got float 1.0", t.diagonal, 1.0)
    _raises(
        WrongType, TypeError, "head must be a whole number (int), got float 1.5", t.weights_block, 0, [1.5]
    )
    _raises(OutOfRange, IndexError, "head 4 out of range 0..3", t.weights_block, 0, [0, 4])
    _raises(
        OutOfRange,
        IndexError,
        "no heads selected: pass heads=None for all, or a list of head indices",
        t.weights_block,
        0,
        [],
    )
    _raises(OutOfRange, IndexError, "key positions must be in 0..10, got [11]", t.row_mass, [0, 11])
    _raises(OutOfRange, IndexError, "layer 2 out of range 0..1", t.lse, 2)
    _raises(
        BadArgument,
        ValueError,
        "cols=slice(None, None, -1) has step -1: selections are contiguous (step 1 or None)",
        t.allowed,
        0,
        None,
        slice(None, None, -1),
    )


def test_kv_cache_bytes_arguments():
    from attnscope import kv_cache_bytes

    assert kv_cache_bytes(30, 3, 64, 8, "fp32") == 368640
    _raises(WrongType, TypeError, "seq_len must be an integer, got 8.5", kv_cache_bytes, 30, 3, 64, 8.5)
    _raises(WrongType, ValueError, "n_layers must be an integer, got True", kv_cache_bytes, True, 3, 64, 8)
    _raises(BadArgument, ValueError, "seq_len must be >= 0, got -8", kv_cache_bytes, 30, 3, 64, -8)
    _raises(
        BadArgument,
        ValueError,
        "windows lists 1 layers, the model has 30",
        kv_cache_bytes,
        30,
        3,
        64,
        8,
        windows=[4],
    )
