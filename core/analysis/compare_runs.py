"""Compare two runs head by head: what a precision, a backend, another model or one edited word changes.

Run A and run B are two :class:`attnscope.core.session.Session` objects that have each prefilled a prompt
(prefill with ``all_logits=True`` so the logits of every position can be compared too; without
them the logits part is left empty). Nothing here loads models; :func:`run_pair` does for the CLI.

**Alignment** (:func:`align`): when the two id sequences have the same length the runs are
*token-aligned*: position ``i`` of A is compared with position ``i`` of B (an edit that keeps the
length, or the same prompt through another model / precision / backend). Otherwise they are
aligned by their *shared prefix* of identical ids (length ``n``): positions ``0 .. n-1`` are
compared, and the rest is not (the alignment says so). With the same model an edit that changes
the length therefore moves nothing inside the shared prefix (causal attention), which is the
honest answer.

**Head distance**: for layer ``l``, head ``h`` and aligned query rows ``i = 1 .. n-1`` (row 0 sees
only key 0, weight 1 in every run), the base-2 Jensen–Shannon distance (:func:`attnscope.core.analysis.gqa.js_distance`,
Lin 1991) between A's row ``i`` and B's row ``i`` over keys ``0 .. n-1``; ``js_mean`` is the mean
over rows, ``js_max`` the largest, ``js_argmax`` its row. With ``weighting="value-weighted"`` the rows
are the row-normalised value-weighted maps (:mod:`attnscope.core.analysis.value_weighted`) instead of the weights.

**Logits**: at each aligned position ``i``, ``KL(A‖B) = Σ_v p_A log2(p_A / p_B)`` (bits, float64,
from log-softmax; over the common vocabulary when the sizes differ) and whether the top-1 tokens agree.

**Memory**: the maps are computed head by head from the two traces' exact weights
(``session.weights``), in row bands of ``block_rows`` rows: at any time one band of one head per
run, ``2 × block_rows × n`` float32; never ``layers × heads × T × T``. Both runs do hold their
trace (q rows + LSE, and the KV cache the keys live in: ``O(layers × heads × T × head_dim)``,
e.g. 235 MB for SmolLM2 at T = 2048 in float32, against 1.1 G floats for all maps) and, for the
logits, ``n × vocab`` float32 each (197 kB per position for SmolLM2). When two *models* cannot both
be held, :func:`run_pair` with ``low_memory=True`` runs A first, keeps A's trace, KV cache, logits
and value norms, and drops A's model weights (``Backend.release_weights``) before loading B.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from attnscope.core import backend_registry as registry
from attnscope.core import memory
from attnscope.core.analysis.aggregate import _check_cancel
from attnscope.core.analysis.gqa import js_distance
from attnscope.core.analysis.value_weighted import (
    ATTENTION,
    VALUE_WEIGHTED,
    apply_norms,
    check_weighting,
    value_norms,
)
from attnscope.core.errors import SessionError
from attnscope.core.trace import softmax_variant

if TYPE_CHECKING:
    from attnscope.core.session import Session


@dataclass(frozen=True)
class RunInfo:
    """What names one run in a table or a sidecar."""

    model: str
    source: str
    sha256: str | None
    dtype: str
    backend: str
    device: str
    prompt: str | None
    chat_template: bool
    ids: tuple[int, ...]
    #: :func:`attnscope.core.loading.quantize.record`: ``{"file", "runtime", "mode"}`` (``mode`` the
    #: ``--quantize`` value the run loaded with); :func:`attnscope.core.loading.device_map.record`:
    #: ``{"strategy", "placement"}``, ``{}`` on one device
    quantization: dict = field(default_factory=dict)
    device_map: dict = field(default_factory=dict)

    @classmethod
    def of(cls, session: Session, sha256: bool = True) -> RunInfo:
        from attnscope.core.loading.device_map import record as dm_record
        from attnscope.core.loading.quantize import record as quant_record

        sha = None
        if sha256:
            from attnscope.core.loading.model_hash import model_sha256

            try:
                sha = model_sha256(session.info.source)
            except OSError:
                sha = None
        return cls(
            model=session.info.name,
            source=session.info.source,
            sha256=sha,
            dtype=session.info.dtype,
            backend=getattr(session.backend, "name", "?"),
            device=str(getattr(session.backend, "device", "?")),
            prompt=session.prompt,
            chat_template=bool(session.chat_template),
            ids=tuple(session.ids),
            quantization=quant_record(session.info),
            device_map=dm_record(session.info),
        )

    def label(self) -> str:
        return f"{self.model} · {self.dtype} · {self.backend}"

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["ids"] = list(self.ids)
        d["quantization"] = dict(self.quantization)
        d["device_map"] = dict(self.device_map)
        return d


@dataclass(frozen=True)
class Alignment:
    """How the two runs' positions were paired: ``kind`` "token" or "prefix", ``n`` positions compared."""

    kind: str
    n: int
    n_a: int
    n_b: int
    first_difference: int | None  # first position whose ids differ (None: identical ids)

    @property
    def description(self) -> str:
        same = (
            "identical ids"
            if self.first_difference is None
            else f"ids differ from position {self.first_difference}"
        )
        if self.kind == "token":
            return f"token-aligned: {self.n} positions, {same}"
        return (
            f"aligned by the shared prefix: {self.n} of {self.n_a} (A) / {self.n_b} (B) positions compared; "
            f"the rest differs in length and is not compared"
        )

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "n": self.n,
            "n_a": self.n_a,
            "n_b": self.n_b,
            "first_difference": self.first_difference,
            "description": self.description,
        }


