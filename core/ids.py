"""Checking what callers hand the model as token ids: one flat sequence of ints, one sequence at a time.

AttnScope runs one unpadded sequence (batch 1): its Trace keeps one set of query rows per layer and
its maps have one set of token labels. A batch of prompts, a nested id list or a padding mask is
refused with one line here and in the attention function (:mod:`attnscope.core.backends.torch_backend`),
never silently run with the padding dropped (docs/python-api.md, tests/core/test_padding.py).
"""

from __future__ import annotations

import numbers

BATCH_REFUSAL = "AttnScope runs one sequence at a time: batches and padding masks are not supported; run the prompts one by one"


def as_token_ids(ids, vocab_size: int | None = None) -> list[int]:
    """``ids`` as a list of Python ints.

    Args:
        ids: a flat sequence of integers (list, tuple, 1-d numpy array or 1-d torch tensor).
        vocab_size: when given, every id must lie in ``0 .. vocab_size - 1``.

    Raises:
        ValueError: a nested sequence (a batch), a non-integer entry, or an id out of range;
            one line each.
    """
    if isinstance(ids, (str, bytes)):
        raise ValueError("token ids must be integers, got a string: tokenize it first")
    shape = getattr(ids, "shape", None)
    if shape is not None and len(shape) != 1:
        raise ValueError(f"token ids must be one flat sequence, got shape {tuple(shape)}: {BATCH_REFUSAL}")
    try:
        items = list(ids)
    except TypeError:
        raise ValueError(f"token ids must be a sequence of integers, got {type(ids).__name__}") from None
    out = []
    for t in items:
        if hasattr(t, "item") and getattr(t, "ndim", 0) == 0:
            t = t.item()
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            if isinstance(t, (list, tuple)) or getattr(t, "ndim", 0) != 0:
                raise ValueError(f"token ids must be one flat sequence, got a nested one: {BATCH_REFUSAL}")
            raise ValueError(f"token ids must be integers, got {type(t).__name__} {t!r}")
        out.append(int(t))
    if vocab_size is not None:
        bad = [t for t in out if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary (0..{vocab_size - 1})")
    return out
