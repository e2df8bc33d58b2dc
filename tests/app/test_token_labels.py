"""Token labels by tokenizer kind, control characters as visible stand-ins, prompts without tokens."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from attnscope.core.errors import SessionError
from attnscope.core.tokens import (
    BYTE_LEVEL,
    NO_TOKENS,
    PLAIN,
    SENTENCEPIECE,
    display_label,
    roundtrip_notice,
    token_text,
    tokenizer_kind,
    visible_text,
)

CONTROL_PROMPT = "Before\x0cafter \x1b[31mred\x1b[0m\x07"


def _sentencepiece_tokenizer(pieces: list[str]):
    """A Gemma-like fast tokenizer: BPE with byte fallback, ``▁`` for spaces, decoder Replace+ByteFallback+Fuse."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    vocab = {t: i for i, t in enumerate(specials + byte_pieces + pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
    )


def _expected(tok, i: int) -> str:
    """The right label: ``decode([id])`` (▁ shown as space), a byte-fallback piece ≥ 0x80 as ``<0xNN>``."""
    raw = tok.convert_ids_to_tokens(i)
    if raw.startswith("<0x") and len(raw) == 6 and int(raw[3:5], 16) >= 0x80:
        return raw
    return visible_text(tok.decode([i]).replace("\u2581", " "))


# -- kinds ---------------------------------------------------------------------------------------------
def test_kind_comes_from_the_tokenizer(smol_session):
    assert tokenizer_kind(smol_session.tokenizer) == BYTE_LEVEL
    assert tokenizer_kind(_sentencepiece_tokenizer(["ör"])) == SENTENCEPIECE

    class Plain:
        pass

    assert tokenizer_kind(Plain()) == PLAIN


def test_sentencepiece_latin1_pieces_are_letters_not_bytes():
    # every character of "ör", "gå", "è", "û" is in GPT-2's byte table: the old guess decoded them as bytes
    pieces = ["Sm", "ör", "gå", "sb", "ord", "\u2581cr", "è", "me", "\u2581br", "û", "lée", "\u2581", "ÿ"]
    tok = _sentencepiece_tokenizer(pieces)
    ids = tok.convert_tokens_to_ids(pieces[:11])  # the segmentation of "Smörgåsbord crème brûlée"
    labels = [token_text(tok, i)[1] for i in ids]
    assert labels == ["Sm", "ör", "gå", "sb", "ord", " cr", "è", "me", " br", "û", "lée"]
    assert labels == [_expected(tok, i) for i in ids]
    assert "".join(labels) == "Smörgåsbord crème brûlée" == tok.decode(ids)
    # a character outside the vocabulary falls back to its UTF-8 bytes: those pieces get escapes
    ids = tok.encode("€", add_special_tokens=False)
    assert [token_text(tok, i)[1] for i in ids] == ["<0xE2>", "<0x82>", "<0xAC>"]
    # ASCII byte fallback shows the character (a newline as ↵)
    assert display_label("<0x0A>", SENTENCEPIECE) == "↵" and display_label("<0x41>", SENTENCEPIECE) == "A"
    assert display_label("ÿ", SENTENCEPIECE) == "ÿ" and display_label("\u2581\u2581x", SENTENCEPIECE) == "  x"


def test_byte_level_still_decodes_markers(smol_ran):
    tok = smol_ran.tokenizer
    assert display_label("Ġcat", BYTE_LEVEL) == " cat" and display_label("ĊĊ", BYTE_LEVEL) == "↵↵"
    assert display_label("Ã¶", BYTE_LEVEL) == "ö"  # two stand-ins = the UTF-8 of ö
    assert display_label("Ã", BYTE_LEVEL) == "<0xC3>"  # genuinely incomplete UTF-8
    assert display_label("<|im_start|>", BYTE_LEVEL) == "<|im_start|>"
    smol_ran.prefill("Smörgåsbord crème brûlée\nnext", chat_template=False)
    for t in smol_ran.tokens:
        if "<0x" not in t.text:  # whole characters: the label is the decoded text
            assert t.text == visible_text(tok.decode([t.id])), (t.raw, t.text)
    assert "".join(t.text for t in smol_ran.tokens if "<0x" not in t.text).count("↵") == 1
    assert smol_ran.tokens[0].text == "Sm" or smol_ran.tokens[0].text.startswith("S")


# -- control characters ------------------------------------------------------------------------------------
def test_visible_text_every_control_character():
    for o in range(0x20):
        s = visible_text(chr(o))
        assert len(s) == 1 and ord(s) >= 0x2190, (o, s)  # ↵ ⇥ ␍ or a Control Picture
    assert visible_text("\x0c\x1b\x07\x00\x7f") == "␌␛␇␀␡"
    assert visible_text("\x85\ufffe") == "<U+0085><U+FFFE>"
    assert visible_text("plain ö ✓") == "plain ö ✓"


