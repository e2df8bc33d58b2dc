"""Shared by tests/core/test_softcap.py and tests/core/test_learned_sinks.py (not a test module): a tiny random
gemma2 / gpt_oss model run through a Session as the app runs it (chunked prefill, greedy decode steps,
step back), and transformers eager on the whole sequence at once."""

from __future__ import annotations

import numpy as np
from tiny_models import FAMILIES, save_tiny, tiny_tokenizer

# printable ASCII, one token per byte with the tiny byte-level tokenizer (no " t" pair: one merge)
TEXT = "Once upon a midnight dreary, while I pondered, weak and weary, over many a quaint and curious volume."


def prompt_of(n: int) -> str:
    """A prompt of exactly ``n`` tokens for the tiny tokenizer (checked by :func:`run_session`)."""
    base = TEXT.replace(" t", " T")
    return (base * (n // len(base) + 1))[:n]


def save_family(family: str, folder, **overrides):
    """Save a tiny ``family`` model (config overrides such as ``max_position_embeddings``); return eager."""
    if not overrides:
        return save_tiny(family, folder)
    import copy

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kw = FAMILIES[family]
    cfg = AutoConfig.for_model(model_type, **(copy.deepcopy(kw) | overrides))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def run_session(folder, n_prompt: int, n_steps: int = 8):
    """Load ``folder`` with AttnScope's attention, prefill ``n_prompt`` tokens, decode ``n_steps`` greedily."""
    from attnscope.core.session import Session

    s = Session.load(str(folder), device="cpu")
    s.prefill(prompt_of(n_prompt), chat_template=False)
    assert s.seq_len == n_prompt
    s.step(n_steps)
    return s


def eager_full(model, ids):
    """Eager on the whole sequence: ``(logits (T, V), weights [per layer (H, T, T)])`` float64 numpy."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return out.logits[0].double().numpy(), [a[0].double().numpy() for a in out.attentions]


def assert_weights_equal_eager(s, ref_att, atol: float = 1e-5) -> float:
    """Every layer's and head's trace weights equal eager's to ``atol``; returns the worst difference."""
    worst = 0.0
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            w = s.weights(layer, head)
            d = float(np.abs(w - ref_att[layer][head]).max())
            worst = max(worst, d)
            assert d < atol, f"L{layer} H{head}: {d}"
    return worst


def assert_step_back_repeats(s, n_back: int = 3) -> None:
    """Step back ``n_back`` tokens, feed the same ones: every head's weights come back the same."""
    before = [[s.weights(la, h) for h in range(s.info.n_heads)] for la in range(s.info.n_layers)]
    again = s.ids[-n_back:]
    s.step_back(n_back)
    assert s.seq_len == len(before[0][0]) - n_back
    s.feed(again)
    for la in range(s.info.n_layers):
        for h in range(s.info.n_heads):
            np.testing.assert_allclose(s.weights(la, h), before[la][h], atol=1e-6, err_msg=f"L{la} H{h}")
