"""RoPE whose frequencies depend on the sequence length (Phi-3 LongRoPE, dynamic NTK), for the torch backend.

transformers picks these frequencies per forward call from that call's largest position
(``modeling_rope_utils.dynamic_rope_update``):

* ``longrope``: the short factors while ``max position + 1 <= original_max_position_embeddings``,
  the long ones beyond (Ding et al. 2024, "LongRoPE"; Phi-3);
* ``dynamic`` (NTK-aware scaling): the base grows with the length once it passes
  ``max_position_embeddings`` (transformers keeps the largest length seen so far).

A model that runs a sequence in pieces (AttnScope's 512-token prefill chunks, then one decode step
at a time) would rotate early keys with one set of frequencies and later queries with another, and
the weights would no longer be what one forward over the whole sequence computes (tests/core/test_longrope.py:
weights off by up to 0.3, greedy tokens diverge, no warning).

:class:`LengthDependentRope` fixes the kind, not the one family:

* every rotary module of the model is made to use the frequencies of the *whole* sequence the
  forward will reach (``target``), for every chunk, by letting transformers' own update see one
  extra position ``target − 1`` and dropping that row from its cos/sin;
* :meth:`LengthDependentRope.key` is the set of frequencies (and attention scaling) at a length;
  when the key of the new length differs from the one the KV cache was built with, the backend
  recomputes the cache from position 0 (a re-prefill, as transformers' Phi-3 ``generate`` does at
  the switch) and records a :class:`RopeRecompute` notice that the session and GUI show.

For LongRoPE that happens once, at ``original_max_position_embeddings + 1`` tokens (and again when
stepping back below it); for dynamic NTK at every length past ``max_position_embeddings``, so each
step there re-runs the whole sequence (exact, and slower: the notice says so).
"""

from __future__ import annotations

from dataclasses import dataclass

LENGTH_DEPENDENT = ("longrope", "dynamic")  # rope types whose frequencies depend on the length


@dataclass(frozen=True)
class RopeRecompute:
    """One recompute of the KV cache because length-dependent RoPE frequencies changed.

    Attributes:
        position: the sequence length the cache held before (positions ``0 .. position − 1``).
        length: the length it was recomputed to (every position ``0 .. length − 1`` re-run).
        rope_type: e.g. ``"longrope"`` or ``"dynamic"``.
        reason: one line for the user.
    """

    position: int
    length: int
    rope_type: str
    reason: str

    def __str__(self) -> str:
        return self.reason


def _is_length_dependent(rope_type) -> bool:
    return isinstance(rope_type, str) and any(t in rope_type for t in LENGTH_DEPENDENT)


def rope_types(module) -> dict:
    """``{layer_type or None: rope_type}`` of one rotary module (transformers 5 keeps a dict per layer type)."""
    rt = getattr(module, "rope_type", None)
    return dict(rt) if isinstance(rt, dict) else {None: rt}


class LengthDependentRope:
    """The length-dependent rotary modules of one torch model, driven to one target length.

    Args:
        model: a transformers model; its rotary modules (``rope_type`` among
            :data:`LENGTH_DEPENDENT`) get a wrapped ``forward``.

    ``active`` is False (and nothing is wrapped) when the model has no such module.
    """

    def __init__(self, model):
        self.modules = []
        self.target: int | None = None
        for mod in model.modules():
            types = rope_types(mod)
            if hasattr(mod, "original_inv_freq") or any(
                hasattr(mod, f"{lt}_original_inv_freq") for lt in types if lt
            ):
                if any(_is_length_dependent(t) for t in types.values()):
                    self.modules.append(mod)
                    self._wrap(mod)
        self.kind = ", ".join(
            sorted({t for m in self.modules for t in rope_types(m).values() if _is_length_dependent(t)})
        )
        self._dtype = getattr(model, "dtype", None)

    @property
    def active(self) -> bool:
        return bool(self.modules)

    def _wrap(self, mod) -> None:
        import torch

        original = mod.forward
        owner = self

        def forward(x, position_ids, *args, **kwargs):
            target = owner.target
            if target is None:
                return original(x, position_ids, *args, **kwargs)
            _reset_dynamic(mod)  # dynamic NTK: frequencies of this target only, not of the longest seen
            extra = torch.full(
                (position_ids.shape[0], 1), target - 1, dtype=position_ids.dtype, device=position_ids.device
            )
            cos, sin = original(x, torch.cat([position_ids, extra], dim=1), *args, **kwargs)
            return cos[:, :-1], sin[:, :-1]  # (B, L, D): drop the extra position's row

        mod.forward = forward

    def key(self, length: int, device="cpu") -> tuple:
        """What the frequencies are at ``length`` positions: a hashable tuple of every length-dependent
        module's ``inv_freq`` bytes and attention scaling (equal tuples, identical rotations)."""
        import torch

        if not self.active:
            return ()
        saved, self.target = self.target, length
        out = []
        try:
            with torch.inference_mode():
                for mod in self.modules:
                    x = torch.zeros(1, device=device, dtype=self._dtype or torch.float32)
                    pos = torch.zeros((1, 1), dtype=torch.long, device=device)
                    for lt, rt in rope_types(mod).items():
                        if not _is_length_dependent(rt):
                            continue
                        mod(x, pos) if lt is None else mod(x, pos, lt)
                        prefix = "" if lt is None else f"{lt}_"
                        out.append(getattr(mod, f"{prefix}inv_freq").detach().cpu().numpy().tobytes())
                        out.append(
                            float(
                                getattr(
                                    mod, f"{prefix}attention_scaling", getattr(mod, "attention_scaling", 1.0)
                                )
                            )
                        )
        finally:
            self.target = saved
        return tuple(out)

    def notice(self, position: int, length: int) -> RopeRecompute:
        """The line the session shows after a recompute from ``position`` to ``length`` tokens."""
        if "longrope" in self.kind:
            why = "LongRoPE switches between its short and long factors at this length"
        else:
            why = f"{self.kind} RoPE frequencies change with the sequence length past the model's context"
        return RopeRecompute(
            position,
            length,
            self.kind,
            f"{why}: the KV cache was recomputed for all {length} tokens (was {position}) "
            "so every map equals one forward over the whole sequence",
        )


def _reset_dynamic(mod) -> None:
    """Put a dynamic-NTK rotary module back to its original frequencies (transformers only ever grows
    them within a process, so a shorter sequence after a longer one would keep the longer's)."""
    for lt, rt in rope_types(mod).items():
        if not (isinstance(rt, str) and "dynamic" in rt):
            continue
        prefix = "" if lt is None else f"{lt}_"
        orig = getattr(mod, f"{prefix}original_inv_freq", None)
        omax = getattr(mod, "original_max_seq_len", None)
        if orig is None or omax is None:
            continue
        mod.register_buffer(f"{prefix}inv_freq", orig, persistent=False)
        setattr(mod, f"{prefix}max_seq_len_cached", omax)
