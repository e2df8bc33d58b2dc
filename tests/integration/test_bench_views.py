"""`attnscope bench --views` (attnscope.core.bench.views): rows, targets and the table (no timing assertions)."""

from __future__ import annotations

from attnscope.core.bench import views as BV


def test_targets_and_table():
    result = {
        "smol": {"rows": {"head_grid_2000": 1.5, "head_grid_8000": 41.0, "one_head_8192": 0.031}},
        "long": {"rows": {"png_16k_extra_rss": 0.4e9, "long_prefill_peak_rss": 9.5e9}},
    }
    rows = {**result["smol"]["rows"], **result["long"]["rows"]}
    t = {x["row"]: x for x in BV.targets(rows)}
    assert t["head_grid_2000"]["met"] and not t["head_grid_8000"]["met"]
    assert t["one_head_8192"]["met"] and t["png_16k_extra_rss"]["met"] and t["long_prefill_peak_rss"]["met"]
    assert "mean_all_8192" not in t  # not measured: no row
    table = BV.format_views(result)
    assert "| head grid after prefill, SmolLM2, 8,000 tokens | 41.0 s | ≤ 30.0 s | no |" in table
    assert "| one head's map at 8,192 (1024-px overview) | 31 ms | ≤ 50 ms | yes |" in table
    assert "0.40 GB" in table and "≤ 12.00 GB" in table


def test_long_text_has_the_length_asked(smol_session):
    s = smol_session
    text = BV.long_text(s, 300)
    assert abs(len(s.encode(text, chat_template=False)) - 300) <= 2


def test_floors_follow_the_rates():
    """The floors are the work over the measured rates: matmul-bound rows scale with 1/FLOP/s, the
    mean adds one exponential per cell."""
    rates = {"tile_matmul_flops": 65e9, "exp_per_s": 1e9}
    f = BV.floors(8192, rates=rates)
    cells = 8192 * 8192 / 2
    assert abs(f["one_head_8192"] - cells * 130 / 65e9) < 1e-12
    assert abs(f["head_grid_8000"] - 270 * 8000 * 8000 / 2 * 130 / 65e9) < 1e-9
    assert abs(f["mean_all_8192"] - 270 * cells * (130 / 65e9 + 1e-9)) < 1e-9
    assert f["mean_all_8192"] > f["head_grid_8000"] > f["head_grid_2000"] > f["one_head_8192"]
    r = BV.kernel_rates(repeats=2)
    assert r["tile_matmul_flops"] > 1e8 and r["exp_per_s"] > 1e6


def test_explain_rows_time_the_band_split_and_the_share_ratio(tmp_path, monkeypatch):
    """The Why rows (:func:`attnscope.core.bench.views.explain_rows`) on a tiny model: each row there,
    the ratio is the two times it divides, and the table prints them with their targets."""
    from attnscope.core.session import Session
    from tiny_models import save_tiny

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.prefill(list(range(5, 69)))
    out = {"rows": {}}
    BV.explain_rows(s, out, layer=1, head=2)
    rows, ex = out["rows"], out["explain"]
    assert rows["explain_cell_8192"] > 0 and rows["explain_row_8192"] > 0
    assert out["cpu_s"]["explain_row_8192"] > 0 and out["cpu_s"]["explain_cell_8192"] > 0  # CPU beside wall
    assert rows["positional_share_vs_overview"] == ex["positional_share_s"] / ex["overview_s"]
    assert out["ratios"]["positional_share_vs_overview"] == rows["positional_share_vs_overview"]
    table = BV.format_views({"smol": out})
    assert "why: one cell's band split at 8,192 (no forward)" in table and "≤ 5 ms" in table
    assert "≤ 1.00×" in table
