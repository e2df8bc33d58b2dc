"""The analyses as ``Session`` methods: ``s.head_effects(...)``, ``s.explain(...)``, ``s.logit_lens(...)``.

The layers contract (``pyproject.toml``'s ``[tool.importlinter]``) keeps :mod:`attnscope.core.session`
below the analyses, so the core ``Session`` cannot name them. :class:`AnalysisMethods` is a mixin whose
every method calls the analysis function of the same name with the session as its first argument;
the public ``attnscope.Session`` (:class:`Session` here) is the core Session with it, and
:class:`attnscope.core.remote.client.RemoteSession` has it too. Each function is ``@remotable``
(:mod:`attnscope.core.analysis.remotable`), so on a remote engine the same call runs where the model is
and gives the same numbers (tests/integration/test_session_methods.py checks both against the functions).

Each method's arguments, shapes, units and errors are the function's (its docstring, linked from each
method); the method adds nothing and checks nothing of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from attnscope.core.analysis import explain as _why
from attnscope.core.analysis import head_effects as _heads
from attnscope.core.analysis import logit_lens as _lens
from attnscope.core.analysis import qk_sources as _sources
from attnscope.core.analysis.explain import SHORT_TOKENS
from attnscope.core.session import Session as _CoreSession

if TYPE_CHECKING:
    import numpy as np
    from attnscope.core.analysis.explain import BandSplit, Explanation
    from attnscope.core.analysis.head_effects import (
        HeadEffects,
        LogitAttribution,
        PatchResult,
        Target,
    )
    from attnscope.core.analysis.logit_lens import LogitLens
    from attnscope.core.analysis.qk_sources import SourceSplit


class AnalysisMethods:
    """Which heads matter (docs/heads.md) and why a head attends (docs/why.md) as methods of a session.

    Mixed into :class:`Session` and :class:`attnscope.core.remote.client.RemoteSession`; ``self`` is the
    session the function receives.
    """

    # -- which heads matter (attnscope.core.analysis.head_effects) ----------------------------------
    def make_target(
        self,
        kind: str = "logprob",
        position: int | None = None,
        token: int | str | None = None,
        other: int | str | None = None,
    ) -> Target:
        """The number the head analyses move: :func:`attnscope.core.analysis.head_effects.make_target`.

        ``kind``: ``logprob`` | ``logit_diff`` | ``kl``; ``position`` defaults to
        the last one; ``token`` (id or one-token text) to the next token there; ``other`` is the
        ``logit_diff`` baseline.

        Raises:
            SessionError: nothing run yet. BadArgument: an unknown kind, a token that is not one token.
            OutOfRange: a position outside the sequence.
        """
        return _heads.make_target(self, kind, position, token, other)

    def head_effects(
        self,
        target: Target | None = None,
        method: str = "zero",
        scope: str = "readout",
        source: str | Sequence[int] | None = None,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        layers: Sequence[int] | None = None,
        kv_side: bool = True,
    ) -> HeadEffects:
        """Every head ablated one at a time: :func:`attnscope.core.analysis.head_effects.head_effects`.

        Returns a :class:`~attnscope.core.analysis.head_effects.HeadEffects` (``query`` ``(n_layers,
        n_heads)`` float64, ``kv`` ``(n_layers, n_kv_heads)``: the target's change, in its units).

        Raises:
            as the function (SessionError, BadArgument, UnsupportedModelError, Cancelled).
        """
        return _heads.head_effects(
            self,
            target,
            method,
            scope,
            source,
            progress=progress,
            cancelled=cancelled,
            layers=layers,
            kv_side=kv_side,
        )

    def patch_heads(
        self,
        corrupt: str | Sequence[int],
        target: Target | None = None,
        scope: str = "everywhere",
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        site: str = "output",
        layers: Sequence[int] | None = None,
    ) -> PatchResult:
        """Activation patching against ``corrupt`` (text or ids of the same length):
        :func:`attnscope.core.analysis.head_effects.patch_heads`.

        Raises:
            as the function (BadArgument: prompts of different lengths; Cancelled; ...).
        """
        return _heads.patch_heads(
            self, corrupt, target, scope, progress=progress, cancelled=cancelled, site=site, layers=layers
        )

    def attribution_patching(
        self,
        corrupt: str | Sequence[int],
        target: Target | None = None,
        scope: str = "everywhere",
        site: str = "output",
        directions: Sequence[str] = ("denoise", "noise"),
    ) -> PatchResult:
        """The gradient estimate of :meth:`patch_heads` (Nanda 2023):
        :func:`attnscope.core.analysis.head_effects.attribution_patching`.

        Raises:
            as the function.
        """
        return _heads.attribution_patching(self, corrupt, target, scope, site, tuple(directions))

    def logit_attribution(self, target: Target | None = None) -> LogitAttribution:
        """Direct logit attribution of ``target`` to every head, MLP and the embedding:
        :func:`attnscope.core.analysis.head_effects.logit_attribution` (parts sum to the logit, 1e-4).

        Raises:
            as the function (UnsupportedModelError: a post-norm family).
        """
        return _heads.logit_attribution(self, target)

    def logit_lens(self, positions: Sequence[int] | None = None, k: int = 5) -> LogitLens:
        """The ``k`` top tokens of every layer's residual stream at ``positions`` (default: the last 16):
        :func:`attnscope.core.analysis.logit_lens.logit_lens`.

        Raises:
            as the function (OutOfRange: a position outside the sequence).
        """
        return _lens.logit_lens(self, positions, k)

    # -- why a head attends (attnscope.core.analysis.explain, .qk_sources) ------------------------------
    def explain(
        self, layer: int, head: int, query: int, key: int, *, sources: bool = False, top: int = 10
    ) -> Explanation:
        """Why ``head`` gives ``key`` its score at ``query``: the cell and its row split by rotary band,
        the counterfactual row without RoPE, and with ``sources`` the split by the components that wrote
        the query and the key: :func:`attnscope.core.analysis.explain.explain`.

        Raises:
            as the function (SessionError, OutOfRange, WrongType, UnsupportedModelError).
        """
        return _why.explain(self, layer, head, query, key, sources=sources, top=top)

    def cell_bands(self, layer: int, head: int, query: int, key: int) -> BandSplit:
        """One score split by rotary band, no forward: :func:`attnscope.core.analysis.explain.cell_bands`."""
        return _why.cell_bands(self, layer, head, query, key)

    def row_bands(self, layer: int, head: int, query: int) -> BandSplit:
        """Row ``query``'s weighted score ``Σ_j w_ij s_ij`` split by rotary band, no forward:
        :func:`attnscope.core.analysis.explain.row_bands`."""
        return _why.row_bands(self, layer, head, query)

    def positional_share(
        self, layer: int, head: int, *, short_tokens: float = SHORT_TOKENS, max_rows: int = _why.SHARE_ROWS
    ) -> float:
        """The share in [0, 1] of the head's score variance carried by bands turning faster than every
        ``short_tokens`` tokens (near 1: positional; near 0: content):
        :func:`attnscope.core.analysis.explain.head_positional_share`."""
        return _why.head_positional_share(self, layer, head, short_tokens=short_tokens, max_rows=max_rows)

    def positional_share_grid(
        self,
        *,
        short_tokens: float = SHORT_TOKENS,
        max_rows: int = 64,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """:meth:`positional_share` of every head, ``(n_layers, n_heads)`` float32:
        :func:`attnscope.core.analysis.explain.positional_share_grid`."""
        return _why.positional_share_grid(
            self, short_tokens=short_tokens, max_rows=max_rows, progress=progress, cancelled=cancelled
        )

    def source_split(self, layer: int, head: int, query: int, key: int, *, top: int = 10) -> SourceSplit:
        """The score split by the components (embedding, each earlier head, each MLP) that wrote the query
        and the key, norm scales frozen; one forward of the prefix:
        :func:`attnscope.core.analysis.qk_sources.source_split`."""
        return _sources.source_split(self, layer, head, query, key, top=top)


class Session(AnalysisMethods, _CoreSession):
    """A loaded model plus one running sequence, with the analyses as methods (``attnscope.Session``).

    Everything of :class:`attnscope.core.session.Session` (``load``, ``prefill``, ``step``,
    ``weights``, ...; ``Session.load()`` returns this class) plus :class:`AnalysisMethods`::

        s = Session.load()
        s.prefill("When Mary and John went to the store, John gave a drink to", chat_template=False)
        t = s.make_target("logit_diff", token=" Mary", other=" John")
        s.head_effects(t).top(3)             # [(layer, head, effect), ...]
        s.explain(9, 4, 14, 13).bands        # the score split by rotary band
    """
