"""The per-device fit before loading (core/loading/fit_devices.py).

The map comes from transformers/accelerate on a meta-device skeleton, so these tests check (a) it
is the map ``from_pretrained`` computes (``_get_device_map``, and a real load's ``hf_device_map``),
(b) the bytes per device, worked out by hand from the published Llama-3.1-8B / Llama-3.2-1B configs.
"""

from __future__ import annotations

import pytest
from make_synthetic import hf_config
from tiny_models import save_tiny

GB = 10**9
# Llama-3.1-8B (config in tests/make_synthetic.py): embed 128256 × 4096; a decoder layer
# q 4096² + k,v 4096 × 1024 each + o 4096² + MLP 3 × 4096 × 14336 + two norms of 4096.
EMBED_8B = 128256 * 4096  # 525,336,576 (lm_head untied: as many again)
LAYER_8B = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000
PARAMS_8B = 2 * EMBED_8B + 32 * LAYER_8B + 4096  # 8,030,261,248, the published count
TWO_GPUS = {0: 24 * GB, 1: 24 * GB, "cpu": 64 * GB, "disk": 500 * GB}


def available_leaving(folder, room: int, dtype: str = "float32") -> int:
    """The RAM "available" (psutil) at which a device-mapped load of ``folder`` has ``room`` bytes
    left for layers in RAM: :func:`run_budget` keeps the run's room (runtime, KV cache and capture at
    its reserve context) and 10 % back."""
    import math

    from attnscope.core.loading.fit_devices import CPU_SHARE, run_budget
    from transformers import AutoConfig

    big = 10**12
    reserve = (
        int(big * CPU_SHARE) - run_budget(AutoConfig.from_pretrained(folder), dtype, {"cpu": big})["cpu"]
    )
    return math.ceil((room + reserve) / CPU_SHARE)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def cfg8b():
    return hf_config("llama-3.1-8b")


def test_published_count():
    assert PARAMS_8B == 8_030_261_248


def test_two_gpus_balanced_is_what_from_pretrained_computes(cfg8b):
    from attnscope.core.loading.fit_devices import device_fit, skeleton
    from transformers.integrations.accelerate import _get_device_map

    f = device_fit(cfg8b, "auto", context=4096, dtype="bfloat16", free=TWO_GPUS)
    expected = _get_device_map(
        skeleton(cfg8b, "bfloat16"), "auto", {k: v for k, v in TWO_GPUS.items() if k != "disk"}, None
    )
    assert dict(f.device_map) == dict(expected)
    # balanced: 16 layers per GPU, the embedding with the first half, norm + lm_head with the second
    g0, g1, cpu = f.device("cuda:0"), f.device("cuda:1"), f.device("cpu")
    assert [d.device for d in f.devices] == ["cuda:0", "cuda:1", "cpu"]
    assert (g0.n_layers, g1.n_layers, cpu.n_layers) == (16, 16, 0)
    assert g0.weights_bytes == 2 * (EMBED_8B + 16 * LAYER_8B) == 8_030_257_152
    assert g1.weights_bytes == 2 * (16 * LAYER_8B + 4096 + EMBED_8B) == 8_030_265_344
    assert cpu.weights_bytes == 0 and cpu.runtime_bytes == 600_000_000
    assert f.weights_bytes == 2 * PARAMS_8B  # the single-device weight total at bfloat16
    # per layer at 4096 tokens: KV 2 × 8 × 128 × 4096 × 2 B; capture 32 × 4096 × (128 × 2 + 8) B
    assert g0.kv_cache_bytes == g1.kv_cache_bytes == 16 * 2 * 8 * 128 * 4096 * 2 == 268_435_456
    assert g0.capture_bytes == 16 * 32 * 4096 * (128 * 2 + 8)
    assert f.verdict == "fits" and g0.free_bytes == 24 * GB
    assert f.label() == "cuda:0 8.85 GB · cuda:1 8.85 GB · cpu 600 MB"