def align(ids_a, ids_b) -> Alignment:
    """Pair the positions of two id sequences (module docstring).

    Raises:
        SessionError: an empty sequence.
    """
    a, b = list(ids_a), list(ids_b)
    if not a or not b:
        raise SessionError("both runs need a prompt before they can be compared")
    m = min(len(a), len(b))
    diff = next((i for i in range(m) if a[i] != b[i]), None)
    if len(a) == len(b):
        return Alignment("token", len(a), len(a), len(b), diff)
    n = m if diff is None else diff
    if n == 0:
        raise SessionError("the two prompts share no leading token and differ in length: nothing to align")
    return Alignment("prefix", n, len(a), len(b), diff if diff is not None else m)


@dataclass(frozen=True)
class HeadDistance:
    layer: int
    head: int
    js_mean: float
    js_max: float
    js_argmax: int  # the row (query position) of js_max

    def to_json(self) -> dict:
        return {
            "layer": self.layer,
            "head": self.head,
            "js_mean": self.js_mean,
            "js_max": self.js_max,
            "js_argmax_row": self.js_argmax,
        }


@dataclass(frozen=True)
class CompareResult:
    """Distances between two runs. Arrays are numpy: ``js_mean``, ``js_max`` ``(n_layers, n_heads)``
    float64 (bits^½, in [0, 1]); ``js_argmax`` int64; per aligned position ``kl`` float64 (bits; empty
    when the logits were not kept), ``top1_a``, ``top1_b`` int64 and ``top1_agree`` bool."""

    run_a: RunInfo
    run_b: RunInfo
    alignment: Alignment
    weighting: str
    js_mean: np.ndarray
    js_max: np.ndarray
    js_argmax: np.ndarray
    kl: np.ndarray = field(default_factory=lambda: np.zeros(0))
    top1_a: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    top1_b: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    top1_agree: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def ranked(self) -> list[HeadDistance]:
        """Every (layer, head), most changed first: by ``js_mean`` desc, then ``js_max`` desc, then layer, head.
        A hybrid model's layers with no map (NaN rows) are left out."""
        L, H = self.js_mean.shape
        heads = [
            HeadDistance(
                la, h, float(self.js_mean[la, h]), float(self.js_max[la, h]), int(self.js_argmax[la, h])
            )
            for la in range(L)
            for h in range(H)
            if not np.isnan(self.js_mean[la, h])
        ]
        return sorted(heads, key=lambda d: (-d.js_mean, -d.js_max, d.layer, d.head))

    def same_by_construction(self) -> int:
        """How many leading positions are the same in both runs by construction: the first
        difference of the ids when B is A's model at A's dtype, backend, device, quantisation and
        device map (a causal model's
        position ``i`` sees only tokens ``0 .. i``, so rows before the edit cannot differ), else 0."""
        a, b, al = self.run_a, self.run_b, self.alignment
        keys = ("model", "source", "dtype", "backend", "device", "quantization", "device_map")
        same = all(getattr(a, k) == getattr(b, k) for k in keys)
        if not same or al.first_difference is None:
            return 0
        return min(al.first_difference, al.n)

    def nothing_to_compare(self) -> str | None:
        """One line when every compared position lies before the edit of the same model's prompt
        (:meth:`same_by_construction` covers the whole prefix alignment): the distances are all zero
        by construction, not a finding. None when the comparison can show differences."""
        al = self.alignment
        k = self.same_by_construction()
        if al.kind != "prefix" or k < al.n:
            return None
        return (
            f"B's prompt differs from position {k} on ({al.n_a} tokens in A, {al.n_b} in B): a causal model's "
            f"first {k} positions are the same in both runs, so only positions ≥ {k} can differ, and there "
            "the two sequences do not line up: nothing to compare. To compare the positions after an edit, "
            "keep the token count (swap a word for one of as many tokens)."
        )

    def to_json(self) -> dict:
        """JSON-ready dict: ``heads`` (ranked), ``logits`` per position, ``alignment``, both runs, and
        ``nothing_to_compare`` (:meth:`nothing_to_compare`: a line, or None)."""
        return {
            "run_a": self.run_a.to_json(),
            "run_b": self.run_b.to_json(),
            "alignment": self.alignment.to_json(),
            "weighting": self.weighting,
            "distance": "Jensen-Shannon distance, base 2, mean (and max) over aligned query rows 1..n-1",
            "heads": [d.to_json() for d in self.ranked()],
            "logits": [
                {
                    "position": i,
                    "kl_a_b_bits": float(self.kl[i]),
                    "top1_a": int(self.top1_a[i]),
                    "top1_b": int(self.top1_b[i]),
                    "top1_agree": bool(self.top1_agree[i]),
                }
                for i in range(len(self.kl))
            ],
            "top1_agreement": float(self.top1_agree.mean()) if len(self.top1_agree) else None,
            "nothing_to_compare": self.nothing_to_compare(),
        }


