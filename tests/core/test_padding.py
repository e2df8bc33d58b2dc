"""Padding masks and batches are refused with one line at every public entry point,
never run with the padding silently dropped.

AttnScope's Trace holds one sequence; the registered attention function now sits in transformers'
AttentionMaskInterface too, so a caller's padding mask reaches it (before, transformers passed
``attention_mask=None`` and a left-padded batch gave silently wrong logits).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.errors import SessionError, UnsupportedModelError
from attnscope.core.ids import as_token_ids
from attnscope.core.session import Session
from tiny_models import save_tiny

FAMILIES = ["llama", "gemma3_text", "qwen2", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def session(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_tiny(request.param, folder)
    return Session.load(str(folder))


def _one_line(exc_info, *words):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


def test_mask_function_is_registered():
    from attnscope.core.backends.torch_backend import ATTN_NAME, attnscope_mask, register_attention
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    register_attention()
    assert ALL_MASK_ATTENTION_FUNCTIONS[ATTN_NAME] is attnscope_mask
    ones = torch.ones(1, 6, dtype=torch.bool)
    assert attnscope_mask(1, 2, 6, attention_mask=ones) is None and attnscope_mask(1, 2, 6) is None
    left = torch.tensor([[False, True, True, True, True, True]])
    assert attnscope_mask(1, 2, 6, attention_mask=left) is not None
    assert attnscope_mask(1, 2, 5, attention_mask=left) is None  # a window of the last 5 keys: no pad left


def test_model_called_with_a_padding_mask_is_refused(session):
    model = session.backend.model
    ids = torch.tensor([[0, 0, 40, 41, 42], [43, 44, 45, 46, 47]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad(), pytest.raises(UnsupportedModelError) as info:
        model(input_ids=ids, attention_mask=mask)
    _one_line(info, "padding mask", "one sequence at a time")
    # one left-padded sequence: refused as well (its logits would be wrong, not just unlabelled)
    with torch.no_grad(), pytest.raises(UnsupportedModelError) as info:
        model(input_ids=ids[:1], attention_mask=mask[:1])
    _one_line(info, "padding mask")


def test_all_ones_mask_runs_and_equals_no_mask(session):
    model = session.backend.model
    session.backend.trace.enabled = False
    try:
        ids = torch.tensor([[40, 41, 42, 43, 44, 45]])
        with torch.no_grad():
            a = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            b = model(input_ids=ids).logits
        assert torch.equal(a, b)
    finally:
        session.backend.trace.enabled = True


def test_custom_4d_mask_and_batches_are_refused(session):
    model = session.backend.model
    ids = torch.tensor([[40, 41, 42, 43]])
    four_d = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    with torch.no_grad(), pytest.raises(UnsupportedModelError) as info:
        model(input_ids=ids, attention_mask=four_d)
    _one_line(info, "custom attention mask")
    session.backend.reset()
    with torch.no_grad(), pytest.raises(UnsupportedModelError) as info:  # equal lengths, no padding, trace on
        model(input_ids=ids.repeat(2, 1))
    _one_line(info, "batch of 2 sequences")


def test_session_entry_points_refuse_batches_with_one_line(session):
    for prompts in (["one prompt", "two prompts"], ("a", "b"), [["x"]]):
        with pytest.raises(SessionError) as info:
            session.prefill(prompts, chat_template=False)
        _one_line(info, "one prompt", "one sequence at a time")
    session.prefill("hello there", chat_template=False)
    n = session.seq_len
    with pytest.raises(SessionError) as info:
        session.feed([[40, 41], [42, 43]])
    _one_line(info, "flat")
    with pytest.raises(SessionError) as info:
        session.feed(np.array([[40, 41]]))
    _one_line(info, "shape (1, 2)")
    for bad in ("3", 2.5, [2], None):
        with pytest.raises(SessionError) as info:
            session.step(bad)
        _one_line(info, "whole number")
    assert session.seq_len == n  # nothing half-run
    session.step(2)
    assert session.seq_len == n + 2


def test_backend_forward_refuses_nested_ids(session):
    session.backend.reset()
    for bad in ([[40, 41], [42, 43]], torch.tensor([[40, 41]]), "abc", [40, 1.5]):
        with pytest.raises(ValueError) as info:
            session.backend.forward(bad)
        assert "\n" not in str(info.value)
    assert session.backend.seq_len == 0


def test_as_token_ids_accepts_flat_int_sequences():
    assert as_token_ids([1, 2, 3]) == [1, 2, 3]
    assert as_token_ids(np.array([4, 5], dtype=np.int64)) == [4, 5]
    assert as_token_ids(torch.tensor([6, 7])) == [6, 7]
    assert as_token_ids((np.int32(8),)) == [8]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        as_token_ids([1, 300], vocab_size=272)
    with pytest.raises(ValueError, match="integers"):
        as_token_ids([True])


def test_mlx_backend_refuses_nested_ids(tmp_path):
    pytest.importorskip("mlx.core")
    save_tiny("llama", tmp_path / "m")
    s = Session.load(str(tmp_path / "m"), backend="mlx")
    with pytest.raises(SessionError) as info:
        s.prefill(["a", "b"], chat_template=False)
    _one_line(info, "one prompt")
    with pytest.raises(ValueError) as info:
        s.backend.forward([[40, 41], [42, 43]])
    assert "\n" not in str(info.value) and s.backend.seq_len == 0
