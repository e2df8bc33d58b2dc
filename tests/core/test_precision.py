"""``--dtype auto``: the checkpoint's own precision, float32 where the device has no fast half matmul."""

from __future__ import annotations

import json

import pytest
from attnscope.core.errors import ModelLoadError
from attnscope.core.loading.precision import (
    SMALL_FLOAT32_BYTES,
    Checkpoint,
    check_choice,
    choose_dtype,
    config_dtype,
    cpu_half_support,
    gguf_checkpoint_dtype,
    inspect_checkpoint,
)

FAST = (True, "CPU flag avx512_bf16")
SLOW = (False, "this CPU has no avx512_bf16 or amx_bf16 flag")
BIG = 1_235_814_400  # Llama-3.2-1B's parameter count: 4.94 GB at float32


def test_explicit_dtype_is_obeyed_whatever_the_checkpoint():
    ck = Checkpoint("bfloat16", BIG)
    assert choose_dtype("float32", ck, half_support=FAST)[0] == "float32"
    assert choose_dtype("float16", ck, half_support=SLOW)[0] == "float16"
    assert choose_dtype("bf16", ck, half_support=SLOW) == (
        "bfloat16",
        "bfloat16: asked for (--dtype bfloat16)",
    )


def test_auto_is_the_checkpoints_own_dtype_where_the_device_is_fast():
    dtype, why = choose_dtype("auto", Checkpoint("bfloat16", BIG, origin="config dtype"), half_support=FAST)
    assert dtype == "bfloat16"
    assert why == "bfloat16: the checkpoint's own precision (config dtype); CPU flag avx512_bf16"
    assert choose_dtype("auto", Checkpoint("float16", BIG), half_support=FAST)[0] == "float16"
    assert choose_dtype("auto", Checkpoint("float32", BIG), half_support=SLOW)[0] == "float32"
    assert choose_dtype("auto", Checkpoint(None, BIG))[0] == "float32"  # declares nothing: float32


def test_auto_picks_float32_without_fast_bf16_when_it_fits_and_says_why():
    ck = Checkpoint("bfloat16", BIG, origin="config dtype")
    dtype, why = choose_dtype("auto", ck, free_bytes=20 * 10**9, half_support=SLOW)
    assert dtype == "float32"
    assert "no avx512_bf16 or amx_bf16 flag" in why and "4.94 GB of 20.00 GB available" in why
    # 4 bytes × params one byte over the free memory: keep bf16, and say float32 would not fit
    dtype, why = choose_dtype("auto", ck, free_bytes=4 * BIG - 1, half_support=SLOW)
    assert dtype == "bfloat16" and "would not fit" in why


def test_auto_keeps_the_own_precision_when_free_memory_is_unknown(monkeypatch):
    """available_bytes() may not know (None): keep bf16 and say so (it was a TypeError in _gb)."""
    import attnscope.core.loading.precision as P

    monkeypatch.setattr(P, "available_bytes", lambda device: None)
    dtype, why = choose_dtype("auto", Checkpoint("bfloat16", BIG, origin="config dtype"), half_support=SLOW)
    assert dtype == "bfloat16"
    assert why.endswith("float32 (4.94 GB) may not fit (free memory unknown)")


def test_quantised_gguf_loads_bf16_unless_small():
    big = Checkpoint("bfloat16", BIG, quantised=True, origin="GGUF Q4_0")
    assert choose_dtype("auto", big, half_support=FAST)[0] == "bfloat16"
    n_small = SMALL_FLOAT32_BYTES // 4  # exactly the threshold: float32
    small = Checkpoint("bfloat16", n_small, quantised=True, origin="GGUF Q4_1")
    dtype, why = choose_dtype("auto", small, half_support=FAST)
    assert dtype == "float32" and "small quantised model" in why
    assert (
        choose_dtype("auto", Checkpoint("bfloat16", n_small + 1, quantised=True), half_support=FAST)[0]
        == "bfloat16"
    )
    # a small *bf16 folder* is not rounded either way: it keeps bf16
    assert choose_dtype("auto", Checkpoint("bfloat16", n_small), half_support=FAST)[0] == "bfloat16"


def test_unknown_dtype_is_one_line():
    with pytest.raises(ModelLoadError, match="unknown dtype 'float8'.*auto, float32, bfloat16, float16"):
        check_choice("float8")


@pytest.mark.parametrize(
    ("flags", "machine", "dtype", "fast"),
    [
        ({"avx512f", "avx512_bf16"}, "x86_64", "bfloat16", True),
        ({"amx_bf16"}, "x86_64", "bfloat16", True),
        ({"avx2", "avx512f"}, "x86_64", "bfloat16", False),
        ({"avx512_bf16"}, "x86_64", "float16", False),
        ({"avx512_fp16"}, "x86_64", "float16", True),
        ({"fp", "asimd", "bf16"}, "aarch64", "bfloat16", True),
        ({"fp", "asimd"}, "aarch64", "bfloat16", False),
    ],
)
def test_cpu_flags(flags, machine, dtype, fast):
    assert cpu_half_support(dtype, frozenset(flags), machine, "Linux")[0] is fast
    assert cpu_half_support(dtype, frozenset(), "arm64", "Darwin")[0] is True  # Apple silicon


