"""Attnscope.core.loading.catalog.config_geometry reads configs with transformers' own defaults."""

import pytest
from attnscope.core.loading.describe_model import config_geometry, transformers_config

QWEN2 = dict(
    model_type="qwen2",
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    hidden_size=512,
    max_position_embeddings=32768,
    sliding_window=4096,
    max_window_layers=2,
)


def test_qwen2_without_use_sliding_window_has_no_window():
    assert config_geometry(QWEN2)["sliding_window"] is None
    conf = transformers_config(QWEN2)
    assert conf.use_sliding_window is False  # what transformers assumes


def test_qwen2_with_use_sliding_window_true():
    g = config_geometry({**QWEN2, "use_sliding_window": True})
    assert g["sliding_window"] == 4096  # layers 2, 3 (>= max_window_layers) slide
    # on, but no layer reaches max_window_layers: transformers slides nowhere
    assert (
        config_geometry({**QWEN2, "use_sliding_window": True, "max_window_layers": 8})["sliding_window"]
        is None
    )


@pytest.mark.parametrize(
    ("cfg", "field", "value"),
    [
        # Gemma 3 without head_dim: transformers' default 256, not hidden // heads = 160
        (
            dict(
                model_type="gemma3_text",
                num_hidden_layers=6,
                num_attention_heads=4,
                num_key_value_heads=1,
                hidden_size=640,
            ),
            "head_dim",
            256,
        ),
        # Mistral without sliding_window: transformers' default 4096
        (
            dict(
                model_type="mistral",
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                hidden_size=64,
            ),
            "sliding_window",
            4096,
        ),
        # Llama without max_position_embeddings / num_key_value_heads: 2048 / the query heads
        (
            dict(model_type="llama", num_hidden_layers=2, num_attention_heads=4, hidden_size=64),
            "max_context",
            2048,
        ),
        (
            dict(model_type="llama", num_hidden_layers=2, num_attention_heads=4, hidden_size=64),
            "n_kv_heads",
            4,
        ),
        (
            dict(model_type="llama", num_hidden_layers=2, num_attention_heads=4, hidden_size=64),
            "head_dim",
            16,
        ),
        # Gemma 3 with an explicit window on some layers
        (
            dict(
                model_type="gemma3_text",
                num_hidden_layers=6,
                num_attention_heads=4,
                num_key_value_heads=1,
                hidden_size=640,
                head_dim=256,
                sliding_window=512,
            ),
            "sliding_window",
            512,
        ),
        # a multimodal config: the text config's geometry
        (
            dict(
                model_type="gemma3",
                text_config=dict(
                    model_type="gemma3_text",
                    num_hidden_layers=3,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    hidden_size=64,
                    head_dim=16,
                ),
            ),
            "n_layers",
            3,
        ),
    ],
)
def test_omitted_fields_take_transformers_defaults(cfg, field, value):
    assert config_geometry(cfg)[field] == value


def test_matches_the_loaded_models_info():
    """The catalog and the loader read one config object: same geometry."""
    from attnscope.core.loading.model_info import info_from_config
    from transformers import AutoConfig

    for cfg in (
        QWEN2,
        {**QWEN2, "use_sliding_window": True, "max_window_layers": 0},
        dict(
            model_type="mistral",
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=64,
            vocab_size=100,
        ),
    ):
        conf = AutoConfig.for_model(**cfg)
        info = info_from_config(conf, "x", "x", "float32")
        g = config_geometry(cfg)
        assert (g["n_layers"], g["n_heads"], g["n_kv_heads"], g["head_dim"], g["max_context"]) == (
            info.n_layers,
            info.n_heads,
            info.n_kv_heads,
            info.head_dim,
            info.max_context,
        )
        assert g["sliding_window"] == (
            info.sliding_window
            if any("sliding" in t for t in (getattr(conf, "layer_types", None) or ["sliding"]))
            else None
        )


def test_unknown_family_is_read_as_written():
    g = config_geometry(
        dict(
            model_type="not-a-model",
            num_hidden_layers=3,
            num_attention_heads=2,
            hidden_size=32,
            sliding_window=64,
        )
    )
    assert g == dict(n_layers=3, n_heads=2, n_kv_heads=2, head_dim=16, max_context=0, sliding_window=64)
    assert (
        config_geometry(
            dict(
                num_hidden_layers=3,
                num_attention_heads=2,
                hidden_size=32,
                sliding_window=64,
                max_window_layers=1,
            )
        )["sliding_window"]
        is None
    )  # a Qwen2-style file
