"""Why a head attends on Phi-3 LongRoPE past its original context: the band split and the source split
use the frequencies the stored scores were computed with (the long factors once the sequence passes
``original_max_position_embeddings``, for every position, as one transformers forward over the whole
sequence picks them: Ding et al. 2024, "LongRoPE"; :mod:`attnscope.core.attention.rope_length`).

References: the wavelengths against ``2π · factor_i · θ^(2i/d)`` from the config; the rotated-back q and k
against the pre-RoPE ``qkv_proj`` outputs of one plain eager transformers forward over the whole sequence;
the source split's table against the Trace's stored score.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_models import COMMON, tiny_tokenizer

ORIGINAL = 32  # original_max_position_embeddings: long factors from 33 tokens on
SHORT = [1.0] * 8
LONG = [float(x) for x in np.geomspace(1, 40, 8)]
THETA = 1e4
HEAD_DIM = COMMON["hidden_size"] // COMMON["num_attention_heads"]  # 16: 8 rotated pairs


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _phi3_longrope(folder):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "phi3",
        **dict(
            COMMON,
            rope_theta=THETA,
            original_max_position_embeddings=ORIGINAL,
            max_position_embeddings=256,
            rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
        ),
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def _ids(n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(1).integers(5, 260, n)]


def _wavelengths(factors) -> np.ndarray:
    i = np.arange(HEAD_DIM // 2)
    return np.sort(2 * math.pi * np.asarray(factors) * THETA ** (2 * i / HEAD_DIM))


def _hooked_pre_rope(ref, layer, ids):
    """``(q (H, T, D), k (Hkv, T, D))`` float64: the fused projection's q and k, before RoPE."""
    attn = ref.model.layers[layer].self_attn
    got = {}
    h = attn.qkv_proj.register_forward_hook(lambda _m, _a, out: got.update(qkv=out.detach()))
    try:
        with torch.no_grad():
            ref(torch.tensor([ids]))
    finally:
        h.remove()
    cfg, T = ref.config, len(ids)
    nq, nk = cfg.num_attention_heads * HEAD_DIM, cfg.num_key_value_heads * HEAD_DIM
    q, k = got["qkv"][0, :, :nq], got["qkv"][0, :, nq : nq + nk]
    return (
        q.reshape(T, -1, HEAD_DIM).transpose(0, 1).double().numpy(),
        k.reshape(T, -1, HEAD_DIM).transpose(0, 1).double().numpy(),
    )


def test_bands_use_the_long_factors_past_the_original_context(tmp_path):
    from attnscope.core.analysis.explain import cell_bands, rope_layout, row_bands, unrotate
    from attnscope.core.session import Session

    ref = _phi3_longrope(tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.prefill(_ids(24))  # inside the original context: the short factors
    assert np.allclose(rope_layout(s, 1).wavelength, _wavelengths(SHORT), rtol=1e-5)
    ids = _ids(48)
    s.prefill(ids)  # past it: the long factors, for every position
    lay = rope_layout(s, 1)
    assert np.allclose(lay.wavelength, _wavelengths(LONG), rtol=1e-5)
    assert not np.allclose(lay.wavelength, _wavelengths(SHORT), rtol=1e-2)
    pos = np.arange(len(ids))
    for layer in range(s.info.n_layers):
        q_ref, k_ref = _hooked_pre_rope(ref, layer, ids)
        rec = s.trace._rec(layer)
        q = unrotate(s, layer, rec.q().double().numpy(), pos)
        k = unrotate(s, layer, rec.keys.double().numpy(), pos)
        for got, want in ((q, q_ref), (k, k_ref)):  # LongRoPE's attention scaling undone too
            assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
    for i, j in [(47, 3), (20, 5), (40, 39)]:  # queries before and after position 32
        b = cell_bands(s, 1, 2, i, j)
        stored = float(s.trace.scores(1, 2, slice(i, i + 1), slice(j, j + 1), raw=True)[0, 0])
        assert b.total == pytest.approx(stored, rel=1e-6, abs=1e-6)
        assert b.wavelengths[0] == pytest.approx(2 * math.pi * LONG[0], rel=1e-5)
    w = s.weights(1, 2, slice(47, 48))[0].astype(np.float64)
    want = sum(w[j] * np.array(cell_bands(s, 1, 2, 47, j).parts) for j in range(48))
    assert np.allclose(row_bands(s, 1, 2, 47).parts, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("query,key", [(20, 5), (45, 7)])
def test_source_split_past_the_original_context_adds_up_to_the_stored_score(tmp_path, query, key):
    """A prefix inside the original context (query 20) of a sequence past it: the prefix's forward must
    rotate with the whole sequence's (long) frequencies, as the stored score was."""
    from attnscope.core.analysis.qk_sources import source_split
    from attnscope.core.session import Session

    _phi3_longrope(tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.prefill(_ids(48))
    r = source_split(s, 1, 2, query, key, top=5)
    stored = float(s.trace.scores(1, 2, slice(query, query + 1), slice(key, key + 1), raw=True)[0, 0])
    assert abs(r.score - stored) <= 1e-6 * max(1.0, abs(stored))
    assert abs(r.total - stored) <= 1e-4 * abs(stored)
    assert abs(sum(p[2] for p in r.pairs) + r.rest - stored) <= 1e-4 * abs(stored)
