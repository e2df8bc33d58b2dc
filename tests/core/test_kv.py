"""attnscope.core.kv_formula (KV-cache and attention-matrix accounting) and ``attnscope kv``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from attnscope.core.cli.main import main
from attnscope.core.kv_formula import (
    KVConfig,
    attention_matrix_bytes,
    compare_schemes,
    default_gqa_kv_heads,
    dtype_bytes,
    format_bytes,
    kv_cache_bytes,
    mla_cache_bytes,
)

GB = 10**9
LLAMA70B = KVConfig(n_layers=80, n_kv_heads=8, head_dim=128, n_heads=64, dtype="bf16")


def test_handbook_70b_table():
    # the Llama-2-70B preset (docs/tabs/kv.md): L = 80, d_h = 128, 8192 tokens, bf16: 2 × 80 × H_kv × 128 × 8192 × 2 bytes
    assert kv_cache_bytes(80, 64, 128, 8192, "bf16") == 21_474_836_480  # "21.5 GB"
    assert kv_cache_bytes(80, 8, 128, 8192, "bf16") == 2_684_354_560  # "2.7 GB"
    assert kv_cache_bytes(80, 1, 128, 8192, "bf16") == 335_544_320  # "0.34 GB"
    rows = compare_schemes(LLAMA70B, 8192)
    assert [(r.label, r.config.n_kv_heads) for r in rows] == [("MHA", 64), ("GQA-8", 8), ("MQA", 1)]
    assert [round(r.total_bytes / GB, 2) for r in rows] == [21.47, 2.68, 0.34]
    assert [format_bytes(r.total_bytes) for r in rows] == ["21.5 GB", "2.68 GB", "336 MB"]
    assert [r.vs_mha for r in rows] == [1.0, 8.0, 64.0]
    assert [r.is_given for r in rows] == [False, True, False]


def test_attention_matrix_memory_figures():
    assert (
        attention_matrix_bytes(8192, dtype="fp32") == 256 * 2**20
    )  # 8192² × 4 B: 256 MiB per head (worked_examples)
    assert attention_matrix_bytes(8192, n_heads=64, dtype="fp32") == 16 * 2**30  # 16 GB for 64 heads
    wall = attention_matrix_bytes(
        8192, n_heads=32, batch=8, dtype="bf16"
    )  # the memory wall (worked_examples)
    assert wall == 34_359_738_368 and format_bytes(wall) == "34.4 GB" and wall > 0
    assert format_bytes(attention_matrix_bytes(8192), binary=True) == "256 MiB"
    assert attention_matrix_bytes(1, 8192, n_heads=9) == 9 * 8192 * 4  # a decode row: linear


@pytest.mark.parametrize(
    "n_layers, n_kv, n_heads, head_dim, seq, dtype, batch",
    [(30, 3, 9, 64, 2048, "float32", 1), (32, 8, 32, 128, 100, "fp16", 4), (1, 1, 1, 1, 0, "fp8", 1)],
)
def test_config_agrees_with_the_formula(n_layers, n_kv, n_heads, head_dim, seq, dtype, batch):
    cfg = KVConfig(n_layers, n_kv, head_dim, n_heads=n_heads, dtype=dtype, batch=batch)
    total = 2 * n_layers * n_kv * head_dim * seq * batch * dtype_bytes(dtype)  # docs/tabs/kv.md
    assert cfg.total_bytes(seq) == total == kv_cache_bytes(n_layers, n_kv, head_dim, seq, dtype, batch)
    assert cfg.bytes_per_layer(seq) * n_layers == total
    assert cfg.bytes_per_token * seq == total
    assert np.array_equal(cfg.project([0, seq, 2 * seq]), [0, total, 2 * total])


def test_scheme_names_group_size_and_describe():
    assert KVConfig(30, 9, 64).scheme == "MHA" and KVConfig(30, 9, 64).n_heads == 9
    smol = KVConfig(30, 3, 64, n_heads=9, dtype="float32", name="SmolLM2-135M")
    assert smol.scheme == "GQA" and smol.group_size == 3
    assert smol.describe() == "30 layers × 3 KV heads × head_dim 64, float32 (GQA, group 3)"
    assert KVConfig(30, 1, 64, n_heads=9).scheme == "MQA"
    assert LLAMA70B.with_mla(512, 64).scheme == "MLA"


def test_mla_matches_deepseek_v2_accounting():
    # DeepSeek-V2 (Liu et al. 2024, Table 1): (d_c + d_h^R) l = (512 + 64) per token and layer,
    # "equal to GQA with only 2.25 groups": 2 × 2.25 × 128 = 576.
    ds = KVConfig(n_layers=60, n_kv_heads=128, head_dim=128, n_heads=128, dtype="bf16").with_mla(512, 64)
    assert ds.elements_per_token_per_layer == 576 == int(2 * 2.25 * 128)
    assert ds.bytes_per_token == 576 * 60 * 2
    assert ds.total_bytes(4096) == mla_cache_bytes(60, 512, 64, 4096, "bf16")
    rows = {r.scheme: r for r in compare_schemes(ds, 4096)}
    assert set(rows) == {"MHA", "GQA", "MQA", "MLA"} and rows["MLA"].is_given
    assert rows["MLA"].vs_mha == pytest.approx(2 * 128 * 128 / 576)  # 56.9× smaller than MHA


def test_projection_and_budget():
    smol = KVConfig(30, 3, 64, n_heads=9, dtype="bf16")
    assert smol.bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    assert smol.total_bytes(8192) == 8192 * 23_040  # max context of SmolLM2
    assert smol.max_seq_len(1 * GB) == GB // 23_040
    assert smol.total_bytes(smol.max_seq_len(1 * GB)) <= GB < smol.total_bytes(smol.max_seq_len(1 * GB) + 1)
    assert LLAMA70B.max_seq_len(80 * GB) == 80 * GB // 327_680  # ≈ 244k tokens on an 80 GB card
    with pytest.raises(ValueError, match="budget"):
        smol.max_seq_len(-1)


def test_default_gqa_row_and_explicit_choices():
    assert [default_gqa_kv_heads(n) for n in (64, 32, 9, 12, 14, 7, 2, 1)] == [
        8,
        8,
        3,
        6,
        7,
        None,
        None,
        None,
    ]
    mha = KVConfig(32, 32, 128, dtype="fp16")
    rows = compare_schemes(mha, 4096)
    assert [r.label for r in rows] == ["MHA", "GQA-8", "MQA"] and rows[0].is_given
    assert [r.label for r in compare_schemes(mha, 4096, gqa_kv_heads=4)][1] == "GQA-4"
    assert [r.label for r in compare_schemes(KVConfig(4, 7, 16), 10)] == ["MHA", "MQA"]  # 7 heads: no GQA


def test_from_model_info():
    info = SimpleNamespace(
        name="SmolLM2-135M-Instruct", n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, dtype="float32"
    )
    cfg = KVConfig.from_info(info)
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dtype) == (30, 9, 3, 64, "float32")
    assert KVConfig.from_info(info, dtype="bf16").bytes_per_token == 23_040


def test_formula_equals_the_live_torch_cache(smol_ran):
    # the bytes the model's DynamicCache tensors actually hold after a prefill
    s = smol_ran
    cfg = KVConfig.from_info(s.info, dtype=s.info.dtype)
    assert cfg.total_bytes(s.seq_len) == s.backend.kv_cache_bytes() > 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kv_cache_bytes(-1, 8, 128, 10), "n_layers"),
        (lambda: kv_cache_bytes(1, 8, 128, 10, "fp64"), "unknown dtype"),
        (lambda: KVConfig(80, 3, 128, n_heads=64), "multiple"),
        (lambda: KVConfig(80, 8, 128.0), "integer"),
        (lambda: attention_matrix_bytes(-5), "seq_q"),
    ],
)
def test_bad_sizes_raise_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(2_684_354_560) == "2.68 GB"
    assert format_bytes(2_684_354_560, binary=True) == "2.50 GiB"  # 3 significant digits
    assert format_bytes(335_544_320, digits=2) == "340 MB"


# --------------------------------------------------------------------- attnscope kv ------------

ARGS_70B = [
    "kv",
    "--n-layers",
    "80",
    "--n-kv-heads",
    "8",
    "--n-heads",
    "64",
    "--head-dim",
    "128",
    "--seq-len",
    "8192",
    "--dtype",
    "bf16",
]


def test_cli_prints_config_bytes_and_scheme_table(capsys):
    assert main(ARGS_70B) == 0
    out = capsys.readouterr().out
    assert "80 layers × 8 KV heads × head_dim 128, 8192 tokens, bf16 (GQA, group 8)" in out
    assert "2,684,354,560 B" in out and "2.68 GB" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip().startswith(("MHA", "GQA-", "MQA"))}
    assert "21,474,836,480" in lines["MHA"] and "21.5 GB" in lines["MHA"]
    assert "335,544,320" in lines["MQA"] and "64× smaller" in lines["MQA"]
    assert "this config" in lines["GQA-8"] and "this config" not in lines["MHA"]


def test_cli_json_mla_batch_and_max_context(capsys):
    assert (
        main(
            ARGS_70B
            + [
                "--json",
                "--batch",
                "2",
                "--mla-latent-dim",
                "512",
                "--mla-rope-dim",
                "64",
                "--max-context",
                "131072",
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert rep["total_bytes"] == 2 * 2_684_354_560
    assert rep["max_context"]["total_bytes"] == 2 * 2 * 80 * 8 * 128 * 131072 * 2
    mla = [r for r in rep["schemes"] if r["scheme"] == "MLA"][0]
    assert mla["total_bytes"] == 576 * 80 * 8192 * 2 * 2


def test_cli_defaults_to_mha_without_n_heads(capsys):
    assert main(["kv", "--n-layers", "2", "--n-kv-heads", "4", "--head-dim", "8", "--seq-len", "10"]) == 0
    out = capsys.readouterr().out
    assert "(MHA)" in out and "1,280 B" in out  # 2 × 2 × 4 × 8 × 10 × 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--n-heads", "60"], "multiple"),
        (["--seq-len", "-1"], "seq-len"),
        (["--gqa-kv-heads", "5"], "divide"),
    ],
)
def test_cli_bad_config_exits_nonzero_with_one_line(capsys, extra, message):
    assert main(ARGS_70B + extra) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnscope: error:") and message in err and "\n" not in err