def test_sequential_fills_gpu0_first(cfg8b):
    from attnscope.core.loading.fit_devices import device_fit, infer_map, skeleton

    f = device_fit(cfg8b, "sequential", context=4096, dtype="bfloat16", free=TWO_GPUS)
    assert dict(f.device_map) == infer_map(skeleton(cfg8b, "bfloat16"), "sequential", TWO_GPUS | {})
    assert [d.device for d in f.devices] == ["cuda:0", "cpu"]
    assert f.device("cuda:0").n_layers == 32
    assert f.device("cuda:0").weights_bytes == 2 * PARAMS_8B


def test_cpu_only_spills_to_disk(cfg8b):
    """10 GB of RAM: accelerate keeps room on the CPU for the largest offloaded module (lm_head,
    1.05 GB) and fills the rest with the embedding and 18 layers (1.05 + 18 × 0.436 = 8.90 GB; a 19th
    would make 9.34 + 1.05 > 10 GB); 14 layers, the norm and lm_head go to disk. Disk layers execute
    on the CPU, so all 32 layers' KV cache and capture are in RAM."""
    from attnscope.core.loading.fit_devices import device_fit, infer_map, skeleton

    free = {"cpu": 10 * GB, "disk": 100 * GB}
    f = device_fit(cfg8b, "auto", context=2048, dtype="bfloat16", free=free)
    assert dict(f.device_map) == infer_map(skeleton(cfg8b, "bfloat16"), "auto", {"cpu": 10 * GB})
    cpu, disk = f.device("cpu"), f.device("disk")
    assert [d.device for d in f.devices] == ["cpu", "disk"]
    assert (cpu.n_layers, disk.n_layers) == (18, 14)
    assert cpu.weights_bytes == 2 * (EMBED_8B + 18 * LAYER_8B)
    assert disk.weights_bytes == 2 * (14 * LAYER_8B + 4096 + EMBED_8B)
    assert cpu.weights_bytes + disk.weights_bytes == 2 * PARAMS_8B
    assert cpu.kv_cache_bytes == 32 * 2 * 8 * 128 * 2048 * 2 and disk.kv_cache_bytes == 0
    assert cpu.offload_bytes == 2 * LAYER_8B  # one disk layer copied in per forward
    assert disk.free_bytes == 100 * GB and disk.verdict == "fits"
    assert cpu.verdict == "does not fit" and f.verdict == "does not fit"  # 8.90 GB weights + 2.3 GB more
    assert f.label().startswith("cpu ") and " · disk 7.16 GB" in f.label()


def test_int8_counts_linear_weights_at_one_byte(cfg8b):
    from attnscope.core.loading.fit import weights_bytes
    from attnscope.core.loading.fit_devices import device_fit

    f = device_fit(cfg8b, "auto", context=0, dtype="bfloat16", quantize="int8", free=TWO_GPUS)
    linear = 32 * (LAYER_8B - 2 * 4096)  # every nn.Linear weight of the decoder layers
    assert f.weights_bytes == linear * 1 + (PARAMS_8B - linear) * 2 == 9_081_200_640
    # the single-device estimate (fit.py counts norms as linear): within 0.01 %
    single = weights_bytes(
        PARAMS_8B, dtype="bfloat16", quantize="int8", linear_params=PARAMS_8B - 2 * EMBED_8B
    )
    assert abs(f.weights_bytes - single) / single < 1e-4
    # the placement is the float one (a device-mapped load quantises after dispatch)
    float_map = device_fit(cfg8b, "auto", context=0, dtype="bfloat16", free=TWO_GPUS).device_map
    assert f.device_map == float_map
    # ... and over two GPUs the load refuses it (quantize.device_map_problem): said, never "fits"
    assert f.problem.startswith("--quantize int8 with a multi-device --device-map is not supported")
    assert f.verdict == "does not fit" and f.summary().startswith("refused: --quantize int8")
    one = device_fit(
        cfg8b, "auto", context=0, dtype="bfloat16", quantize="int8", free={0: 80 * GB, "cpu": 64 * GB}
    )
    assert one.problem == "" and {w for _, w in one.device_map} == {0} and one.verdict == "fits"


