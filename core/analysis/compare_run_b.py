"""Run B held where run A is: the Compare tab's second session, loaded, run and compared next to A.

The Compare tab (``app/views/compare.py``) takes the window's session as run A. Run B must live
where A's model lives: in this process for a local session, on the engine for a
:class:`attnscope.core.remote.client.RemoteSession` (``attnscope serve``). So every step that
touches B is a ``@remotable`` function of A's session (:mod:`attnscope.core.analysis.remotable`):

* :func:`run_b` loads B (another model sharing A's tokenizer, the same model at another dtype, on
  another backend, or with another prompt), prefills it with every position's logits, feeds it A's
  generated ids and returns :func:`attnscope.core.analysis.compare_runs.compare_sessions` of the two,
  with the token labels of both runs. Over a remote engine the
  :class:`~attnscope.core.analysis.compare_runs.CompareResult` travels as JSON fields plus raw arrays
  (:mod:`attnscope.core.remote.wire`), bit-identical to in-process.
* :func:`b_maps` (A's and B's maps of one head, or a tile or a row of them) and
  :func:`b_overview` (a long head's pooled overview,
  :func:`attnscope.core.analysis.compare_overview.pooled_pair`) compute from the B held for A.

Holding: at most one B per A session (a weak-keyed table: B goes when A's session goes), replaced
by the next :func:`run_b` (the old B is dropped and collected *before* the new one loads, so A + B
is the most ever held) and dropped by :func:`drop` (the engine server does this before it loads
another model). A B is refused, in one line, when its model cannot be loaded there
(:class:`~attnscope.core.errors.ModelLoadError`), when its tokenizer encodes A's prompt to other ids
(a different tokenizer or chat template: nothing would line up), when its fit estimate
(:func:`attnscope.core.loading.fit.estimate_entry`) says it does not fit in the memory free there
with A loaded, and when loading or running it runs out of memory; B is then dropped and A keeps
serving.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core import memory
from attnscope.core.analysis.remotable import remotable
from attnscope.core.errors import Cancelled, SessionError

if TYPE_CHECKING:
    from attnscope.core.session import Session

#: run A's session -> its run B session (weak keys: B is dropped with A)
_HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

KINDS = ("model", "dtype", "backend", "prompt")


def held(session: Session):
    """The run B held for ``session`` (run A). Raises SessionError when none is."""
    try:
        b = _HELD.get(session)
    except TypeError:  # None, or anything that cannot be a key
        b = None
    if b is None:
        raise SessionError("run B first")
    return b


def drop(session: Session | None = None) -> None:
    """Drop the run B held for ``session`` (None: every one held in this process) and collect it."""
    if session is None:
        had = len(_HELD) > 0
        _HELD.clear()
    else:
        try:
            had = _HELD.pop(session, None) is not None
        except TypeError:  # None, or anything that cannot be a key: nothing held
            had = False
    if had:
        memory.collect()  # on the GUI thread in the app (attnscope.core.memory)


@remotable
def kept_all_logits(session: Session) -> bool:
    """True when ``session`` kept every position's logits (prefilled with ``all_logits=True``), so
    Compare need not re-run A; answered where the model is, without sending the logits."""
    try:
        session.position_logits()
    except SessionError:
        return False
    return True


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


def _check_fits(ref, backend: str, device: str, dtype: str, context: int) -> None:
    """Refuse (SessionError) a B whose fit estimate says it does not fit in the free memory now
    (A is loaded, so it is counted already). An estimate that cannot be made refuses nothing."""
    from attnscope.core.loading import catalog, describe_model, fit

    try:
        entries = catalog.scan_embedded() if ref is None else describe_model.describe_path(ref)
        if not entries:
            return
        est = fit.estimate_entry(entries[0], max(context, 1), backend=backend, device=device, dtype=dtype)
    except Exception:  # noqa: BLE001 - no estimate: the load itself says what is wrong
        return
    if est.verdict == fit.NO_FIT:
        raise SessionError(f"run B does not fit next to run A: {est.summary()}")


def _tokenizer_refusal(sa, sb, prompt: str, gen: list[int]) -> str | None:
    """Why B cannot be fed A's tokens (None when it can): on A's own prompt B's tokenizer (and chat
    template) must give A's prompt ids, and A's generated ids must lie in B's vocabulary."""
    if prompt == sa.prompt:
        want = sa.ids[: sa.n_prompt]
        got = sb.encode(prompt, sa.chat_template)
        if got != want:
            i = next((k for k, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), None)
            i = min(len(want), len(got)) if i is None else i
            return (
                f"run B's model tokenizes A's prompt differently (ids differ from token {i}): "
                "Compare needs a model sharing A's tokenizer and chat template"
            )
    if gen and max(gen) >= sb.info.vocab_size:
        return f"A's generated token id {max(gen)} is outside run B's vocabulary of {sb.info.vocab_size}"
    return None


