"""The MLX backend on mlx-lm's own model code (attnscope.core.backends.mlx_lm_arch) equals the torch backend.

For each family of ``MLX_LM_FAMILIES`` a tiny random model (tests/tiny_models.py, fixed seed) is
loaded on both backends and fed as the app feeds it: a prefill in chunks, then decode steps. The
logits agree to 1e-4 and every head's weights (the MLX Trace's ``exp(q·k·scale − LSE)``) to 1e-5;
a step back followed by the same steps gives the same weights; the info's geometry, parameter
count and attention kind are the torch load's. Skipped where mlx or mlx-lm is not importable.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from attnscope.core.backend_registry import MLX_FAMILIES, MLX_LM_FAMILIES  # noqa: E402
from tiny_models import save_tiny  # noqa: E402

IDS = list(range(5, 45))  # 40 tokens: a prefill of 30 (chunks of 8), then 10 decode steps
N_PREFILL = 30


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _run(be):
    first = be.forward(IDS[:N_PREFILL], all_logits=True)
    return np.concatenate([first, *[be.forward([i], all_logits=True) for i in IDS[N_PREFILL:]]])


@pytest.mark.parametrize(
    "family", [f if f == "qwen3_moe" else pytest.param(f, marks=pytest.mark.slow) for f in MLX_LM_FAMILIES]
)
def test_mlx_lm_family_equals_torch(family, tmp_path, monkeypatch):
    from attnscope.core.backends import mlx_backend, torch_backend
    from attnscope.core.session import Session

    monkeypatch.setattr(mlx_backend, "PREFILL_CHUNK", 8)
    monkeypatch.setattr(torch_backend, "PREFILL_CHUNK", 8)
    folder = tmp_path / family
    save_tiny(family, folder)
    sm = Session.load(str(folder), backend="mlx", dtype="float32")
    st = Session.load(str(folder), backend="torch", dtype="float32")
    assert type(sm.backend.model).__name__ == "MlxLmCausalLM"  # mlx-lm's code, not ours
    for field in (
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "vocab_size",
        "n_params",
        "attention_kind",
    ):
        assert getattr(sm.info, field) == getattr(st.info, field), field
    assert sm.backend.layer_windows() == st.backend.layer_windows()
    lm, lt = _run(sm.backend), _run(st.backend)
    assert np.abs(lm - lt).max() < 1e-4
    n = sm.info.n_layers
    for layer in range(n):
        for head in range(sm.info.n_heads):
            np.testing.assert_allclose(
                sm.trace.weights(layer, head),
                st.trace.weights(layer, head),
                atol=1e-5,
                err_msg=f"{family} L{layer} H{head}",
            )
    before = [sm.trace.weights(layer, 0) for layer in range(n)]
    sm.backend.truncate(len(IDS) - 3)
    again = np.concatenate([sm.backend.forward([i], all_logits=True) for i in IDS[-3:]])
    np.testing.assert_allclose(again, lm[-3:], atol=1e-6)
    for layer in range(n):
        np.testing.assert_allclose(sm.trace.weights(layer, 0), before[layer], atol=1e-6)
    assert sm.backend.trace.finite.found == [] and sm.notices == []


def test_the_registry_lists_what_mlx_runs():
    """One source: the MLX spec's families are the hand-written ones plus mlx-lm's, and a family
    of neither is refused by the picker's check in one line."""
    from attnscope.core import backend_registry as registry

    spec = registry.SPECS["mlx"]
    assert spec.families == MLX_FAMILIES and set(MLX_LM_FAMILIES) <= set(MLX_FAMILIES)
    assert spec.problem("qwen3_moe") is None
    why = spec.problem("gpt_oss")
    assert (
        why is not None and why.startswith("the MLX backend does not run gpt_oss models") and "\n" not in why
    )


def test_rope_parameters_reach_mlx_lm():
    """transformers 5's ``rope_parameters`` reach mlx-lm under its names (mlx-lm 0.32 reads
    ``rope_theta``/``rope_scaling`` only: without this a Qwen3-30B-A3B would run at θ = 10000)."""
    from attnscope.core.backends.mlx_lm_arch import mlx_lm_config

    assert mlx_lm_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == {
        "rope_theta": 1e6
    }
    got = mlx_lm_config(
        {
            "model_type": "gemma3_text",
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        }
    )
    assert got == {
        "rope_theta": 1e6,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0, "type": "linear"},
        "rope_local_base_freq": 1e4,
        "sliding_window_pattern": 6,
    }
