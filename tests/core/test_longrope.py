"""RoPE whose frequencies depend on the sequence length (Phi-3 LongRoPE, dynamic NTK)
across prefill chunks, decode steps and step back.

Right value: after every command, the session's logits and every head's weights equal ONE eager
forward of transformers over the whole sequence so far (what the model computes in one pass).
"""

from __future__ import annotations

import copy

import attnscope.core.backends.torch_backend as tb
import numpy as np
import pytest
import torch
from attnscope.core.attention.rope_length import RopeRecompute
from attnscope.core.session import Session
from tiny_models import COMMON, eager_reference, tiny_tokenizer

TOL = 1e-5
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _save(folder, model_type, seed=0, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **dict(COMMON, **kw))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def _phi3_longrope(folder):
    # a tiny Phi-3 LongRoPE config: 2 layers, 4 heads, 2 KV heads, head_dim 16, theta 1e4, switch past 32 tokens
    return _save(
        folder,
        "phi3",
        rope_theta=1e4,
        original_max_position_embeddings=32,
        max_position_embeddings=256,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0] * 8,
            "long_factor": [float(x) for x in np.geomspace(1, 40, 8)],
        },
    )


def _prompt(s: Session, n: int) -> str:
    text = LETTERS[:n]
    assert len(s.encode(text, chat_template=False)) == n
    return text


def _assert_equals_one_forward(s: Session, ref_model, what: str):
    logits, attn = eager_reference(ref_model, s.ids)
    np.testing.assert_allclose(s.logits, logits[-1], atol=TOL, rtol=0, err_msg=f"logits {what}")
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            np.testing.assert_allclose(
                s.weights(layer, head),
                attn[layer][head],
                atol=TOL,
                rtol=0,
                err_msg=f"weights layer {layer} head {head} {what}",
            )
    return logits


@pytest.mark.slow
def test_issue_sample_phi3_longrope_prompt_24_then_16_greedy_steps(tmp_path):
    ref = _phi3_longrope(tmp_path / "phi3")
    s = Session.load(str(tmp_path / "phi3"))
    s.prefill(_prompt(s, 24), chat_template=False)
    _assert_equals_one_forward(s, ref, "after prefill")
    assert s.notices == []
    for step in range(16):
        logits_before = eager_reference(ref, s.ids)[0][-1]
        (tok,) = s.step(1)
        assert tok.id == int(np.argmax(logits_before)), f"greedy token at step {step}"
        _assert_equals_one_forward(s, ref, f"after step {step + 1} ({s.seq_len} tokens)")
    assert s.seq_len == 40
    # exactly one recompute, when the sequence passed original_max_position_embeddings = 32
    assert len(s.notices) == 1 and isinstance(s.notices[0], RopeRecompute)
    n = s.notices[0]
    assert (n.position, n.length, n.rope_type) == (32, 33, "longrope")
    assert "recomputed" in str(n) and "\n" not in str(n)
    assert s.snapshot().notices == (str(n),)  # what the GUI thread receives


def test_longrope_step_back_across_the_switch_and_forward_again(tmp_path):
    ref = _phi3_longrope(tmp_path / "phi3")
    s = Session.load(str(tmp_path / "phi3"))
    s.prefill(_prompt(s, 30), chat_template=False)
    s.step(6)  # 36 tokens: long factors
    assert len(s.notices) == 1
    s.step_back(5)  # 31 tokens: short factors again, the cache is re-run
    assert s.seq_len == 31 and len(s.notices) == 2 and s.notices[1].length == 31
    _assert_equals_one_forward(s, ref, "after step back to 31")
    s.step(3)
    _assert_equals_one_forward(s, ref, "after stepping on to 34")
    # a new prompt forgets the notices
    s.prefill(_prompt(s, 10), chat_template=False)
    assert s.notices == []


