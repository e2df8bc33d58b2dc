"""Head roles: every score against numpy on transformers eager attentions (tiny models, SmolLM2), the
induction probe, labels by hand, the user's session left intact, and ``attnscope roles``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from attnscope.core.analysis import roles
from attnscope.core.analysis.sinks import delimiter_positions
from tiny_models import eager_reference, save_tiny

PROMPT = "Hi. The cat sat, then the dog sat.\nIt ran"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = {}
    for fam in ("llama", "mistral"):
        folder = tmp_path_factory.mktemp(fam)
        out[fam] = (folder, save_tiny(fam, folder))
    return out


def _session(folder, prompt=PROMPT):
    from attnscope.core.session import Session

    s = Session.load(str(folder))
    s.prefill(prompt, chat_template=False)
    return s


def reference_scores(A: np.ndarray, delims: list[int], window: int) -> dict[str, np.ndarray]:
    """The module docstring's definitions, spelled out with loops over eager maps ``A (L, H, T, T)``."""
    L, H, T, _ = A.shape
    prev = np.mean([A[:, :, i, i - 1] for i in range(2, T)], axis=0)
    D = {0, *delims}
    sink = np.mean([sum(A[:, :, i, j] for j in D if j <= i) for i in range(1, T)], axis=0)
    local = np.mean(
        [sum(A[:, :, i, j] for j in range(max(1, i - window + 1), i + 1) if j != i - 1) for i in range(1, T)],
        axis=0,
    )
    return {"previous_token": prev, "sink": sink, "local": local}


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_diagonals_equal_eager_and_blocked_path(tiny, family):
    folder, eager = tiny[family]
    s = _session(folder)
    _, att = eager_reference(eager, s.ids)
    A = np.stack(att)
    T = s.seq_len
    for off in (0, 1, 3, 5, T - 1, T + 2):
        d = roles.diagonal_weights(s.trace, off)
        ref = np.zeros_like(d)
        for i in range(off, T):
            ref[..., i] = A[..., i, i - off]
        np.testing.assert_allclose(d, ref, atol=2e-6)
        np.testing.assert_allclose(roles._diagonal_blocked(s.trace, off, block=5), d, atol=2e-6)
    if family == "mistral":  # window 4: offsets >= 4 are outside it
        assert not roles.diagonal_weights(s.trace, 4).any()
    with pytest.raises(ValueError):
        roles.diagonal_weights(s.trace, -1)


@pytest.mark.parametrize("family", ["llama", "mistral"])
@pytest.mark.parametrize("window", [2, 4])
def test_sequence_scores_equal_reference(tiny, family, window):
    folder, eager = tiny[family]
    s = _session(folder)
    delims = delimiter_positions(s.tokens)
    _, att = eager_reference(eager, s.ids)
    ref = reference_scores(np.stack(att), delims, window)
    got = roles.sequence_scores(s.trace, delims, window)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], atol=3e-6, err_msg=k)


def test_probe_ids_structure():
    from tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    ids, off = roles.probe_ids(tok, 262, length=20, seed=3)
    assert off == 1 and ids[0] == tok.bos_token_id and len(ids) == 41
    assert ids[1:21] == ids[21:]
    assert not set(ids[1:]) & set(tok.all_special_ids)
    assert roles.probe_ids(tok, 262, 20, 3) == (ids, off)  # seeded
    assert roles.probe_ids(tok, 262, 20, 4)[0] != ids
    with pytest.raises(ValueError):
        roles.probe_ids(tok, 262, length=1)


def test_induction_scores_equal_eager_on_the_probe(tiny):
    folder, eager = tiny["llama"]
    s = _session(folder)
    R = 12
    got = roles.induction_scores(s, length=R, n_probes=2, seed=5)
    ref = []
    for p in range(2):
        ids, off = roles.probe_ids(s.tokenizer, 262, R, 5 + p)
        _, att = eager_reference(eager, ids)
        A = np.stack(att)
        ref.append(np.mean([A[:, :, i, i - R + 1] for i in range(off + R, off + 2 * R)], axis=0))
    np.testing.assert_allclose(got, np.mean(ref, axis=0), atol=2e-6)


def test_labels_by_hand():
    sc = {
        "previous_token": np.array([[0.9, 0.1, 0.45, 0.1, np.nan]]),
        "induction": np.array([[0.0, 0.6, 0.50, 0.1, np.nan]]),
        "sink": np.array([[0.95, 0.9, 0.2, 0.3, 0.8]]),
        "local": np.array([[0.0, 0.0, 0.1, 0.2, np.nan]]),
    }
    # a specific role above the threshold wins over the sink (the sink is the no-op default);
    # among specific roles the highest; below every threshold: mixed; NaN never chosen
    assert list(roles.label_heads(sc, 0.4)[0]) == [
        "previous_token",
        "induction",
        "induction",
        "mixed",
        "sink",
    ]
    assert list(roles.label_heads(sc, 0.55)[0]) == ["previous_token", "induction", "mixed", "mixed", "sink"]
    assert list(roles.label_heads(sc, 0.99)[0]) == ["mixed"] * 5


