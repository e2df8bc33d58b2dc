"""Saved sessions reopen with the same tokens and bit-identical weights; bad files are refused clearly."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from attnscope.core.errors import Cancelled, SessionError
from attnscope.core.io import sessionfile as SF
from attnscope.core.sampling import Sampling

PROMPT = "Once upon a time, in a small village by the sea,"
CHECK = [(0, 0), (3, 4), (17, 8), (29, 5)]  # (layer, head) pairs spread over the model


@pytest.fixture()
def sampled(smol_session):
    """The shared session after a prompt and 6 *sampled* steps (temperature 0.9, seed 7)."""
    s = smol_session
    s.set_sampling(Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=7))
    s.prefill(PROMPT, chat_template=False)
    s.step(6)
    yield s
    s.set_sampling(Sampling())


def test_save_and_load_round_trip(sampled, tmp_path):
    view = {
        "layer": 3,
        "head": 4,
        "tab": "heatmap",
        "cmap": "magma",
        "query_row": 5,
        "views": {"sinks": {"k": 1}},
    }
    sf = SF.SessionFile.from_session(sampled, view=view)
    path = SF.save(sf, tmp_path / "story")
    assert path.name == "story.attnscope"
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["format"] == "attnscope.session" and raw["version"] == 1
    assert raw["model"]["ref"] == "default" and len(raw["model"]["sha256"]) == 64
    assert raw["token_ids"] == sampled.ids and raw["n_prompt"] == sampled.n_prompt
    assert raw["sampling"] == {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 7}
    back = SF.load(path)
    assert back == sf
    assert back.generated_ids == tuple(sampled.ids[sampled.n_prompt :]) and back.n_generated == 6


def test_reopen_replays_tokens_and_gives_identical_weights(sampled, tmp_path):
    s = sampled
    ids = s.ids
    before = {lh: s.weights(*lh) for lh in CHECK}
    logits = s.logits.copy()
    path = SF.save(SF.SessionFile.from_session(s, view={"layer": 3, "head": 4}), tmp_path / "a.attnscope")

    # the session moves on to something else; reopening must bring the saved sequence back exactly
    s.set_sampling(Sampling())
    s.prefill("Something else entirely.", chat_template=False)
    s2, warnings = SF.replay(SF.load(path), session=s)
    assert s2 is s and warnings == []
    assert s.ids == ids  # replayed, not re-sampled (greedy would have chosen other tokens)
    assert s.sampling == Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=7)
    for lh, w in before.items():
        np.testing.assert_array_equal(s.weights(*lh), w)
    np.testing.assert_array_equal(s.logits, logits)


def test_reopened_session_continues_like_the_original(sampled, tmp_path):
    """Sampling after a reopen draws what the original session would have drawn next."""
    s = sampled
    path = SF.save(SF.SessionFile.from_session(s), tmp_path / "c.attnscope")
    s.step(3)
    original = s.ids
    s.set_sampling(Sampling())
    s.prefill("Something else entirely.", chat_template=False)
    SF.replay(SF.load(path), session=s)
    s.step(3)
    assert s.ids == original


@pytest.mark.slow
def test_reopen_in_a_fresh_session(sampled, tmp_path):
    """A colleague's fresh process: a newly loaded model gives the same tokens and bit-identical weights."""
    before = {lh: sampled.weights(*lh) for lh in CHECK}
    path = SF.save(SF.SessionFile.from_session(sampled), tmp_path / "b.attnscope")
    fresh, warnings = SF.replay(SF.load(path))
    assert fresh is not sampled and warnings == []
    assert fresh.ids == sampled.ids and fresh.n_prompt == sampled.n_prompt
    for lh, w in before.items():
        np.testing.assert_array_equal(fresh.weights(*lh), w)


def test_different_weights_hash_warns(sampled, tmp_path):
    sf = SF.SessionFile.from_session(sampled)
    d = sf.to_dict()
    d["model"]["sha256"] = "0" * 64
    _, warnings = SF.replay(SF.SessionFile.from_dict(d), session=sampled)
    assert len(warnings) == 1 and "weights differ" in warnings[0] and "000000000000" in warnings[0]