@pytest.mark.parametrize("chunk", [7, 16, 33])
def test_longrope_prefill_in_chunks_crossing_the_switch(tmp_path, monkeypatch, chunk):
    # every chunk runs with the frequencies of the whole prompt (40 > 32: long), not its own length
    monkeypatch.setattr(tb, "PREFILL_CHUNK", chunk)
    ref = _phi3_longrope(tmp_path / "phi3")
    s = Session.load(str(tmp_path / "phi3"))
    s.prefill(_prompt(s, 40), chat_template=False)
    _assert_equals_one_forward(s, ref, f"chunked prefill ({chunk})")
    assert s.notices == []  # a prefill starts from an empty cache: nothing to recompute
    s.feed([5, 6, 7])
    _assert_equals_one_forward(s, ref, "after feeding 3 ids")


@pytest.mark.slow
def test_dynamic_ntk_rope_every_step_past_the_context(tmp_path):
    # dynamic NTK changes its base at every length past max_position_embeddings (16 here)
    init = _save(
        tmp_path / "llama",
        "llama",
        max_position_embeddings=16,
        rope_scaling={"type": "dynamic", "factor": 4.0},
    )
    s = Session.load(str(tmp_path / "llama"))
    s.info = s.backend.info = type(s.info)(**{**s.info.__dict__, "max_context": 0})  # test beyond the context
    s.prefill(_prompt(s, 12), chat_template=False)
    for _ in range(8):
        s.step(1)
        # a fresh copy of the model: transformers' dynamic RoPE keeps the longest length it has seen
        _assert_equals_one_forward(s, copy.deepcopy(init), f"{s.seq_len} tokens")
    assert [n.length for n in s.notices] == [17, 18, 19, 20]  # one re-run per step past 16
    assert all(n.rope_type == "dynamic" for n in s.notices)


def test_plain_rope_models_never_recompute(tmp_path):
    ref = _save(tmp_path / "llama", "llama")
    s = Session.load(str(tmp_path / "llama"))
    assert not s.backend.rope.active
    s.prefill(_prompt(s, 20), chat_template=False)
    s.step(4)
    _assert_equals_one_forward(s, ref, "plain RoPE")
    assert s.notices == []


def test_mlx_refuses_length_dependent_rope_with_the_reason():
    pytest.importorskip("mlx.core")
    from attnscope.core.backends.mlx_arch import ModelArgs
    from attnscope.core.errors import UnsupportedModelError

    cfg = dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=272,
        max_position_embeddings=16,
        rms_norm_eps=1e-6,
    )
    for rope in (
        {"type": "dynamic", "factor": 4.0},
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 8,
            "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 8,
        },
    ):
        with pytest.raises(UnsupportedModelError, match=rope.get("type", rope.get("rope_type"))) as info:
            ModelArgs.from_dict(dict(cfg, rope_scaling=rope))
        assert "\n" not in str(info.value)


def test_chunked_attention_is_refused_past_one_chunk(tmp_path):
    # another config field whose effect depends on the length: Llama 4's chunked attention equals
    # causal attention up to attention_chunk_size tokens, and differs beyond; refused there
    from attnscope.core.errors import UnsupportedModelError

    ref = _save(
        tmp_path / "llama",
        "llama",
        attention_chunk_size=8,
        layer_types=["chunked_attention", "full_attention"],
    )
    s = Session.load(str(tmp_path / "llama"))
    assert s.backend.attention_chunk == 8
    s.prefill(_prompt(s, 6), chat_template=False)
    s.step(2)  # 8 tokens: one chunk, still exact
    _assert_equals_one_forward(s, ref, "within one chunk")
    with pytest.raises(UnsupportedModelError) as info:
        s.step(1)
    assert "attention_chunk_size" in str(info.value) and "\n" not in str(info.value)
    assert s.seq_len == 8
    with pytest.raises(UnsupportedModelError):
        s.prefill(_prompt(s, 9), chat_template=False)
