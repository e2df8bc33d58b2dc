"""Sink scores: by hand on a constructed Trace, against transformers eager on tiny models and SmolLM2,
tracked across decode steps, and the ``attnscope sinks`` JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from attnscope.core.analysis.sinks import (
    delimiter_positions,
    is_delimiter_text,
    running_mean_from_row1,
    session_sink_report,
    sink_report,
    weight_on_keys,
)
from attnscope.core.tokens import Token
from attnscope.core.trace.torch_trace import TorchTrace
from tiny_models import eager_reference, save_tiny

PROMPT = "Hi. The cat sat, then the dog sat.\nIt ran"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{family: (folder, eager model)} for a llama and a mistral (sliding window 4)."""
    out = {}
    for fam in ("llama", "mistral"):
        folder = tmp_path_factory.mktemp(fam)
        out[fam] = (folder, save_tiny(fam, folder))
    return out


def _session(folder):
    from attnscope.core.session import Session

    return Session.load(str(folder))


def _uniform_trace(T: int, n_layers: int = 1, n_heads: int = 2, n_kv_heads: int = 1) -> TorchTrace:
    """All keys zero: every row i attends uniformly to keys 0..i, so w[i, j] = 1/(i+1), lse_i = log(i+1)."""
    tr = TorchTrace(n_layers, n_heads, n_kv_heads, head_dim=2)
    q = torch.randn(1, n_heads, T, 2)
    k = torch.zeros(1, n_kv_heads, T, 2)
    lse = torch.log(torch.arange(1, T + 1, dtype=torch.float32)).expand(1, n_heads, T).contiguous()
    for layer in range(n_layers):
        tr.record(layer, q, lse, k, 0.7, None)
    return tr


def test_delimiter_text_and_positions():
    assert (
        is_delimiter_text(".")
        and is_delimiter_text(" ,")
        and is_delimiter_text("↵")
        and is_delimiter_text(" ")
    )
    assert not is_delimiter_text(" the") and not is_delimiter_text("") and not is_delimiter_text("a.")
    toks = [
        Token(0, 1, "<s>", "<s>"),
        Token(1, 50, "Hi", "Hi"),
        Token(2, 13, ".", "."),
        Token(3, 4, "<|im_start|>", "<|im_start|>"),
        Token(4, 60, "Ġcat", " cat"),
        Token(5, 198, "Ċ", "↵"),
        Token(6, 70, "<0x0A>", "↵"),
        Token(7, 99, "x", "x"),
    ]
    # position 0 is the sink itself, never listed; markup, special ids, punctuation and newlines are
    assert delimiter_positions(toks, special_ids=[99]) == [2, 3, 5, 6, 7]
    assert delimiter_positions(toks) == [2, 3, 5, 6]


def test_running_mean_by_hand():
    per_row = np.array([[[0.9, 0.5, 0.3, 0.1]]], dtype=np.float32)
    r = running_mean_from_row1(per_row)
    assert math.isnan(r[0, 0, 0])
    np.testing.assert_allclose(r[0, 0, 1:], [0.5, 0.4, 0.3], rtol=1e-6)


def test_sink_scores_by_hand_on_uniform_attention():
    T = 4
    tr = _uniform_trace(T)
    toks = [Token(i, 10 + i, t, t) for i, t in enumerate(["a", "b", ".", "c"])]
    rep = sink_report(tr, toks, n_prompt=3)
    # rows 1..3 put 1/2, 1/3, 1/4 on key 0
    assert rep.sink[0, 0] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3, abs=1e-6)
    # the period at position 2 joins the sink set: rows 1..3 put 1/2, 2/3, 2/4 on {0, 2}
    assert rep.delimiters == (2,)
    assert rep.sink_set[0, 1] == pytest.approx((1 / 2 + 2 / 3 + 2 / 4) / 3, abs=1e-6)
    # the table after 3 tokens (prefill) and after 4 (one decode step)
    steps = rep.by_step()
    assert [n for n, _ in steps] == [3, 4]
    assert steps[0][1][0, 0] == pytest.approx((1 / 2 + 1 / 3) / 2, abs=1e-6)
    assert rep.sink_heads(0.4) == []
    assert rep.sink_heads(0.3) == [(0, 0), (0, 1)]
    # keys 1 and 3: row 1 sees key 1 (1/2), row 2 key 1 (1/3), row 3 both (2/4)
    np.testing.assert_allclose(weight_on_keys(tr, [1, 3])[0, 0], [0, 1 / 2, 1 / 3, 2 / 4], atol=1e-6)