def test_prompt_that_tokenizes_differently_is_refused(sampled):
    """The refusal says how the ids differ: the first differing position (it said "tokenizes to 42
    ids here, not the saved 42" for one changed id), an id no vocabulary holds, or the counts."""
    base = SF.SessionFile.from_session(sampled).to_dict()
    ids = list(sampled.ids)
    d = json.loads(json.dumps(base))
    d["token_ids"][1] += 1  # as if saved with another tokenizer
    want = f"differ from the saved ones from position 1 on ({ids[1]} here, {ids[1] + 1} saved; {sampled.n_prompt} ids each)"
    with pytest.raises(SessionError, match=re.escape(want)):
        SF.replay(SF.SessionFile.from_dict(d), session=sampled)
    d = json.loads(json.dumps(base))
    d["token_ids"][2] = 99_999_999  # a hand-edited file
    vocab = sampled.info.vocab_size
    want = f"token id at position 2 is 99999999, outside this model's vocabulary (0..{vocab - 1}; the prompt gives {ids[2]} there)"
    with pytest.raises(SessionError, match=re.escape(want)):
        SF.replay(SF.SessionFile.from_dict(d), session=sampled)
    d = json.loads(json.dumps(base))
    d["prompt"] += " and a few more words"
    with pytest.raises(SessionError, match=rf"tokenizes to \d+ ids here, not the saved {sampled.n_prompt}:"):
        SF.replay(SF.SessionFile.from_dict(d), session=sampled)


def test_feed_checks_ids_and_cancels(smol_ran):
    s = smol_ran
    with pytest.raises(SessionError, match="outside the vocabulary"):
        s.feed([49152])
    n = s.seq_len
    with pytest.raises(Cancelled, match="stopped after 2 of 5"):
        calls = []
        s.feed(
            [504, 505, 506, 507, 508],
            progress=lambda d, t: calls.append(d),
            cancelled=lambda: len(calls) >= 2,
        )
    assert s.seq_len == n + 2 and s.ids[-2:] == [504, 505]


def test_nothing_to_save(smol_session):
    from attnscope.core.session import Session

    empty = Session(smol_session.backend)
    with pytest.raises(SessionError, match="nothing to save"):
        SF.SessionFile.from_session(empty)


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", r"is not a session file \(not JSON"),
        (json.dumps({"format": "other"}), "not an AttnScope session file"),
        (json.dumps({"format": "attnscope.session", "version": 99}), "newer than this AttnScope reads"),
        (json.dumps({"format": "attnscope.session", "version": 1, "prompt": "x"}), "lacks the field"),
    ],
)
def test_bad_files(tmp_path, content, message):
    p = tmp_path / "bad.attnscope"
    p.write_text(content)
    with pytest.raises(SF.SessionFileError, match=message):
        SF.load(p)


def _good() -> dict:
    return {
        "format": "attnscope.session",
        "version": 1,
        "model": {"ref": "default", "sha256": None},
        "backend": "torch",
        "dtype": "float32",
        "device": "cpu",
        "prompt": "hi",
        "chat_template": False,
        "sampling": {"temperature": 0.0},
        "n_prompt": 2,
        "token_ids": [1, 2, 3],
        "view": {"layer": 1},
    }


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("token_ids", [1, -2], "bad session file: token_ids[1] is -2, expected a non-negative integer"),
        ("n_prompt", 5, "bad session file: n_prompt is 5, expected an integer 1..3"),
        ("prompt", "  ", 'bad session file: prompt is "  ", expected a non-empty string'),
        (
            "sampling",
            {"temperature": -1},
            "bad session file: sampling.temperature is -1, expected a number >= 0",
        ),
        ("view", [1], "bad session file: view is [1], expected an object"),
    ],
)
def test_bad_fields(field, value, message):
    """More fields and values: tests/app/test_session_fields.py."""
    d = _good()
    d[field] = value
    with pytest.raises(SF.SessionFileError, match=f"^{re.escape(message)}$"):
        SF.SessionFile.from_dict(d)
    assert SF.SessionFile.from_dict(_good()).generated_ids == (3,)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such session file"):
        SF.load(tmp_path / "none.attnscope")
