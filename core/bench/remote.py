"""``attnscope bench --engine HOST:PORT``: what the network costs, against the same work in-process.

Both sides prefill the same ``T``-token prompt (T = 2048 by default) on the same model (the engine's
embedded default, or a model path that exists on both machines) and then, interleaved, ``repeats``
times: one head's full ``T × T`` float32 map (:meth:`Session.weights` against
:meth:`RemoteSession.weights`: compute on the engine, transfer, decode) and the ``n_layers ×
n_heads`` sink table (:meth:`Session.sink_scores`). Medians of wall time. Targets (docs/remote.md): the
map within 2× in-process, the table within 30 ms of in-process. The remote map is also checked to
be bit-identical to the local one.

On one machine (localhost) engine and bench share the CPUs, and on a busy machine the engine's
compute varies from call to call as much as the transfer costs; so ``repeats`` more calls of each
are split into the engine's compute (its reply says) and the rest, sending, receiving and decoding
(medians of wall and compute, the rest their difference: the three add up); and the link's floor is
timed: a reply of the map's size that the engine already holds (:meth:`RemoteSession.probe`), what
any request that size costs on this link before any compute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from attnscope.core.session import Session

SCHEMA = "attnscope.bench.remote/1"
MAP_RATIO_TARGET = 2.0
TABLE_EXTRA_TARGET_S = 0.030


def _prompt_of(session: Session, n: int) -> str:
    """A text that tokenizes (no chat template) to about ``n`` tokens on ``session``'s tokenizer."""
    words = [f"w{i % 97} token{i}" for i in range(n)]
    lo, hi = 1, n
    while lo < hi:  # the fewest words reaching n tokens
        mid = (lo + hi) // 2
        if len(session.encode(" ".join(words[:mid]), False)) >= n:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[:lo])


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run_remote_bench(
    engine: str,
    token: str | None = None,
    seq_len: int = 2048,
    repeats: int = 7,
    layer: int = 3,
    head: int = 4,
    device: str | None = "cpu",
    log: Callable[[str], None] = lambda msg: None,
) -> dict:
    """Run the bench against the engine at ``engine`` (``HOST:PORT``); returns the figures (seconds).

    Raises:
        EngineLost/Refused: as :meth:`RemoteSession.connect`. ModelLoadError: the engine's model is
        not on this machine too (give the engine the default model, or the same path on both).
    """
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    r = RemoteSession.connect(engine, token=token)
    try:
        if r.info is None:
            log("the engine has no model: loading its default")
            r.load_model()
        ref = None if r.model_ref in (None, "default") else r.model_ref
        log(f"in-process: loading {r.info.name} ({device or 'default device'})")
        local = Session.load(ref, device=device, dtype=r.info.dtype)
        prompt = _prompt_of(local, seq_len)
        log(f"prefill of {len(local.encode(prompt, False))} tokens, in-process and on the engine")
        local.prefill(prompt, chat_template=False)
        r.prefill(prompt, chat_template=False)
        T = local.seq_len
        if r.ids != local.ids:
            raise RuntimeError("the engine tokenized the prompt differently: not the same model")
        layer, head = min(layer, local.info.n_layers - 1), min(head, local.info.n_heads - 1)
        identical = bool(np.array_equal(local.weights(layer, head), r.weights(layer, head)))
        log(
            f"timing {repeats} repeats: one head's {T}² map and the {local.info.n_layers} × {local.info.n_heads} sink table"
        )
        out: dict[str, list[float]] = {
            "local_map_s": [],
            "remote_map_s": [],
            "local_table_s": [],
            "remote_table_s": [],
            "floor_s": [],
        }
        for _ in range(2):  # interleaved halves: a colleague's job slows both sides alike
            out["local_map_s"].append(_median(lambda: local.weights(layer, head), repeats))
            out["remote_map_s"].append(_median(lambda: r.weights(layer, head), repeats))
            out["floor_s"].append(_median(lambda: r.probe(T * T * 4), repeats))
            out["local_table_s"].append(_median(local.sink_scores, repeats * 3))
            out["remote_table_s"].append(_median(r.sink_scores, repeats * 3))
        # where a remote call's time goes, from the same calls: the engine's compute (its reply says)
        # and the rest (sending, receiving, decoding); medians of wall and compute, the rest their
        # difference, so the three figures add up
        calls: dict[str, list[tuple[float, float]]] = {"map": [], "table": []}
        for key, fn in (("map", lambda: r.weights(layer, head)), ("table", r.sink_scores)):
            for _ in range(repeats):
                fn()
                calls[key].append((r.last_wall_s, r.last_compute_s))
        med = {k: min(v) for k, v in out.items()}
        for key, rows in calls.items():
            wall = statistics.median(w for w, _ in rows)
            compute = statistics.median(c for _, c in rows)
            med[f"{key}_wall_s"] = wall
            med[f"engine_{key}_s"] = compute
            med[f"{key}_overhead_s"] = max(0.0, wall - compute)
        map_ratio = med["remote_map_s"] / med["local_map_s"]
        table_extra = med["remote_table_s"] - med["local_table_s"]
        return {
            "schema": SCHEMA,
            "engine": engine,
            "engine_where": r.backend.where,
            "model": r.info.name,
            "dtype": r.info.dtype,
            "seq_len": T,
            "layer": layer,
            "head": head,
            "map_bytes": T * T * 4,
            "repeats": repeats,
            "bit_identical": identical,
            **med,
            "map_ratio": map_ratio,
            "table_extra_s": table_extra,
            "floor_ratio": (med["local_map_s"] + med["floor_s"]) / med["local_map_s"],
            "link_bytes_per_s": (T * T * 4) / max(med["map_overhead_s"], 1e-9),
            "targets": {
                "map_ratio_max": MAP_RATIO_TARGET,
                "map_met": map_ratio <= MAP_RATIO_TARGET,
                "table_extra_max_s": TABLE_EXTRA_TARGET_S,
                "table_met": table_extra <= TABLE_EXTRA_TARGET_S,
            },
        }
    finally:
        r.close()


