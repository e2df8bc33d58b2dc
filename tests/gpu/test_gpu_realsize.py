"""On CUDA: a real-size (Llama-3.1-8B-shaped, bf16, random weights built on the GPU from the
published config) capture run, its int8/int4 weight-only memory, and a two-device ``device_map`` run.

Skipped without CUDA; the two-device test also with fewer than two GPUs. Run on a GPU machine with
``pytest -m gpu tests/gpu``. Nothing is downloaded: the weights are random, the shapes are real.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# Llama-3.1-8B's config.json (meta-llama/Llama-3.1-8B), weights random
LLAMA_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    bos_token_id=128000,
    eos_token_id=128001,
)
T = 512


def _model_8b(seed: int = 0):
    from attnscope.core.backends.torch_backend import ATTN_NAME, register_attention
    from transformers import AutoConfig, AutoModelForCausalLM

    register_attention()
    cfg = AutoConfig.for_model("llama", **LLAMA_8B)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=ATTN_NAME)
    return m.eval()  # from_config's init: N(0, 0.02) weights, norms at 1


def _backend(m):
    from attnscope.core.backends.torch_backend import TorchBackend
    from attnscope.core.loading.model_info import info_from_config

    info = info_from_config(m.config, name="llama-8b-shaped", source="synthetic", dtype="bfloat16")
    return TorchBackend(m, tokenizer=None, info=info, device="cuda")


@pytest.fixture(scope="module")
def ids():
    return [int(i) for i in np.random.default_rng(0).integers(1000, 128000, T)]


def test_8b_shaped_bf16_capture_equals_eager(ids):
    m = _model_8b()
    b = _backend(m)
    torch.cuda.reset_peak_memory_stats()
    b.forward(ids)
    peak = torch.cuda.max_memory_allocated()
    # 16.06 GB of bf16 weights + KV (2 × 32 × 8 × 128 × 512 × 2 B = 67 MB) + capture + activations
    assert peak < 18.5e9, peak
    m.set_attn_implementation("eager")  # the same weights through transformers' own attention
    with torch.no_grad():
        ref = m(torch.tensor([ids], device="cuda"), output_attentions=True).attentions
    for layer in (0, 15, 31):
        for head in (0, 7, 31):
            ours = b.trace.weights(layer, head)
            theirs = ref[layer][0, head].float().cpu().numpy()
            assert ours.shape == (T, T)
            np.testing.assert_allclose(ours.sum(axis=1), 1.0, atol=1e-4)
            # eager at bf16 rounds its softmax to bf16 (2^-8 relative); ours is float32 from the same q, k
            assert np.abs(ours - theirs).max() < 1e-2


@pytest.mark.parametrize("mode, budget_gb", [("int8", 9.6), ("int4", 6.2)])
def test_8b_shaped_quantised_fits_its_budget(ids, mode, budget_gb):
    from attnscope.core.loading.quantize import quantize_model, weight_bytes

    m = _model_8b()
    desc = quantize_model(m, mode)
    assert desc.startswith(f"{mode} weight-only (torchao")
    torch.cuda.empty_cache()
    assert weight_bytes(m) < budget_gb * 1e9, (mode, weight_bytes(m))
    b = _backend(m)
    torch.cuda.reset_peak_memory_stats()
    b.forward(ids)
    assert torch.cuda.memory_allocated() < (budget_gb + 0.5) * 1e9
    w = b.trace.weights(31, 5)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_device_map_keeps_rows_on_each_layers_device(tmp_path):
    from attnscope.core.backends.torch_backend import TorchBackend
    from tiny_models import eager_reference, save_tiny
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    dm = {
        "model.embed_tokens": 0,
        "model.layers.0": 0,
        "model.layers.1": 1,
        "model.norm": 1,
        "model.rotary_emb": 0,
        "lm_head": 1,
    }
    b = TorchBackend.load(str(folder), dtype="float32", device_map=dm)
    assert b.device == "cuda:0"
    ids = [1, 40, 41, 42, 7, 8, 9, 100, 101, 102]
    b.forward(ids)
    assert b.trace.layers[0].store.q.device == torch.device("cuda:0")
    assert b.trace.layers[1].store.q.device == torch.device("cuda:1")
    assert b.trace.layers[1].keys.device == torch.device("cuda:1")
    eager = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    _, ref = eager_reference(eager, ids)
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(b.trace.weights(layer, head), ref[layer][head], atol=1e-5)
    assert b.trace.sink_scores().shape == (2, 4)
