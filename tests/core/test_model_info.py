"""ModelInfo from a config (core.loading.resolve.info_from_config): missing geometry is one clear
refusal, not a TypeError from ``None // int`` (found by mypy)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from attnscope.core.errors import ModelLoadError
from attnscope.core.loading.model_info import info_from_config

LLAMA = dict(
    model_type="llama",
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=64,
    max_position_embeddings=128,
    vocab_size=100,
)


def test_geometry_read_from_the_config():
    info = info_from_config(SimpleNamespace(**LLAMA), "tiny", "/m", "float32")
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim, info.hidden_size) == (
        2,
        4,
        2,
        16,
        64,
    )
    assert info.max_context == 128


@pytest.mark.parametrize("key", ["num_attention_heads", "num_hidden_layers", "hidden_size"])
def test_missing_geometry_is_one_refusal(key):
    cfg = SimpleNamespace(**{k: v for k, v in LLAMA.items() if k != key})
    with pytest.raises(ModelLoadError, match=f"^cannot read tiny: its config gives no {key}$"):
        info_from_config(cfg, "tiny", "/m", "float32")


def test_no_context_length_reads_as_zero():
    cfg = SimpleNamespace(**{**LLAMA, "max_position_embeddings": None, "n_positions": None})
    assert info_from_config(cfg, "tiny", "/m", "float32").max_context == 0
