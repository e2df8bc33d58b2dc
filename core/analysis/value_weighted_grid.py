"""Head-grid thumbnails on the value-weighted scale (:mod:`attnscope.core.analysis.value_weighted`).

Cell ``(i, j)`` of head ``h`` is ``α_ij ‖v_j W_O^h‖ / Σ_j' α_ij' ‖v_j' W_O^h‖`` (Kobayashi et al.,
EMNLP 2020; :func:`attnscope.core.analysis.value_weighted.apply_norms` with ``normalise=True``), pooled like the
attention thumbnails (:func:`attnscope.core.analysis.blocked.thumbnails`: max or mean over near-equal blocks).

Cost: the same row bands of all a layer's heads as the attention thumbnails (one batched block per
band, only the keys the mask lets the rows see, never ``T × T`` per head), plus the layer's norms,
one ``(n_heads, T)`` vector (:func:`attnscope.core.analysis.value_weighted.value_norms`). Each band holds whole rows
(every key a row can see), so its row totals are the exact totals of the full rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from attnscope.core.analysis import blocked
from attnscope.core.analysis.remotable import remotable
from attnscope.core.analysis.value_weighted import value_norms

if TYPE_CHECKING:
    from attnscope.core.session import Session


def _vw_layer(
    session: Session,
    layer: int,
    n: int,
    size: int,
    pooling: str,
    budget: int,
    fast: bool,
    cancelled: Callable[[], bool] | None,
) -> np.ndarray:
    """``(n_heads, P, P)`` pooled row-normalised value-weighted maps of ``layer`` (float32)."""
    trace = session.trace
    H = trace.n_heads
    norms = torch.from_numpy(np.ascontiguousarray(value_norms(session, layer)[:, :n], dtype=np.float32))
    norms = norms.to(blocked._device(trace))
    pool = blocked._Pooler(H, n, size, size, pooling, False, blocked._device(trace))
    for r0, r1 in blocked.bands(n, H + 1, None, budget):
        blocked._check(cancelled)
        c0, c1 = blocked.visible_cols(trace, layer, r0, r1)
        w = blocked.block(trace, layer, range(H), slice(r0, r1), slice(c0, c1), fast=fast).float()
        vw = w * norms[:, None, c0:c1].to(w.device)  # (H, band, keys)
        tot = vw.sum(dim=-1, keepdim=True, dtype=torch.float64)
        vw = torch.where(tot > 0, vw / torch.where(tot > 0, tot, 1.0), 0.0).float()
        pool.add(vw, r0, c0)
        pool.mark(r0, r1)
    return pool.image()


@remotable
def value_weighted_thumbnails(
    session: Session,
    n: int | None = None,
    size: int = 40,
    pooling: str = "max",
    *,
    budget: int = blocked.BUDGET,
    fast: bool = True,
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Callable[[np.ndarray, float], None] | None = None,
) -> np.ndarray:
    """Pooled row-normalised value-weighted maps of every head over the first ``n`` positions:
    ``(n_layers, n_heads, P, P)`` float32, ``P = min(n, size)``, each cell in ``[0, 1]`` (a share of
    the head's output norm at that query row, pooled by ``"max"`` or ``"mean"``, masked cells as 0).

    Same call shape as :func:`attnscope.core.analysis.aggregate.thumbnails`: ``progress(heads_done, n_layers ×
    n_heads)`` as each layer completes, ``partial(thumbs, fraction)`` after each layer but the last ``threads``: torch threads
    for the work (:class:`attnscope.core.analysis.blocked.torch_threads`; None: torch's current count).

    Raises:
        IndexError: ``n`` outside ``1..seq_len``. ValueError: unknown pooling.
        SessionError: nothing run, or the backend has no value norms.
        Cancelled: ``cancelled()`` turned true (checked per band).
    """
    n = session.seq_len if n is None else n
    if not 1 <= n <= session.seq_len:
        raise IndexError(f"n={n} out of range 1..{session.seq_len}")
    session.weights(
        session.info.arch.attention_layers[0], 0, slice(0, 1), slice(0, 1)
    )  # the session's checks (ran)
    trace = session.trace
    with blocked.torch_threads(threads):
        return blocked.layer_by_layer(
            trace.n_layers,
            trace.n_heads,
            min(n, size),
            lambda layer: _vw_layer(session, layer, n, size, pooling, budget, fast, cancelled),
            progress=progress,
            partial=partial,
        )
