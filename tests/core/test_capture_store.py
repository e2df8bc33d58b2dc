"""The Trace's preallocated q/LSE store: growth, reservation, truncation keep every recorded row."""

from __future__ import annotations

import torch
from attnscope.core.trace import torch_trace as capture
from attnscope.core.trace.torch_trace import TorchTrace


def _feed(tr, qs, lses, L, rng_seed):
    g = torch.Generator().manual_seed(rng_seed)
    q = torch.randn(1, tr.n_heads, L, tr.head_dim, generator=g)
    lse = torch.randn(1, tr.n_heads, L, generator=g)
    S = sum(x.shape[2] for x in qs[0]) + L
    key = torch.randn(1, tr.n_kv_heads, S, tr.head_dim, generator=g)
    for layer in range(tr.n_layers):
        tr.record(layer, q + layer, lse + layer, key, 0.125, None)
        qs[layer].append(q + layer)
        lses[layer].append(lse + layer)


def _check(tr, qs, lses):
    for layer in range(tr.n_layers):
        rec = tr.layers[layer]
        expect_q = torch.cat(qs[layer], dim=2)[0]
        expect_lse = torch.cat(lses[layer], dim=2)[0]
        assert rec.n_rows() == expect_q.shape[1] == tr.seq_len
        assert torch.equal(rec.q(), expect_q) and torch.equal(rec.lse(), expect_lse)


def test_growth_without_reserve_keeps_rows(monkeypatch):
    monkeypatch.setattr(capture, "HEADROOM_ROWS", 2)  # grow often
    tr = TorchTrace(3, 4, 2, 8)
    qs, lses = [[] for _ in range(3)], [[] for _ in range(3)]
    caps = set()
    for i, L in enumerate([5, 1, 1, 1, 7, 1, 1, 1, 1, 1, 12, 1]):
        _feed(tr, qs, lses, L, i)
        caps.add(tr._store.capacity)
        _check(tr, qs, lses)
    assert len(caps) > 3  # it did regrow, several times


def test_reserve_is_one_allocation_and_record_fills_it():
    tr = TorchTrace(2, 4, 2, 8)
    tr.reserve(40, dtype=torch.float32, device="cpu")
    store = tr._store.q
    assert store.shape == (2, 4, 40 + capture.HEADROOM_ROWS, 8)
    qs, lses = [[] for _ in range(2)], [[] for _ in range(2)]
    for i, L in enumerate([16, 16, 8]):
        _feed(tr, qs, lses, L, i)
    assert tr._store.q is store  # no regrowth within the reservation
    _check(tr, qs, lses)


def test_truncate_then_append_overwrites(monkeypatch):
    monkeypatch.setattr(capture, "HEADROOM_ROWS", 1)
    tr = TorchTrace(2, 4, 2, 8)
    qs, lses = [[] for _ in range(2)], [[] for _ in range(2)]
    _feed(tr, qs, lses, 10, 0)
    tr.truncate(6)
    for layer in range(2):
        qs[layer] = [qs[layer][0][:, :, :6]]
        lses[layer] = [lses[layer][0][:, :, :6]]
    _check(tr, qs, lses)
    for i in range(1, 8):  # past the old capacity: regrows from 6 kept rows
        _feed(tr, qs, lses, 1, i)
    _check(tr, qs, lses)


def test_growth_in_the_middle_of_a_forward(monkeypatch):
    """Layer 0 has recorded the new chunk, layer 1 not yet, when the store regrows: nothing lost."""
    monkeypatch.setattr(capture, "HEADROOM_ROWS", 0)
    tr = TorchTrace(2, 2, 1, 4)
    q1 = torch.randn(1, 2, 3, 4)
    key = torch.randn(1, 1, 3, 4)
    for layer in range(2):
        tr.record(layer, q1, q1[..., 0], key, 0.5, None)
    q2 = torch.randn(1, 2, 2, 4)
    key2 = torch.randn(1, 1, 5, 4)
    tr.record(0, q2, q2[..., 0], key2, 0.5, None)  # grows to 5 rows
    tr._store.ensure(9, max(r.rows for r in tr.layers), torch.float32, torch.device("cpu"))  # regrow now
    tr.record(1, q2, q2[..., 0], key2, 0.5, None)
    for layer in range(2):
        assert torch.equal(tr.layers[layer].q(), torch.cat([q1, q2], dim=2)[0])
