"""Every decoder family AttnScope claims runs through its attention path exactly like transformers eager.

For each family a tiny random model is saved to a folder, loaded with :meth:`Session.load`
(AttnScope's registered attention), and fed in three ways the app uses: a prefill chunk, a second
chunk attending to the cached keys (L < S, the masked kernel path), and single-token decode steps.
Logits and every head's weights (from the Trace: exp(q·k·scale + mask − lse)) must equal
transformers eager on the whole sequence at once. Families whose attention needs something the
path does not do are refused with the exact reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.errors import UnsupportedModelError
from tiny_models import FAMILIES, eager_reference, save_tiny, tiny_config

IDS = list(range(5, 45))  # 40 tokens: 10x the sliding window of 4


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_eager(family, tmp_path):
    from attnscope.core.loading.catalog import describe_hf_folder
    from attnscope.core.session import Session

    folder = tmp_path / family
    ref = save_tiny(family, folder)
    s = Session.load(str(folder))
    be = s.backend
    logits = np.concatenate(
        [
            be.forward(IDS[:20], all_logits=True),  # prefill
            be.forward(IDS[20:37], all_logits=True),  # a second chunk over cached keys
            *[be.forward([i], all_logits=True) for i in IDS[37:]],  # decode steps
        ]
    )
    ref_logits, ref_att = eager_reference(ref, IDS)
    assert np.abs(logits - ref_logits).max() < 1e-4
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            w = s.trace.weights(layer, head)
            np.testing.assert_allclose(
                w, ref_att[layer][head], atol=1e-5, err_msg=f"{family} L{layer} H{head}"
            )
    # the catalog reads the same geometry from config.json alone
    e = describe_hf_folder(folder)
    assert e.supported, e.reason
    assert (e.architecture, e.n_layers, e.n_heads, e.n_kv_heads, e.head_dim) == (
        s.info.architecture,
        s.info.n_layers,
        s.info.n_heads,
        s.info.n_kv_heads,
        s.info.head_dim,
    )
    assert e.n_params == sum(p.numel() for p in ref.parameters())
    assert e.group_size == s.info.n_heads // s.info.n_kv_heads


def test_sliding_window_is_applied():
    """Guard against a silently ignored window: mistral's window of 4 must change the weights."""
    ref = tiny_model_with_window(None), tiny_model_with_window(4)
    _, full = eager_reference(ref[0], IDS)
    _, windowed = eager_reference(ref[1], IDS)
    assert np.count_nonzero(windowed[0][0][10, :]) == 4  # row 10 sees keys 7..10 only
    assert np.count_nonzero(full[0][0][10, :]) == 11


def tiny_model_with_window(window):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_config("mistral")
    cfg.sliding_window = window
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def test_mistral_window_reaches_the_trace(tmp_path):
    from attnscope.core.session import Session

    save_tiny("mistral", tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.backend.forward(IDS[:12])
    w = s.trace.weights(0, 0)
    assert np.count_nonzero(w[10]) == 4
    assert s.trace.allowed(0)[10].tolist() == [j in (7, 8, 9, 10) for j in range(12)]


def test_gemma3_with_vision_tower_refused():
    from attnscope.core.loading.resolve import check_config

    with pytest.raises(UnsupportedModelError, match="vision tower"):
        check_config({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})