def test_tied_lm_head_counted_once():
    from attnscope.core.loading.fit_devices import device_fit

    f = device_fit(hf_config("llama-3.2-1b"), "auto", context=0, dtype="bfloat16", free={"cpu": 64 * GB})
    assert f.weights_bytes == 2 * 1_235_814_400  # Llama-3.2-1B's published 1.24 B parameters
    assert [d.device for d in f.devices] == ["cpu"]


def test_bad_arguments_are_one_line(cfg8b):
    from attnscope.core.errors import ModelLoadError
    from attnscope.core.loading.fit_devices import device_fit

    with pytest.raises(ModelLoadError, match="unknown device map 'everywhere'"):
        device_fit(cfg8b, "everywhere", context=1)
    with pytest.raises(ValueError, match="context must be >= 0"):
        device_fit(cfg8b, "auto", context=-1)


def test_cached_per_settings(cfg8b):
    from attnscope.core.loading.fit_devices import device_fit

    a = device_fit(cfg8b, "auto", context=512, dtype="bfloat16", free=TWO_GPUS)
    assert device_fit(cfg8b, "auto", context=512, dtype="bfloat16", free=TWO_GPUS) is a
    assert device_fit(cfg8b, "auto", context=1024, dtype="bfloat16", free=TWO_GPUS) is not a


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fd") / "llama"
    save_tiny("llama", folder)
    return folder


@pytest.mark.parametrize("cpu_bytes", [None, 250_000])
def test_estimate_is_the_map_the_load_makes(tiny, tmp_path, monkeypatch, cpu_bytes):
    """The estimate for a catalog entry equals the ``hf_device_map`` of the real load, with the memory
    the load measures itself, and with ``max_memory`` that sends the second layer to disk."""
    from attnscope.core.backends.torch_backend import TorchBackend
    from attnscope.core.loading.describe_model import describe_hf_folder
    from attnscope.core.loading.device_map import placement
    from attnscope.core.loading.fit_devices import device_fit_entry, placement_name

    if cpu_bytes is not None and _cuda():
        pytest.skip("accelerate would put the tiny model on the GPU: the disk case needs a CPU-only machine")
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    entry = describe_hf_folder(tiny)
    free = None if cpu_bytes is None else {"cpu": cpu_bytes}
    f = device_fit_entry(entry, "auto", 64, dtype="float32", free=free)
    b = TorchBackend.load(
        str(tiny), device="cpu", dtype="float32", device_map="auto", max_memory=free and {"cpu": cpu_bytes}
    )
    hf_map = getattr(b.model, "hf_device_map", None)  # transformers sets none for a one-device map
    if hf_map is None:  # the whole model on one device: the CPU here, GPU 0 on a CUDA machine
        assert {placement_name(w) for _, w in f.device_map} == set(placement(b.model))
    else:
        assert dict(f.device_map) == dict(hf_map)
    loaded = placement(b.model)
    assert {d.device: d.weights_bytes for d in f.devices if d.weights_bytes} == loaded
    if cpu_bytes is not None:
        assert "disk" in loaded and f.device("disk").n_layers >= 1


