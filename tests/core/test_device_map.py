"""``--device-map`` through accelerate. On this CPU-only machine: a tiny model with some
layers offloaded to disk (accelerate's "cpu" + "disk" placement) computes what the plain model
computes, and its captured weights equal eager attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.errors import ModelLoadError
from tiny_models import eager_reference, save_tiny

IDS = [1, 40, 41, 42, 7, 8, 9, 100, 101, 102, 103, 60]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dm")
    save_tiny("llama", root / "llama")
    return root / "llama"


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def test_cpu_and_disk_offload_equals_eager(folder, tmp_path):
    from attnscope.core.backends.torch_backend import TorchBackend
    from attnscope.core.loading.device_map import describe, placement
    from transformers import AutoModelForCausalLM

    dm = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    b = TorchBackend.load(str(folder), device="cpu", dtype="float32", device_map=dm)
    assert b.device == "cpu"
    assert b.model.hf_device_map["model.layers.1"] == "disk"
    assert any((tmp_path / "cache" / "offload").rglob("*")), "layer 1 was written to the offload folder"
    assert set(placement(b.model)) == {"cpu", "disk"} and "disk" in describe(b.model)
    logits = b.forward(IDS[:8], all_logits=True)
    logits = np.concatenate([logits, b.forward(IDS[8:], all_logits=True)])
    eager = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ref_logits, ref = eager_reference(eager, IDS)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4)
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(b.trace.weights(layer, head), ref[layer][head], atol=1e-5)
    assert b.trace.sink_scores().shape == (2, 4)


def test_strategy_names_are_checked():
    from attnscope.core.loading.device_map import check_device_map

    assert check_device_map("Balanced") == "balanced" and check_device_map(None) is None
    with pytest.raises(
        ModelLoadError, match=r"^unknown device map 'everywhere': choose one of auto, balanced, sequential$"
    ):
        check_device_map("everywhere")


def test_device_map_auto_on_cpu_runs(folder):
    from attnscope.core.session import Session

    s = Session.load(str(folder), dtype="float32", device_map="auto")
    s.prefill("the cat sat", chat_template=False)
    np.testing.assert_allclose(s.weights(1, 2).sum(axis=1), 1.0, atol=1e-5)