def logits_divergence(
    la: np.ndarray, lb: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per position ``KL(A‖B)`` in bits, top-1 of A, of B and their agreement, from logits ``(n, V)``.

    Over the first ``min(V_A, V_B)`` entries when the vocabularies differ in size (padding rows).
    """
    v = min(la.shape[-1], lb.shape[-1])
    a = np.asarray(la[:, :v], np.float64)
    b = np.asarray(lb[:, :v], np.float64)
    lpa = a - a.max(axis=1, keepdims=True)
    lpa -= np.log(np.exp(lpa).sum(axis=1, keepdims=True))
    lpb = b - b.max(axis=1, keepdims=True)
    lpb -= np.log(np.exp(lpb).sum(axis=1, keepdims=True))
    kl = np.maximum((np.exp(lpa) * (lpa - lpb)).sum(axis=1) / np.log(2.0), 0.0)
    ta, tb = a.argmax(axis=1), b.argmax(axis=1)
    return kl, ta.astype(np.int64), tb.astype(np.int64), ta == tb


def _check_geometry(sa, sb) -> None:
    ia, ib = sa.info, sb.info
    if (ia.n_layers, ia.n_heads) != (ib.n_layers, ib.n_heads):
        raise SessionError(
            f"the runs have different attention layouts ({ia.n_layers} layers × {ia.n_heads} heads vs "
            f"{ib.n_layers} × {ib.n_heads}): Compare needs the same layers and heads"
        )
    la, lb = ia.arch.attention_layers, ib.arch.attention_layers
    if la != lb:  # hybrid models: the same layers must have maps
        raise SessionError(
            f"the runs have attention maps in different layers ({list(la)} vs {list(lb)}): "
            "Compare needs the same attention layers"
        )


def compare_sessions(
    sa,
    sb,
    weighting: str = ATTENTION,
    block_rows: int = 256,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    logits: tuple[np.ndarray, np.ndarray] | None = None,
    runs: tuple[RunInfo, RunInfo] | None = None,
    norms: tuple[Callable[[int], np.ndarray], Callable[[int], np.ndarray]] | None = None,
) -> CompareResult:
    """Distances between two prefilled sessions (module docstring for the math and memory).

    Args:
        sa, sb: the runs (anything with ``info``, ``ids``, ``weights(layer, head, rows, cols)``).
        weighting: "attention" or "value-weighted".
        block_rows: query rows per band.
        progress: ``progress(done, n_layers × n_heads)`` after each head.
        cancelled: checked between heads (and bands).
        logits: ``(A (n_a, V), B (n_b, V))`` all-position logits; default each session's
            ``position_logits()`` when it kept them, else the logits part stays empty.
        runs: the two :class:`RunInfo` (default taken from the sessions).
        norms: per-run ``layer -> (n_heads, seq_len)`` value norms (default :func:`value_norms`).

    Raises:
        SessionError: a run is empty, the layouts differ, or nothing aligns. ValueError: bad weighting.
        Cancelled: ``cancelled()`` became true.
    """
    check_weighting(weighting)
    _check_geometry(sa, sb)
    al = align(sa.ids, sb.ids)
    n, L, H = al.n, sa.info.n_layers, sa.info.n_heads
    js_sum = np.zeros((L, H))
    js_max = np.zeros((L, H))
    js_arg = np.zeros((L, H), np.int64)
    rows = max(n - 1, 0)
    nf_a = norms[0] if norms else (lambda layer: value_norms(sa, layer))
    nf_b = norms[1] if norms else (lambda layer: value_norms(sb, layer))
    maps = sa.info.arch
    # a learned sink slot (gpt-oss) is one more outcome of every row (attnscope.core.analysis.gqa.js_distance)
    slot = softmax_variant.has_learned_sinks(getattr(sa, "trace", None)) or softmax_variant.has_learned_sinks(
        getattr(sb, "trace", None)
    )
    for layer in range(L):
        if not maps.has_map(
            layer
        ):  # a hybrid model's layer with no map: NaN rows (attnscope.core.trace.base)
            js_sum[layer] = js_max[layer] = np.nan
            if progress is not None:
                progress((layer + 1) * H, L * H)
            continue
        if weighting == VALUE_WEIGHTED:
            na, nb = nf_a(layer)[:, :n], nf_b(layer)[:, :n]
        for h in range(H):
            _check_cancel(cancelled)
            for r0 in range(1, n, block_rows):
                _check_cancel(cancelled)
                r = slice(r0, min(r0 + block_rows, n))
                wa = sa.weights(layer, h, r, slice(0, n))
                wb = sb.weights(layer, h, r, slice(0, n))
                if weighting == VALUE_WEIGHTED:
                    wa, wb = apply_norms(wa, na[h], True), apply_norms(wb, nb[h], True)
                d = js_distance(wa, wb, axis=1, sink_slot=slot)  # (band,)
                js_sum[layer, h] += d.sum()
                k = int(d.argmax())
                if d[k] > js_max[layer, h] or r0 == 1:
                    js_max[layer, h], js_arg[layer, h] = float(d[k]), r0 + k
            if progress is not None:
                progress(layer * H + h + 1, L * H)
    js_mean = js_sum / rows if rows else js_sum
    if logits is None:
        try:
            logits = (sa.position_logits(), sb.position_logits())
        except (SessionError, AttributeError):
            logits = None
    extra = {}
    if logits is not None:
        kl, ta, tb, agree = logits_divergence(logits[0][:n], logits[1][:n])
        extra = dict(kl=kl, top1_a=ta, top1_b=tb, top1_agree=agree)
    ra, rb = runs if runs else (RunInfo.of(sa), RunInfo.of(sb))
    return CompareResult(
        run_a=ra,
        run_b=rb,
        alignment=al,
        weighting=weighting,
        js_mean=js_mean,
        js_max=js_max,
        js_argmax=js_arg,
        **extra,
    )


def head_maps(
    sa,
    sb,
    layer: int,
    head: int,
    n: int,
    rows: slice | None = None,
    cols: slice | None = None,
    weighting: str = ATTENTION,
) -> tuple[np.ndarray, np.ndarray]:
    """A's and B's maps of one head over the aligned ``n × n`` square (or a ``rows × cols`` tile of it),
    float32; value-weighted ones row-normalised over the whole aligned row.

    Raises:
        SessionError: a run now holds fewer than ``n`` positions (it changed since the comparison:
            its maps would not line up). IndexError: layer or head out of range.
    """
    for name, s in (("A", sa), ("B", sb)):
        if n > s.seq_len:
            raise SessionError(
                f"run {name} now holds {s.seq_len} positions, not the {n} compared: run B & compare again"
            )
    rows = slice(0, n) if rows is None else rows
    cols = slice(0, n) if cols is None else cols
    out = []
    for s in (sa, sb):
        w = s.weights(layer, head, rows, cols)
        if weighting == VALUE_WEIGHTED:
            nv = value_norms(s, layer)[head, :n]
            full = s.weights(layer, head, rows, slice(0, n)).astype(np.float64)
            w = apply_norms(w, nv[cols], True, row_totals=full @ nv.astype(np.float64))
        out.append(w)
    return out[0], out[1]


def release_model(session: Session) -> None:
    """Drop a session's model weights, keeping its trace, KV cache and logits (``weights`` still works;
    ``value_norms``, ``prefill`` and ``step`` no longer do). For :func:`run_pair`'s ``low_memory``."""
    release = getattr(session.backend, "release_weights", None)
    if release is not None:
        release()
    memory.collect()  # on the GUI thread in the app (attnscope.core.memory)


