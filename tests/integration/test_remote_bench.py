"""``attnscope bench --engine``: the link's floor (a reply the engine already holds) beside the map,
and the probe's refusals (the bench's target)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


@pytest.fixture(scope="module")
def served_qwen3(tmp_path_factory):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("bench_qwen3")
    save_tiny("qwen3", folder, seed=5)
    with serving(Session.load(str(folder), device="cpu")) as server:
        yield folder, server


def test_probe_sends_the_bytes_asked_and_refusals_leave_the_engine_serving(served_qwen3):
    from attnscope.core.remote.client import RemoteSession, TooLarge

    _, server = served_qwen3
    r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=30)
    try:
        assert r.probe(4096) > 0
        held = server._probe
        assert held.dtype == np.float32 and held.size == 1024 and np.all(held == 1.0)  # ones, not garbage
        r.probe(4096)
        assert server._probe is held  # kept between probes of one size: no compute, no allocation
        r.probe(10)  # rounded down to whole float32 cells
        assert server._probe.size == 2
        for bad in (-1, True, "many"):
            with pytest.raises(ValueError, match="probe takes a byte count"):
                r._request("probe", {"nbytes": bad})
        old = server.max_reply_bytes
        server.max_reply_bytes = 1 << 20
        try:
            with pytest.raises(TooLarge, match="2 MB probe is over the engine's reply limit of 1 MB"):
                r.probe(2 << 20)
        finally:
            server.max_reply_bytes = old
        assert r.probe(1 << 20) > 0  # still serving
    finally:
        r.close()


def test_bench_reports_the_links_floor_beside_the_map(served_qwen3):
    from attnscope.core.bench.remote import format_remote_table, run_remote_bench

    folder, server = served_qwen3
    res = run_remote_bench(f"127.0.0.1:{server.port}", token=TOKEN, seq_len=48, repeats=1)
    T = res["seq_len"]
    assert T >= 48 and res["map_bytes"] == T * T * 4
    assert res["bit_identical"] is True
    assert res["floor_s"] > 0 and res["engine_map_s"] > 0
    assert res["floor_ratio"] == pytest.approx((res["local_map_s"] + res["floor_s"]) / res["local_map_s"])
    assert res["targets"]["map_met"] == (res["map_ratio"] <= 2.0)
    # the breakdown is of the same calls and adds up (a new user read "remote 15.8 ms, transport
    # 11.1 ms, compute 11.1 ms": separate samples that could not be added)
    for key in ("map", "table"):
        assert res[f"{key}_wall_s"] == pytest.approx(res[f"engine_{key}_s"] + res[f"{key}_overhead_s"])
        assert res[f"engine_{key}_s"] > 0
    text = format_remote_table(res)
    assert "the link alone" in text and f"{res['map_bytes'] / 1e6:.1f} MB it already holds" in text
    wall, compute, rest = (res[k] * 1e3 for k in ("map_wall_s", "engine_map_s", "map_overhead_s"))
    assert (
        f"{wall:.1f} ms = the engine's compute {compute:.1f} ms + sending, receiving and decoding {rest:.1f} ms"
        in text
    )
    assert "in-process + transport" not in text  # one ratio against the target, one for the floor