def test_config_dtype_keys():
    assert config_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"
    assert config_dtype({"dtype": "float16", "torch_dtype": "float32"}) == "float16"
    assert config_dtype({"text_config": {"dtype": "bfloat16"}}) == "bfloat16"
    assert config_dtype({"model_type": "llama"}) is None


class _T:
    def __init__(self, type_id, shape=(64, 64)):
        self.type_id, self.shape = type_id, shape


class _H:
    def __init__(self, *types):
        self.tensors = [_T(t) for t in types] + [_T(0, (64,))]  # plus an F32 norm


@pytest.mark.parametrize(
    ("types", "dtype"),
    [
        ((0, 0), "float32"),
        ((1, 1), "float16"),
        ((30, 30), "bfloat16"),
        ((8, 0), "bfloat16"),
        ((2, 1), "bfloat16"),
        ((12,), "bfloat16"),
    ],
)
def test_gguf_checkpoint_dtype_from_tensor_types(types, dtype):
    # ggml ids: F32 0, F16 1, Q4_0 2, Q8_0 8, Q4_K 12, BF16 30
    assert gguf_checkpoint_dtype(_H(*types)) == dtype


def test_default_model_is_a_small_quantised_gguf_and_loads_float32():
    from attnscope.core.loading.precision import decide

    ck = inspect_checkpoint(None)
    assert (ck.dtype, ck.quantised, ck.n_params, ck.origin) == ("bfloat16", True, 134_515_008, "GGUF Q4_1")
    assert decide(None)[0] == "float32"


def test_folder_precision_from_config(tmp_path):
    from tiny_models import save_tiny

    save_tiny("llama", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    ck = inspect_checkpoint(tmp_path / "m")
    assert (ck.dtype, ck.origin, ck.quantised) == ("bfloat16", "config dtype", False) and ck.n_params > 0
    assert choose_dtype("auto", ck, half_support=SLOW, free_bytes=10**9)[0] == "float32"
    assert choose_dtype("auto", ck, half_support=FAST)[0] == "bfloat16"


def test_catalog_entry_precision_and_fit_at_the_load_dtype(tmp_path, monkeypatch):
    import dataclasses

    import gguf
    from attnscope.core.loading.describe_model import describe_gguf, describe_hf_folder
    from attnscope.core.loading.fit import estimate_entry
    from gguf_families import write_family_gguf
    from tiny_models import save_tiny

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    e = describe_gguf(write_family_gguf("llama", tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0))
    assert (e.dtype, e.checkpoint_dtype, e.quantised) == ("Q8_0", "bfloat16", True)
    small = estimate_entry(e, 16, free_bytes=10**9)
    assert (
        small.dtype == "float32"
        and small.weights_bytes == 4 * e.n_params
        and "small quantised" in small.dtype_reason
    )
    big = dataclasses.replace(
        e, n_params=BIG
    )  # the same file type at 1B parameters: bfloat16 where bf16 is fast
    f = estimate_entry(big, 16, free_bytes=100 * 10**9)
    fast = cpu_half_support("bfloat16")[0]
    assert f.dtype == ("bfloat16" if fast else "float32") and f.weights_bytes == (2 if fast else 4) * BIG
    assert estimate_entry(big, 16, dtype="float16", free_bytes=10**9).weights_bytes == 2 * BIG
    f32 = describe_gguf(write_family_gguf("llama", tmp_path / "f32.gguf"))
    assert (f32.checkpoint_dtype, f32.quantised) == ("float32", False)
    save_tiny("qwen3", tmp_path / "hf")
    h = describe_hf_folder(tmp_path / "hf")
    assert h.checkpoint_dtype == "float32" and estimate_entry(h, 16, free_bytes=10**9).dtype == "float32"


def test_models_command_shows_file_and_load_precision(tmp_path, monkeypatch, capsys):
    from attnscope.core.cli.main import main

    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("ATTNSCOPE_LMSTUDIO_MODELS", str(tmp_path / "lms"))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "loads at" in line)
    row = next(line for line in out.splitlines() if "SmolLM2" in line)
    cells = [c.strip() for c in row.split("  ") if c.strip()]
    assert "dtype/quant" in header and "Q4_1" in cells and "float32" in cells  # file Q4_1, loads at float32


def test_cli_dtype_choices():
    from attnscope.core.cli.main import build_parser

    p = build_parser()
    assert p.parse_args([]).dtype == "auto"
    assert p.parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "float8"])


def test_session_auto_loads_a_bf16_folder_at_its_own_precision(tmp_path, monkeypatch):
    import torch
    from attnscope.core.session import Session
    from tiny_models import tiny_model, tiny_tokenizer

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    m = tiny_model("llama").to(torch.bfloat16)
    m.config.dtype = "bfloat16"
    m.save_pretrained(tmp_path / "bf16")
    tiny_tokenizer().save_pretrained(tmp_path / "bf16")
    s = Session.load(str(tmp_path / "bf16"), device="cpu")
    fast = cpu_half_support("bfloat16")[0]
    assert s.info.dtype == ("bfloat16" if fast else "float32")
    assert s.info.dtype_reason.startswith(s.info.dtype + ": ") and "config dtype" in s.info.dtype_reason
    assert Session.load(str(tmp_path / "bf16"), device="cpu", dtype="float32").info.dtype == "float32"
