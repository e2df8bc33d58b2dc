"""Our weights and logits against transformers' own attention on the real embedded model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

PROMPT_40 = (
    "In a quiet village by the sea, an old fisherman mended his nets every morning while the gulls "
    "circled above and the children ran along the shore."
)


@pytest.fixture(scope="module")
def reference_models(smol_folder):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(
        smol_folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    sdpa = AutoModelForCausalLM.from_pretrained(
        smol_folder, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    return eager, sdpa


def test_prompt_is_about_40_tokens(smol_session):
    ids = smol_session.encode(PROMPT_40, chat_template=False)
    assert 30 <= len(ids) <= 45


def test_weights_equal_eager_for_every_layer_and_head(smol_session, reference_models):
    eager, _ = reference_models
    s = smol_session
    s.prefill(PROMPT_40, chat_template=False)
    with torch.no_grad():
        ref = eager(torch.tensor([s.ids]), output_attentions=True).attentions
    assert len(ref) == s.info.n_layers == 30
    worst = 0.0
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            ours = s.weights(layer, head)
            theirs = ref[layer][0, head].numpy()
            assert ours.shape == theirs.shape == (s.seq_len, s.seq_len)
            worst = max(worst, float(np.abs(ours - theirs).max()))
    assert worst < 1e-5, worst


def test_logits_equal_sdpa(smol_session, reference_models):
    _, sdpa = reference_models
    s = smol_session
    s.prefill(PROMPT_40, chat_template=False)
    with torch.no_grad():
        ref = sdpa(torch.tensor([s.ids])).logits[0, -1].numpy()
    assert np.abs(s.logits - ref).max() < 1e-4
    assert int(np.argmax(s.logits)) == int(np.argmax(ref))


@pytest.mark.slow  # cached decode vs full recompute stays in the fast lane through tests/core/test_families.py
def test_decode_steps_equal_full_recompute(smol_session, reference_models):
    eager, _ = reference_models
    s = smol_session
    s.prefill(PROMPT_40, chat_template=False)
    n0 = s.seq_len
    new = s.step(5)
    assert len(new) == 5 and s.seq_len == n0 + 5 and s.n_generated == 5
    assert all(t.generated for t in new)
    # greedy: each generated id is the argmax of a full recompute over the tokens before it
    with torch.no_grad():
        out = eager(torch.tensor([s.ids]), output_attentions=True)
    for i, t in enumerate(new):
        assert t.id == int(out.logits[0, n0 + i - 1].argmax())
    for layer in (0, 7, 15, 29):
        for head in range(s.info.n_heads):
            np.testing.assert_allclose(
                s.weights(layer, head), out.attentions[layer][0, head].numpy(), atol=1e-5
            )


def test_rows_are_distributions_and_causal(smol_ran):
    w = smol_ran.weights(5, 2)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)
    assert np.all(np.triu(w, k=1) == 0.0)
    assert w[0, 0] == pytest.approx(1.0, abs=1e-6)


def test_tile_equals_full_map_slice(smol_ran):
    full = smol_ran.weights(12, 7)
    tile = smol_ran.weights(12, 7, rows=slice(10, 20), cols=slice(3, 15))
    np.testing.assert_allclose(tile, full[10:20, 3:15], atol=1e-6)  # float32 matmul blocking only


def test_step_back_truncates_and_matches(smol_session):
    s = smol_session
    s.prefill(PROMPT_40, chat_template=False)
    s.step(3)
    before = s.weights(4, 4)
    s.step(2)
    s.step_back(2)
    assert s.seq_len == before.shape[0]
    np.testing.assert_allclose(s.weights(4, 4), before, atol=1e-6)
    assert s.backend.kv_cache_bytes() == s.kv_cache_bytes()


@pytest.mark.slow
def test_chunked_prefill_equals_eager(smol_session, reference_models):
    """A prompt longer than one prefill chunk: later chunks attend to cached keys (L < S)."""
    from attnscope.core.backends.torch_backend import PREFILL_CHUNK

    eager, sdpa = reference_models
    s = smol_session
    prompt = " ".join([PROMPT_40] * 18)
    s.prefill(prompt, chat_template=False)
    assert s.seq_len > PREFILL_CHUNK + 50
    with torch.no_grad():
        ref = eager(torch.tensor([s.ids]), output_attentions=True)
    for layer in (0, 14, 29):
        for head in range(s.info.n_heads):
            np.testing.assert_allclose(
                s.weights(layer, head), ref.attentions[layer][0, head].numpy(), atol=1e-5
            )
    np.testing.assert_allclose(s.logits, ref.logits[0, -1].numpy(), atol=1e-4)