@remotable
def run_b(
    session: Session,
    kind: str,
    model: str | None,
    backend: str,
    dtype: str,
    prompt: str,
    weighting: str = "attention",
    progress: Callable[[str, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> tuple:
    """Load and run B next to run A (``session``), then compare every head.

    Args:
        session: run A, prefilled with ``all_logits=True`` (+ decode steps), local or remote.
        kind: "model" (``model`` is B's checkpoint, a path where A's model runs), "dtype",
            "backend" or "prompt" (B is A's model).
        backend, dtype: B's backend and precision. prompt: B's prompt (A's chat-template setting).
        weighting: "attention" or "value-weighted" (:func:`~attnscope.core.analysis.compare_runs.compare_sessions`).
        progress: ``progress(message, fraction)``. cancelled: checked between stages and heads.

    Returns:
        ``(CompareResult, A's token labels, B's token labels)``; B is held for ``session``
        (:func:`held`).

    Raises:
        SessionError: A is empty, B's tokenizer differs, B does not fit or ran out of memory, the
            layouts differ. ModelLoadError: B's model cannot be loaded. ValueError: a bad kind or
            weighting. Cancelled.
    """
    from attnscope.core.analysis.compare_runs import compare_sessions
    from attnscope.core.analysis.value_weighted import check_weighting
    from attnscope.core.loading.resolve import is_default_source
    from attnscope.core.session import Session

    if kind not in KINDS:
        raise ValueError(f"run B's kind must be one of {', '.join(KINDS)}, not {kind!r}")
    check_weighting(weighting)
    say = progress or (lambda *_: None)
    sa = session
    if sa.seq_len == 0:
        raise SessionError("run a prompt first: run A is the window's sequence")
    drop(sa)  # the previous B goes before the next one loads: A + B at most
    source = model if kind == "model" else sa.info.source
    ref = None if source and is_default_source(source) else source
    same = backend == getattr(sa.backend, "name", None)
    _check_fits(ref, backend, str(getattr(sa.backend, "device", "cpu")) if same else "cpu", dtype, sa.seq_len)
    say(f"Loading run B ({backend}, {dtype})…", 0.05)
    gen = sa.ids[sa.n_prompt :]
    sb, refusal = None, None
    try:
        sb = Session.load(ref, backend=backend, dtype=dtype)
        if cancelled is not None and cancelled():
            raise Cancelled("compare cancelled")
        refusal = _tokenizer_refusal(sa, sb, prompt, gen)
        if refusal is None:
            say("Running B…", 0.2)
            sb.prefill(prompt, chat_template=sa.chat_template, all_logits=True, cancelled=cancelled)
            if gen:
                sb.feed(gen, cancelled=cancelled)
    except (MemoryError, RuntimeError) as e:
        if not _is_oom(e):
            raise
        refusal = f"run B ran out of memory next to run A ({type(e).__name__}); A is kept"
    if refusal is not None or sb is None:  # outside the except: no traceback keeps B's frames alive
        sb = None
        memory.collect()  # on the GUI thread in the app (attnscope.core.memory)
        raise SessionError(refusal or "run B did not load")
    _HELD[sa] = sb
    total = sa.info.n_layers * sa.info.n_heads
    res = compare_sessions(
        sa,
        sb,
        weighting=weighting,
        cancelled=cancelled,
        progress=lambda d, t: say(f"Comparing heads {d}/{total}…", 0.3 + 0.7 * d / t),
    )
    return res, [t.text for t in sa.tokens], [t.text for t in sb.tokens]


@remotable
def b_maps(
    session: Session,
    layer: int,
    head: int,
    n: int,
    rows: slice | None = None,
    cols: slice | None = None,
    weighting: str = "attention",
) -> tuple[np.ndarray, np.ndarray]:
    """A's and B's maps of one head over the aligned ``n × n`` (or its ``rows × cols`` tile), float32:
    :func:`attnscope.core.analysis.compare_runs.head_maps` with the B held for ``session``.

    Raises:
        SessionError: no B held (run B first). IndexError: layer, head or rows out of range.
    """
    from attnscope.core.analysis.compare_runs import head_maps

    return head_maps(session, held(session), layer, head, n, rows=rows, cols=cols, weighting=weighting)


@remotable
def b_overview(
    session: Session,
    layer: int,
    head: int,
    n: int,
    out: int,
    weighting: str = "attention",
    cancelled: Callable[[], bool] | None = None,
):
    """A long head's overview of A, B and A − B, ``out × out`` blocks at most
    (:class:`attnscope.core.analysis.compare_overview.PairOverview`), computed where both runs are.

    Raises:
        SessionError: no B held. Cancelled: between bands.
    """
    from attnscope.core.analysis.compare_overview import pooled_pair
    from attnscope.core.analysis.compare_runs import head_maps

    sb = held(session)
    return pooled_pair(
        lambda r: head_maps(session, sb, layer, head, n, rows=r, weighting=weighting),
        n,
        out,
        cancelled=cancelled,
    )
