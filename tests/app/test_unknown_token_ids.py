"""Token ids the tokenizer does not know read ``<id N>``, never ``None``, and say why.

Qwen and Phi-3 pad their embedding past the tokenizer's size; the tiny test models do the same
(vocab_size 272, a 262-token tokenizer: ids 262..271 have no text). A model steered to emit those
ids shows them as ``<id N>`` in the tokens, the generated text, the next-token list and panel, the
sidecar and the CLI, with :data:`attnscope.core.tokens.UNKNOWN_ID_NOTE` once.
"""

from __future__ import annotations

import json

import pytest
import torch
from attnscope.core.tokens import UNKNOWN_ID_NOTE, decode_text, is_unknown, token_text, unknown_label
from tiny_models import COMMON, tiny_model, tiny_tokenizer

N_KNOWN = 262  # tiny_tokenizer's size
UNK_A, UNK_B = 270, 271  # padded ids


def test_token_text_of_an_unknown_id():
    tok = tiny_tokenizer()
    assert len(tok) == N_KNOWN < COMMON["vocab_size"]
    assert tok.convert_ids_to_tokens(UNK_A) is None  # what used to read "None"
    assert token_text(tok, UNK_A) == ("<id 270>", "<id 270>")
    assert token_text(tok, N_KNOWN) == ("<id 262>", "<id 262>")  # the first id past the tokenizer
    assert token_text(tok, 2**40) == (unknown_label(2**40), f"<id {2**40}>")
    raw, label = token_text(tok, tok.convert_tokens_to_ids("Ġt"))  # a known one is unchanged
    assert (raw, label) == ("Ġt", " t") and not is_unknown(raw, tok.convert_tokens_to_ids("Ġt"))
    assert is_unknown("<id 270>", 270) and not is_unknown("<id 270>", 271)


def test_decoded_text_keeps_unknown_ids_in_place():
    tok = tiny_tokenizer()
    known = tok.encode("ab cd", add_special_tokens=False)
    assert decode_text(tok, known) == tok.decode(known) == "ab cd"
    ids = known[:2] + [UNK_A] + known[2:] + [UNK_B]
    assert tok.decode(ids) == "ab cd"  # transformers drops them silently
    assert decode_text(tok, ids) == "ab<id 270> cd<id 271>"


class _Slow:
    """A tokenizer that raises for an id past its vocabulary, as SentencePiece does."""

    def convert_ids_to_tokens(self, i):
        if i >= 10:
            raise IndexError("piece id is out of range.")
        return f"▁w{i}"


def test_a_tokenizer_that_raises_reads_the_same():
    assert token_text(_Slow(), 12) == ("<id 12>", "<id 12>")


@pytest.fixture(scope="module")
def padded_folder(tmp_path_factory):
    """A tiny llama whose logits are nonzero only at the padded ids 270 and 271 (the final norm keeps
    one hidden unit; lm_head reads it as +1 for 270, -1 for 271), so greedy decoding emits them."""
    model = tiny_model("llama", seed=3)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[UNK_A, 0] = 20.0
        model.lm_head.weight[UNK_B, 0] = -20.0
    folder = tmp_path_factory.mktemp("padded") / "llama-padded"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def ran(padded_folder):
    from attnscope.core.session import Session

    s = Session.load(str(padded_folder))
    s.prefill("ab cd", chat_template=False)
    s.step(2)
    return s


def test_session_tokens_text_and_next_tokens(ran):
    from attnscope.core.analysis.timeline import next_tokens

    new = ran.tokens[ran.n_prompt :]
    assert [t.id for t in new] == [t.id for t in new if t.id in (UNK_A, UNK_B)] and len(new) == 2
    assert [t.text for t in new] == [f"<id {t.id}>" for t in new] == [t.raw for t in new]
    assert ran.text() == "".join(f"<id {t.id}>" for t in new)
    assert "None" not in ran.text(generated_only=False)
    table = next_tokens(ran, step=0)
    assert table.rows[0].id in (UNK_A, UNK_B) and table.rows[0].text == f"<id {table.rows[0].id}>"
    assert all(r.text != "None" for r in table.rows)


def test_sidecar_says_why_once(ran):
    from attnscope.core.io.provenance import session_metadata

    meta = session_metadata(ran)
    assert meta["token_texts"][-2:] == [f"<id {i}>" for i in ran.ids[-2:]]
    assert meta["token_note"] == UNKNOWN_ID_NOTE
    assert "padded past the tokenizer's size" in UNKNOWN_ID_NOTE


def test_sidecar_without_unknown_ids_has_no_note(padded_folder):
    from attnscope.core.io.provenance import session_metadata
    from attnscope.core.session import Session

    s = Session.load(str(padded_folder))
    s.prefill("ab cd", chat_template=False)
    assert "token_note" not in session_metadata(s)


def test_cli_prints_them_with_one_note(padded_folder, tmp_path, capsys, monkeypatch):
    from attnscope.core.cli.main import main

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "map.npy"
    rc = main(["export", "--model", str(padded_folder), "--prompt", "ab cd", "--no-chat-template",
               "--steps", "2", "--layer", "0", "--head", "0", "--out", str(out)])  # fmt: skip
    got = capsys.readouterr()
    assert rc == 0, got.err
    lines = got.out.strip().splitlines()
    tail = [line.split("\t") for line in lines[-2:]]
    assert [t[2] for t in tail] == [repr(f"<id {t[1]}>") for t in tail]
    assert got.err.count(f"note: {UNKNOWN_ID_NOTE}") == 1
    sidecar = json.loads(out.with_name(out.name + ".json").read_text())
    assert sidecar["token_note"] == UNKNOWN_ID_NOTE


def test_next_token_panel_legend_and_tooltip(ran, qtbot):
    from attnscope.app.views.next_token import DecodePanel
    from attnscope.core.analysis.timeline import next_tokens

    panel = DecodePanel()
    qtbot.addWidget(panel)
    panel.resize(300, 620)
    table = next_tokens(ran, step=0)
    panel.set_table(table)
    bars = panel.bars
    assert bars.toolTip() == UNKNOWN_ID_NOTE
    assert "<id N>: an id with no text (padded vocab)" in bars._legend(table)
    panel.show()
    qtbot.waitExposed(panel)
    panel.grab().save("/work/notes/shots/catalog_next_token_unknown_ids.png")
    from dataclasses import replace

    known = replace(table, rows=tuple(r for r in table.rows if not is_unknown(r.raw, r.id)))
    panel.set_table(known)
    assert bars.toolTip() == "" and not any("<id N>" in line for line in bars._legend(known))
