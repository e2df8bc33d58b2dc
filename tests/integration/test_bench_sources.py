"""``attnscope bench --sources`` (attnscope.core.bench.sources): its rows, ratio and table on a tiny model
(no timing assertion: the figures are measured on the default model)."""

from __future__ import annotations

import json

import pytest
from tiny_models import save_tiny


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def test_sources_bench_rows_and_cli(tmp_path, capsys):
    from attnscope.core.bench.sources import TARGET_RATIO, format_sources, sources_bench
    from attnscope.core.cli.main import main

    folder = tmp_path / "llama"
    save_tiny("llama", folder, num_hidden_layers=4)
    res = sources_bench(str(folder), T=24, repeats=1)
    assert res["seq_len"] == 24 and (res["query"], res["key"]) == (23, 12)
    assert sorted(res["rows"]) == [2, 3]  # the middle and the last layer
    for row in res["rows"].values():
        assert row["prefill_s"] > 0 and row["split_s"] > 0
        assert row["ratio"] == pytest.approx(row["split_s"] / row["prefill_s"])
        assert row["met"] == (row["ratio"] <= TARGET_RATIO)
    table = format_sources(res)
    assert "| 3 |" in table and "≤ 1.5" in table
    out = tmp_path / "b.json"
    assert (
        main(["bench", "--model", str(folder), "--sources", "16", "--repeats", "1", "--json", str(out)]) == 0
    )
    assert "source split of cell (15, 8)" in capsys.readouterr().out
    assert set(json.loads(out.read_text())["rows"]) == {"2", "3"}