def format_remote_table(res: dict) -> str:
    """The figures as a few lines of text."""
    t = res["targets"]
    ok = {True: "met", False: "NOT met"}
    return "\n".join(
        [
            f"engine {res['engine']} ({res['engine_where']}), {res['model']} {res['dtype']}, T = {res['seq_len']}, "
            f"L{res['layer']} H{res['head']}; remote map bit-identical: {res['bit_identical']}",
            f"one head's {res['seq_len']}² map ({res['map_bytes'] / 1e6:.1f} MB): in-process {res['local_map_s'] * 1e3:.1f} ms, "
            f"remote {res['remote_map_s'] * 1e3:.1f} ms = {res['map_ratio']:.2f}× (target ≤ {t['map_ratio_max']:g}×: {ok[t['map_met']]})",
            f"sink table: in-process {res['local_table_s'] * 1e3:.2f} ms, remote {res['remote_table_s'] * 1e3:.2f} ms, "
            f"+{res['table_extra_s'] * 1e3:.2f} ms (target ≤ +{t['table_extra_max_s'] * 1e3:g} ms: {ok[t['table_met']]})",
            f"where a remote map's time goes ({res['repeats']} more calls, medians): {res['map_wall_s'] * 1e3:.1f} ms = "
            f"the engine's compute {res['engine_map_s'] * 1e3:.1f} ms + sending, receiving and decoding "
            f"{res['map_overhead_s'] * 1e3:.1f} ms (sink table: {res['table_wall_s'] * 1e3:.2f} = "
            f"{res['engine_table_s'] * 1e3:.2f} + {res['table_overhead_s'] * 1e3:.2f} ms)",
            f"the link alone (the engine sends {res['map_bytes'] / 1e6:.1f} MB it already holds, no compute): "
            f"{res['floor_s'] * 1e3:.1f} ms, so a remote map needs about in-process + that = "
            f"{res['floor_ratio']:.2f}× in-process",
        ]
    )