def run_pair(
    model_a=None,
    model_b=None,
    prompt: str = "",
    prompt_b: str | None = None,
    *,
    backend: str = registry.DEFAULT,
    backend_b: str | None = None,
    dtype: str = "float32",
    dtype_b: str | None = None,
    device: str | None = None,
    chat_template: bool = True,
    quantize: str | None = None,
    quantize_b: str | None = None,
    weighting: str = ATTENTION,
    low_memory: bool = False,
    progress: Callable[[str, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> CompareResult:
    """Load and run A, then B (B's settings default to A's), and compare them (:func:`compare_sessions`).

    ``quantize``/``quantize_b`` are passed to ``Session.load`` only when given (needs a session that
    supports it). With ``low_memory`` A's model weights are dropped before B is loaded (A's value
    norms are computed first when ``weighting`` is value-weighted).

    Raises:
        ModelLoadError, SessionError, Cancelled: as loading, prefill and :func:`compare_sessions`.
    """
    from attnscope.core.session import Session

    check_weighting(weighting)
    say = progress or (lambda *_: None)

    def load(model, be, dt, q):
        kw = {"quantize": q} if q else {}
        return Session.load(model, backend=be, device=device, dtype=dt, **kw)

    say("Running A…", 0.0)
    sa = load(model_a, backend, dtype, quantize)
    sa.prefill(prompt, chat_template=chat_template, all_logits=True, cancelled=cancelled)
    run_a = RunInfo.of(sa)
    norms_a = None
    if weighting == VALUE_WEIGHTED:
        maps = sa.info.arch
        norms_a = [value_norms(sa, la) if maps.has_map(la) else None for la in range(sa.info.n_layers)]
    if low_memory:
        release_model(sa)
    say("Running B…", 0.3)
    sb = load(
        model_b if model_b is not None else model_a,
        backend_b or backend,
        dtype_b or dtype,
        quantize_b if quantize_b is not None else quantize,
    )
    sb.prefill(
        prompt_b if prompt_b is not None else prompt,
        chat_template=chat_template,
        all_logits=True,
        cancelled=cancelled,
    )
    _check_geometry(sa, sb)
    norms: Any = None  # (layer -> A's value norms, layer -> B's), as compare_sessions takes them
    if norms_a is not None:
        norms = (lambda layer: norms_a[layer], lambda layer: value_norms(sb, layer))
    total = sa.info.n_layers * sa.info.n_heads
    return compare_sessions(
        sa,
        sb,
        weighting=weighting,
        cancelled=cancelled,
        norms=norms,
        runs=(run_a, RunInfo.of(sb)),
        progress=lambda d, t: say(f"Comparing heads {d}/{total}…", 0.6 + 0.4 * d / t),
    )