def test_models_cli_prints_the_fit_per_device(tiny, tmp_path, monkeypatch, capsys):
    """``attnscope models --device-map auto`` with 420 kB of RAM free: the tiny model's embedding
    and layer 0 stay in RAM, layer 1, the norm and lm_head go to disk (test_device_map_gui's case)."""
    import json

    import psutil
    from attnscope.core.cli.main import main

    if _cuda():
        pytest.skip("with a GPU accelerate places the tiny model there: this case is CPU-only")
    from attnscope.core.loading import catalog

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    monkeypatch.setenv("ATTNSCOPE_LMSTUDIO_MODELS", "")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(catalog, "scan_embedded", lambda: [])  # its GGUF's config takes seconds
    real = psutil.virtual_memory
    available = available_leaving(tiny, 420_000)  # room for one of the two layers after the run's
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real()._replace(available=available))
    catalog.add_user_path(tiny)
    assert main(["models", "--context", "64", "--dtype", "float32", "--device-map", "auto"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("llama "))
    # the load keeps the run's room in RAM, so one layer stays there and the run fits (tightly)
    assert row.rstrip().endswith("tight (cpu 600 MB · disk 218 kB)")
    assert "fit per device with --device-map auto (accelerate's placement); free: cpu " in out
    assert (
        main(["models", "--context", "64", "--dtype", "float32", "--device-map", "auto", "--json", "-"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    d = doc["models"][0]["device_fit"]
    assert [(x["device"], x["n_layers"], x["weights_bytes"]) for x in d["devices"]] == [
        ("cpu", 1, 4 * (272 * 64 + 36992)),
        ("disk", 1, 4 * (36992 + 64 + 272 * 64)),
    ]
    assert d["device_map"]["model.layers.1"] == "disk" and d["strategy"] == "auto"


def test_gguf_entry_uses_the_config_transformers_derives(tmp_path, monkeypatch):
    """A GGUF's per-device fit comes from the config transformers reads out of its metadata, and is
    the map the real load of that GGUF (converted, then dispatched by accelerate) makes."""
    from attnscope.core.backends.torch_backend import TorchBackend
    from attnscope.core.loading.describe_model import describe_gguf
    from attnscope.core.loading.device_map import placement
    from attnscope.core.loading.fit_devices import device_fit_entry, entry_config
    from tiny_models import tiny_model, write_llama_gguf

    if _cuda():
        pytest.skip("the disk placement is CPU-only (accelerate would use the GPU)")
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    gguf = write_llama_gguf(tiny_model("llama"), tmp_path / "tiny-llama-F32.gguf")
    entry = describe_gguf(gguf)
    cfg = entry_config(entry)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (
        "llama",
        2,
        2,
        False,
    )
    f = device_fit_entry(entry, "sequential", 64, "float32", free={"cpu": 300_000})
    assert f.weights_bytes == 4 * entry.n_params
    b = TorchBackend.load(
        str(gguf), device="cpu", dtype="float32", device_map="sequential", max_memory={"cpu": 300_000}
    )
    assert dict(f.device_map) == dict(b.model.hf_device_map) and "disk" in b.model.hf_device_map.values()
    assert {d.device: d.weights_bytes for d in f.devices if d.weights_bytes} == placement(b.model)


def test_run_budget_keeps_the_runs_room_where_the_layers_execute(cfg8b):
    """max_memory for a mapped 8B load: 90 % of the CPU less the runtime and every layer's KV cache
    and capture at 4,096 tokens (bf16) on the CPU when there is no GPU; with two GPUs the room comes
    off GPU 0 (where offloaded layers execute), the GPUs are taken whole, and the CPU keeps only the
    runtime."""
    from attnscope.core.loading.fit import RUNTIME_BYTES
    from attnscope.core.loading.fit_devices import run_budget

    kv = 2 * 32 * 8 * 128 * 4096 * 2  # 536,870,912: K and V, 32 layers, 8 KV heads of 128, bf16
    cap = 32 * 32 * 4096 * (128 * 2 + 8)  # 1,107,296,256: q rows (bf16) + LSE (float64)
    assert kv == 536_870_912 and cap == 1_107_296_256
    got = run_budget(cfg8b, "bfloat16", {"cpu": 20_000_000_000, "disk": 10**12})
    assert got == {"cpu": 18_000_000_000 - RUNTIME_BYTES["torch"] - kv - cap}  # disk is not a budget
    got = run_budget(cfg8b, "bfloat16", {0: 24_000_000_000, 1: 24_000_000_000, "cpu": 20_000_000_000})
    assert got == {
        0: 24_000_000_000 - kv - cap,
        1: 24_000_000_000,
        "cpu": 18_000_000_000 - RUNTIME_BYTES["torch"],
    }
    one_gpu = run_budget(cfg8b, "bfloat16", {0: 24_000_000_000, "cpu": 20_000_000_000})
    assert one_gpu[0] == 21_600_000_000 - kv - cap  # a lone GPU at 90 %, as accelerate takes it
    assert run_budget(cfg8b, "bfloat16", {"cpu": 1_000_000})["cpu"] == 0  # never negative
