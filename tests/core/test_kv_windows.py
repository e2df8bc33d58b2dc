"""KV-cache accounting with sliding windows: sliding layers need only their window,
AttnScope keeps every key; the config reader, the live figures, ``attnscope kv`` and Gemma 3 270M."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.cli.main import main
from attnscope.core.kv_formula import (
    KVConfig,
    compare_schemes,
    config_layer_windows,
    format_bytes,
    format_ranges,
    kv_cache_bytes,
    sliding_layers_from_spec,
    windows_from_spec,
    windows_spec,
)
from tiny_models import save_tiny, tiny_config

MB = 10**6
# Gemma 3 270M: 18 layers, 4 query heads, 1 KV head of 256; layers 5, 11, 17 global, the rest 512 keys
GEMMA_WINDOWS = tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))
GEMMA = KVConfig(18, 1, 256, n_heads=4, dtype="float32", windows=GEMMA_WINDOWS, name="gemma-3-270m")


def test_gemma_sample_input_needs_23_mb_not_46():
    # "46 MB at 1252 tokens and 1.21 GB at 32K, where the model needs about 23 MB and 0.22 GB"
    per = 2 * 1 * 256 * 4  # K + V, one KV head of 256, float32
    assert GEMMA.total_bytes(1252) == (3 * 1252 + 15 * 512) * per == 23_420_928
    assert GEMMA.without_windows().total_bytes(1252) == 18 * 1252 * per == 46_153_728
    assert GEMMA.total_bytes(32768) == (3 * 32768 + 15 * 512) * per == 217_055_232
    assert GEMMA.without_windows().total_bytes(32768) == 1_207_959_552
    assert [format_bytes(GEMMA.total_bytes(t)) for t in (1252, 32768)] == ["23.4 MB", "217 MB"]
    assert kv_cache_bytes(18, 1, 256, 1252, "float32", windows=GEMMA_WINDOWS) == 23_420_928
    # per layer: a sliding layer stops at 512 tokens
    lb = GEMMA.layer_bytes(1252)
    assert lb[5] == lb[11] == lb[17] == 1252 * per and set(lb[[0, 4, 6, 16]]) == {512 * per}


def test_window_formula_beyond_the_sample():
    # below every window the two figures agree; the cache is piecewise linear, bending at each window
    cfg = KVConfig(4, 2, 8, dtype="fp16", windows=(3, None, 5, 3))
    per = 2 * 2 * 8 * 2
    for T in range(0, 12):
        assert cfg.total_bytes(T) == (min(T, 3) + T + min(T, 5) + min(T, 3)) * per
    np.testing.assert_array_equal(cfg.project(np.arange(12)), [cfg.total_bytes(t) for t in range(12)])
    np.testing.assert_array_equal(cfg.breakpoints(10), [0, 3, 5, 10])
    assert cfg.bytes_per_token == 4 * per and cfg.steady_bytes_per_token == 1 * per
    assert cfg.max_seq_len(cfg.total_bytes(7)) == 7 and cfg.max_seq_len(cfg.total_bytes(7) - 1) == 6
    assert KVConfig(2, 1, 4, windows=(4, 4)).max_seq_len(10**9) is None  # every layer windowed: any context
    assert KVConfig(2, 1, 4, windows=(None, None)).windows is None  # no window at all = a plain config
    # the comparison keeps the windows: MQA of Gemma at 32K is the model's own 217 MB, MHA 4×
    rows = compare_schemes(GEMMA, 32768)
    assert [(r.label, r.total_bytes) for r in rows] == [
        ("MHA", 4 * 217_055_232),
        ("GQA-2", 2 * 217_055_232),
        ("MQA", 217_055_232),
    ]
    assert rows[-1].is_given
    assert "15 of 18 layers keep a 512-key window (layers 0–4, 6–10, 12–16)" in GEMMA.describe()
    with pytest.raises(ValueError, match="windows lists 3"):
        KVConfig(4, 1, 8, windows=(1, 2, 3))
    with pytest.raises(ValueError, match=">= 1"):
        KVConfig(2, 1, 8, windows=(0, None))


def test_handbook_70b_table_unchanged():
    cfg = KVConfig(80, 8, 128, n_heads=64, dtype="bf16")
    assert [format_bytes(r.total_bytes) for r in compare_schemes(cfg, 8192)] == [
        "21.5 GB",
        "2.68 GB",
        "336 MB",
    ]
    assert cfg.windows is None and cfg.total_bytes(8192) == 2_684_354_560


def test_layer_specs_round_trip():
    assert sliding_layers_from_spec("5:1", 12) == tuple(i % 6 < 5 for i in range(12))
    assert sliding_layers_from_spec("0-1, 3", 4) == (True, True, False, True)
    assert sliding_layers_from_spec("all", 2) == (True, True) and sliding_layers_from_spec("none", 2) == (
        False,
        False,
    )
    assert (
        windows_spec(GEMMA_WINDOWS) == "5:1"
        and windows_spec((4, 4)) == "all"
        and windows_spec(None) == "none"
    )
    assert windows_spec((None, 4, 4)) == "1-2"
    assert windows_from_spec(512, windows_spec(GEMMA_WINDOWS), 18) == GEMMA_WINDOWS
    assert windows_from_spec(0, "all", 3) is None
    assert format_ranges([0, 1, 2, 3, 4, 6, 7, 9]) == "0–4, 6–7, 9"
    for bad in ("x", "3:", "0-9", "2-1"):
        with pytest.raises(ValueError):
            sliding_layers_from_spec(bad, 4)


@pytest.mark.parametrize(
    "family, expect",
    [
        ("llama", (None, None)),
        ("mistral", (4, 4)),  # Mistral: the window on every layer
        ("qwen2", (None, 4, 4)),  # use_sliding_window, max_window_layers=1
        ("gemma3_text", (4, None, 4)),  # layer_types
    ],
)
def test_config_layer_windows_of_tiny_configs(family, expect):
    assert config_layer_windows(tiny_config(family)) == expect
    assert config_layer_windows(tiny_config(family).to_dict()) == expect


def test_config_layer_windows_of_config_dicts():
    # Qwen2 with the window switched off; Gemma 3 config.json with only a pattern; Mistral null window
    assert (
        config_layer_windows({"num_hidden_layers": 3, "sliding_window": 4096, "use_sliding_window": False})
        == (None,) * 3
    )
    assert config_layer_windows(
        {"num_hidden_layers": 6, "sliding_window": 512, "sliding_window_pattern": 6}
    ) == (512, 512, 512, 512, 512, None)
    assert config_layer_windows(
        {"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": None}
    ) == (None, None)
    with pytest.raises(ValueError, match="layer_types lists 1"):
        config_layer_windows(
            {"num_hidden_layers": 2, "sliding_window": 4, "layer_types": ["sliding_attention"]}
        )


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma3_text"])
def test_live_cache_of_tiny_windowed_models(tmp_path, family):
    """Windows read from the loaded model equal the ones its kernel applied (the trace); the model
    needs Σ min(T, W_l); AttnScope's tensors keep every key (what the tensors measure)."""
    from attnscope.core.analysis.kv_live import kv_live, layer_windows
    from attnscope.core.session import Session

    save_tiny(family, tmp_path)
    s = Session.load(str(tmp_path))
    s.prefill("The cat sat on the mat, then it slept.", chat_template=False)
    T = s.seq_len
    assert T > 8
    windows = layer_windows(s.backend)
    assert windows == tuple(rec.sliding_window for rec in s.trace.layers)
    live = kv_live(s)
    cfg = live.config
    per = 2 * cfg.n_kv_heads * cfg.head_dim * 4  # float32
    assert live.model_bytes == sum(T if w is None else min(T, w) for w in windows) * per
    assert live.total_bytes == live.formula_bytes == cfg.n_layers * T * per == s.backend.kv_cache_bytes()
    assert live.model_bytes < live.total_bytes and live.windowed
    assert (
        live.schemes_now[[r.is_given for r in live.schemes_now].index(True)].total_bytes == live.model_bytes
    )