def test_bad_input():
    tr = _uniform_trace(3)
    toks = [Token(i, i, "a", "a") for i in range(3)]
    with pytest.raises(ValueError, match="threshold"):
        sink_report(tr, toks, threshold=1.5)
    with pytest.raises(ValueError, match="tokens"):
        sink_report(tr, toks[:2])
    with pytest.raises(IndexError):
        weight_on_keys(tr, [5])


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_sink_table_equals_eager(tiny, family):
    folder, eager = tiny[family]
    s = _session(folder)
    s.prefill(PROMPT, chat_template=False)
    s.step(3)
    rep = session_sink_report(s)
    _, att = eager_reference(eager, s.ids)
    A = np.stack(att)  # (L, H, T, T)
    np.testing.assert_allclose(rep.sink, A[:, :, 1:, 0].mean(-1), atol=2e-6)
    D = [0, *rep.delimiters]
    assert len(rep.delimiters) >= 3  # ". , . \n" in the prompt
    np.testing.assert_allclose(rep.sink_set, A[:, :, 1:, D].sum(-1).mean(-1), atol=2e-6)
    np.testing.assert_allclose(rep.per_row, A[:, :, :, 0], atol=2e-6)
    if family == "mistral":  # window 4: rows >= 4 cannot see token 0
        assert np.all(rep.per_row[..., 4:] == 0)


def test_tracking_across_decode_steps_equals_fresh_runs(tiny):
    """The table after prefill and after each step equals eager on that prefix (decode never changes old rows)."""
    folder, eager = tiny["llama"]
    s = _session(folder)
    s.prefill(PROMPT, chat_template=False)
    s.step(4)
    rep = session_sink_report(s)
    assert [n for n, _ in rep.by_step()] == list(range(s.n_prompt, s.seq_len + 1))
    for n, table in rep.by_step():
        _, att = eager_reference(eager, s.ids[:n])
        np.testing.assert_allclose(table, np.stack(att)[:, :, 1:, 0].mean(-1), atol=2e-6)
    # and after stepping back two tokens, the session's own table is the one recorded for that length
    s.step_back(2)
    np.testing.assert_allclose(session_sink_report(s).sink, rep.at_seq_len(s.seq_len), atol=1e-6)


def test_generic_trace_path_equals_torch(tiny):
    folder, _ = tiny["llama"]
    s = _session(folder)
    s.prefill(PROMPT, chat_template=False)

    class OnlyWeightOnKey:  # what a non-torch trace (MLX) offers
        def __init__(self, t):
            self.t, self.n_layers, self.n_heads, self.seq_len = t, t.n_layers, t.n_heads, t.seq_len

        def weight_on_key(self, k):
            return self.t.weight_on_key(k)

    np.testing.assert_allclose(
        weight_on_keys(OnlyWeightOnKey(s.trace), [2, 5, 7]), weight_on_keys(s.trace, [2, 5, 7]), atol=1e-6
    )


@pytest.mark.slow
def test_smollm2_sink_table_equals_eager(smol_session, smol_folder):
    """All 30 × 9 heads, with the chat template (its <|im_start|>, <|im_end|> and newlines are delimiters)."""
    from transformers import AutoModelForCausalLM

    s = smol_session
    s.prefill("The cat sat on the mat. Why?", chat_template=True)
    s.step(2)
    rep = session_sink_report(s)
    eager = AutoModelForCausalLM.from_pretrained(
        smol_folder, attn_implementation="eager", dtype=torch.float32
    )
    _, att = eager_reference(eager, s.ids)
    A = np.stack(att)
    np.testing.assert_allclose(rep.sink, A[:, :, 1:, 0].mean(-1), atol=5e-6)
    np.testing.assert_allclose(rep.sink_set, A[:, :, 1:, [0, *rep.delimiters]].sum(-1).mean(-1), atol=5e-6)
    texts = [rep.token_texts[p] for p in rep.delimiters]
    assert "<|im_end|>" in texts and "↵" in texts and "." in texts and "?" in texts
    # SmolLM2's early layers do not sink, its middle and late layers do (measured: 0.00-0.12 in
    # layers 0-2, most heads of layers 13-28 above 0.5)
    assert rep.sink[:3].max() < 0.2
    assert (rep.sink[13:29] >= 0.5).mean() > 0.7


def test_cli_sinks_json(tiny, tmp_path, capsys):
    from attnscope.core.cli.main import main

    folder, eager = tiny["llama"]
    out = tmp_path / "sinks.json"
    rc = main(
        [
            "sinks",
            "--model",
            str(folder),
            "--prompt",
            PROMPT,
            "--no-chat-template",
            "--steps",
            "2",
            "--json",
            str(out),
            "--threshold",
            "0.2",
        ]
    )
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["n_layers"] == 2 and d["n_heads"] == 4 and d["threshold"] == 0.2
    assert len(d["by_step"]) == 3 and d["by_step"][-1]["seq_len"] == d["seq_len"]
    s = _session(folder)
    s.prefill(PROMPT, chat_template=False)
    s.step(2)
    _, att = eager_reference(eager, s.ids)
    np.testing.assert_allclose(np.array(d["sink"]), np.stack(att)[:, :, 1:, 0].mean(-1), atol=1e-5)
    assert d["sink_heads"] == [[a, b] for a, b in zip(*np.nonzero(np.array(d["sink"]) >= 0.2), strict=True)]
    assert "row 0" in d["definition"]
    assert "wrote" in capsys.readouterr().out
    assert (
        main(["sinks", "--model", str(folder), "--prompt", "x", "--json", str(tmp_path / "no" / "x.json")])
        == 1
    )
    assert (
        main(["sinks", "--model", str(folder), "--prompt", "x", "--json", str(out), "--threshold", "2"]) == 1
    )