def test_role_table_leaves_the_session_intact(tiny):
    folder, _ = tiny["llama"]
    s = _session(folder)
    s.step(2)
    ids, logits, w = s.ids, s.logits.copy(), s.weights(1, 3).copy()
    table = roles.role_table(s, probe_len=10, n_probes=1)
    assert s.ids == ids and np.array_equal(s.logits, logits) and np.array_equal(s.weights(1, 3), w)
    for m in s.backend.model.modules():
        if hasattr(m, "_attnscope_trace"):
            assert m._attnscope_trace is s.trace
    assert getattr(s.trace, "overrides", None) is None
    s.step(1)  # still decodes from where it was
    assert s.seq_len == len(ids) + 1
    rows = table.rows()
    assert len(rows) == 2 * 4 and rows[5]["layer"] == 1 and rows[5]["head"] == 1 and rows[5]["kv_head"] == 0
    assert set(rows[0]) == {"layer", "head", "kv_head", "label", *roles.ROLES}
    relabelled = table.relabel(0.0)
    assert "mixed" not in set(relabelled.labels.ravel())


@pytest.mark.slow
def test_smollm2_roles_against_eager(smol_session, smol_folder):
    """Every score of all 270 heads vs eager; the induction heads the probe finds (measured once:
    L18H6 0.89, L17H3 0.76, L17H4 0.72, L17H5 0.58, L18H7 0.57); previous-token heads L16H0, L11H1."""
    from transformers import AutoModelForCausalLM

    s = smol_session
    s.prefill(
        "The quick brown fox jumps over the lazy dog. Attention lets every token look back.",
        chat_template=False,
    )
    table = roles.role_table(s, probe_len=50, n_probes=1)
    eager = AutoModelForCausalLM.from_pretrained(
        smol_folder, attn_implementation="eager", dtype=torch.float32
    )
    _, att = eager_reference(eager, s.ids)
    ref = reference_scores(
        np.stack(att), delimiter_positions(s.tokens, s.tokenizer.all_special_ids), roles.DEFAULT_WINDOW
    )
    for k in ref:
        np.testing.assert_allclose(table.scores[k], ref[k], atol=5e-6, err_msg=k)
    ids, off = roles.probe_ids(s.tokenizer, s.info.vocab_size, 50, 0)
    _, att = eager_reference(eager, ids)
    A = np.stack(att)
    ind = np.mean([A[:, :, i, i - 49] for i in range(off + 50, off + 100)], axis=0)
    np.testing.assert_allclose(table.scores["induction"], ind, atol=5e-6)
    top = table.heads_with("induction")
    assert {(18, 6), (17, 3), (17, 4)} <= set(top[:5])
    assert table.scores["induction"][18, 6] > 0.8
    assert {(16, 0), (11, 1)} <= set(table.heads_with("previous_token"))
    assert table.scores["induction"][:10].max() < 0.1  # no induction head in the first layers


def test_cli_roles_json(tiny, tmp_path, capsys):
    from attnscope.core.cli.main import main

    folder, eager = tiny["llama"]
    out = tmp_path / "roles.json"
    assert (
        main(
            [
                "roles",
                "--model",
                str(folder),
                "--prompt",
                PROMPT,
                "--no-chat-template",
                "--json",
                str(out),
                "--probe-len",
                "8",
                "--threshold",
                "0.3",
            ]
        )
        == 0
    )
    d = json.loads(out.read_text())
    assert d["threshold"] == 0.3 and d["probe_len"] == 8 and len(d["heads"]) == 8
    assert set(d["definitions"]) == {"previous_token", "induction", "sink", "local", "label"}
    s = _session(folder)
    _, att = eager_reference(eager, s.ids)
    ref = reference_scores(np.stack(att), delimiter_positions(s.tokens), 4)
    for h in d["heads"]:
        assert h["previous_token"] == pytest.approx(ref["previous_token"][h["layer"], h["head"]], abs=1e-5)
        assert h["label"] in (*roles.ROLES, "mixed")
    assert "heads:" in capsys.readouterr().out
    assert main(["roles", "--model", str(folder), "--prompt", "x", "--json", str(out), "--window", "1"]) == 1


def test_mlx_backend_sinks_roles_and_kv(tiny):
    """The MLX session gives the same sink table and role scores (its Trace has no torch internals:
    the generic paths), and its own cache is measured."""
    pytest.importorskip("mlx.core")
    from attnscope.core.analysis.kv_live import kv_live
    from attnscope.core.analysis.sinks import session_sink_report
    from attnscope.core.session import Session

    folder, eager = tiny["llama"]
    s = Session.load(str(folder), backend="mlx")
    s.prefill(PROMPT, chat_template=False)
    s.step(1)
    ids = s.ids
    _, att = eager_reference(eager, ids)
    A = np.stack(att)
    np.testing.assert_allclose(session_sink_report(s).sink, A[:, :, 1:, 0].mean(-1), atol=1e-5)
    table = roles.role_table(s, probe_len=8, n_probes=1)
    ref = reference_scores(A, delimiter_positions(s.tokens), roles.DEFAULT_WINDOW)
    for k in ref:
        np.testing.assert_allclose(table.scores[k], ref[k], atol=1e-5, err_msg=k)
    probe, off = roles.probe_ids(s.tokenizer, 262, 8, 0)
    _, patt = eager_reference(eager, probe)
    P = np.stack(patt)
    np.testing.assert_allclose(
        table.scores["induction"],
        np.mean([P[:, :, i, i - 7] for i in range(off + 8, off + 16)], axis=0),
        atol=1e-5,
    )
    assert s.ids == ids  # the probe ran in its own caches
    live = kv_live(s)
    assert live.total_bytes == live.formula_bytes == s.kv_cache_bytes()