def test_control_prompt_labels(smol_ran):  # on the default model
    smol_ran.prefill(CONTROL_PROMPT, chat_template=False)
    labels = [t.text for t in smol_ran.tokens]
    assert labels == ["Before", "␌", "after", " ", "␛", "[", "3", "1", "m", "red", "␛", "[", "0", "m", "␇"]
    assert not any(ord(c) < 0x20 for lab in labels for c in lab)


@pytest.mark.slow
def test_control_prompt_svg_parses(tmp_path):  # a control-character prompt on the command line, verbatim
    from test_cli import attnscope as _run

    out = tmp_path / "map.svg"
    r = _run(
        "export",
        "--no-chat-template",
        "--prompt",
        CONTROL_PROMPT,
        "--layer",
        "0",
        "--head",
        "0",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    root = ET.parse(out).getroot()  # well-formed XML
    texts = "".join(el.text or "" for el in root.iter() if el.tag.endswith("text"))
    assert "␌" in texts and "␛" in texts and "␇" in texts
    assert not any(ord(c) < 0x20 and c not in "\n\t\r" for c in out.read_text(encoding="utf-8"))
    assert "1\t200\t'␌'" in r.stdout  # the CLI listing shows the same labels


# -- prompts the tokenizer empties or changes ----------------------------------------------------------------
def _dropping_model(folder):
    """A tiny llama whose tokenizer knows only a-z and space, has no unknown token and adds no BOS."""
    from tiny_models import tiny_model
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    model = tiny_model("llama")
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def test_prompt_without_tokens_is_one_line(tmp_path):
    from attnscope.core.session import Session

    s = Session.load(str(_dropping_model(tmp_path / "drop")))
    with pytest.raises(SessionError) as e:
        s.prefill("€€ ÿ!"[:2] + "!!", chat_template=False)  # nothing the vocabulary keeps
    assert str(e.value) == NO_TOKENS and "\n" not in str(e.value)
    s.prefill("ab€cd", chat_template=False)
    assert [t.text for t in s.tokens] == ["a", "b", "c", "d"]
    assert s.notice is not None and "'€' → ''" in s.notice
    s.prefill("abcd", chat_template=False)
    assert s.notice is None


def test_roundtrip_notice_default_model(smol_session):
    assert roundtrip_notice(smol_session.tokenizer, CONTROL_PROMPT) is None  # byte-level keeps every byte
    assert roundtrip_notice(smol_session.tokenizer, "plain text") is None
    tok = _sentencepiece_tokenizer(["a", "b"])
    assert roundtrip_notice(tok, "ab") is None


def test_prompt_without_tokens_stub(smol_session, monkeypatch):
    monkeypatch.setattr(smol_session, "encode", lambda *a, **k: [])
    with pytest.raises(SessionError, match="^the prompt has no tokens"):
        smol_session.prefill("anything", chat_template=False)


# -- the real SentencePiece model ------------------------------------------------------------------------------
@pytest.mark.slow
def test_gemma_labels_are_decoded_pieces(gemma_gguf):
    from attnscope.core.session import Session

    s = Session.load(str(gemma_gguf))
    assert tokenizer_kind(s.tokenizer) == SENTENCEPIECE
    s.prefill("Smörgåsbord crème brûlée", chat_template=False)
    labels = [t.text for t in s.tokens]
    assert labels == ["<bos>", "Sm", "ör", "gå", "sb", "ord", " crème", " brû", "lée"]
    assert labels == [_expected(s.tokenizer, t.id) for t in s.tokens]
    assert [t.raw for t in s.tokens][2] == "ör" and s.notice is None
    # beyond the input: every Latin-1 letter, and a newline / tab
    s.prefill("Ærøskøbing façade naïve Ångström\tÿ\n", chat_template=False)
    for t in s.tokens:
        assert t.text == _expected(s.tokenizer, t.id), (t.raw, t.text)
    assert all("<0x" not in t.text for t in s.tokens)
    from attnscope.core.io.provenance import session_metadata

    assert session_metadata(s)["token_texts"] == [t.text for t in s.tokens]


def test_lossy_prompt_notice_reaches_the_window_and_the_cli(tmp_path, qtbot):
    """Session.notices carries the tokenizer's change of the text; the window says it in the status bar."""
    from gui_helpers import ran_window

    folder = _dropping_model(tmp_path / "drop")
    win = ran_window(qtbot, folder, "ab€cd")
    assert win.snapshot.notices and "'€' → ''" in win.snapshot.notices[0]
    assert (
        win.statusBar().currentMessage().startswith("Note: ")
        and "'€' → ''" in win.statusBar().currentMessage()
    )
    win.close()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscope.app.cli",
            "export",
            "--model",
            str(folder),
            "--prompt",
            "ab€cd",
            "--no-chat-template",
            "--layer",
            "0",
            "--head",
            "0",
            "--out",
            str(tmp_path / "w.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "attnscope: note: " in r.stderr and "'€' → ''" in r.stderr