def test_cli_sliding_window(capsys):
    args = [
        "kv",
        "--n-layers",
        "18",
        "--n-kv-heads",
        "1",
        "--n-heads",
        "4",
        "--head-dim",
        "256",
        "--seq-len",
        "1252",
        "--dtype",
        "fp32",
        "--sliding-window",
        "512",
        "--sliding-layers",
        "5:1",
        "--max-context",
        "32768",
    ]
    assert main(args + ["--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["total_bytes"] == 23_420_928 and rep["total_bytes_no_window"] == 46_153_728
    assert rep["max_context"]["total_bytes"] == 217_055_232
    assert rep["config"]["windows"] == list(GEMMA_WINDOWS)
    assert [r["total_bytes"] for r in rep["schemes"]] == [4 * 23_420_928, 2 * 23_420_928, 23_420_928]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "23.4 MB" in out and "46.2 MB" in out and "layers 0–4, 6–10, 12–16" in out and "217 MB" in out
    # same kind: every layer windowed (Mistral style), a window longer than the context changes nothing
    assert (
        main(
            [
                "kv",
                "--n-layers",
                "32",
                "--n-kv-heads",
                "8",
                "--head-dim",
                "128",
                "--seq-len",
                "32768",
                "--sliding-window",
                "4096",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 2 * 32 * 8 * 128 * 4096 * 2
    assert (
        main(
            [
                "kv",
                "--n-layers",
                "2",
                "--n-kv-heads",
                "1",
                "--head-dim",
                "8",
                "--seq-len",
                "10",
                "--sliding-window",
                "64",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 2 * 2 * 8 * 10 * 2
    # bad input: one clear line
    for bad, msg in (
        (["--sliding-window", "0"], "--sliding-window must be >= 1"),
        (["--sliding-window", "4", "--sliding-layers", "0-40"], "layers run 0..17"),
    ):
        assert main(args[:-4] + bad) != 0
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err


@pytest.mark.slow
def test_gemma_3_270m_live_cache(gemma_gguf):
    """The real model: windows from its config, 23.4 MB needed at 1252 tokens against 46.2 MB kept."""
    from attnscope.core.analysis.kv_live import kv_live, layer_windows
    from attnscope.core.session import Session

    s = Session.load(str(gemma_gguf))
    assert layer_windows(s.backend) == GEMMA_WINDOWS
    s.prefill("The quick brown fox jumps over the lazy dog. " * 3, chat_template=False)
    assert tuple(rec.sliding_window for rec in s.trace.layers) == GEMMA_WINDOWS
    live = kv_live(s)
    assert live.config.windows == GEMMA_WINDOWS and live.config.dtype == "float32"
    assert live.config.total_bytes(1252) == 23_420_928 and live.kept_config.total_bytes(1252) == 46_153_728
    assert live.max_context == 32768 and live.schemes_max[-1].total_bytes == 217_055_232
    T = s.seq_len
    assert (
        live.total_bytes == 18 * T * 2048
        and live.model_bytes == sum(min(T, w or T) for w in GEMMA_WINDOWS) * 2048
    )
