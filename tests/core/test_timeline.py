"""Decode timeline: the map at step t is the crop of the map now (exact, causal), next tokens per step."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.analysis import aggregate, timeline
from attnscope.core.sampling import Sampling, choose, filtered_probs, softmax, step_rng
from tiny_models import eager_reference, save_tiny

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random llama (2 layers, 4 query heads / 2 KV heads) as a Session, plus its eager twin."""
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("tiny_llama")
    model = save_tiny("llama", folder)
    return Session.load(str(folder)), model


def test_visible_len_bounds():
    assert timeline.visible_len(10, 3, 0) == 10
    assert timeline.visible_len(10, 3, 3) == 13
    assert timeline.visible_len(10, 3, None) == 13
    with pytest.raises(IndexError):
        timeline.visible_len(10, 3, 4)
    with pytest.raises(IndexError):
        timeline.visible_len(10, 3, -1)


@pytest.mark.slow  # three SmolLM2 prefills; the fast lane crops against eager on every step below (tiny)
def test_cropped_map_equals_fresh_run_smollm2(smol_session):
    s = smol_session
    s.prefill(PROMPT, chat_template=False)
    s.step(4)
    n0 = s.n_prompt
    picks = [(0, 0), (3, 4), (17, 8), (29, 2)]
    cropped = {t: {lh: aggregate.map_at(s, *lh, n=n0 + t) for lh in picks} for t in (0, 2)}
    ids_then = s.ids
    for t in (0, 2):
        s.prefill(PROMPT, chat_template=False)
        if t:
            s.step(t)
        assert s.ids == ids_then[: n0 + t]
        for lh in picks:
            fresh = s.weights(*lh)
            assert fresh.shape == (n0 + t, n0 + t)
            np.testing.assert_allclose(cropped[t][lh], fresh, atol=1e-5)


def test_cropped_map_equals_eager_at_every_step(tiny):
    """Independent reference: transformers eager on the sequence as it was at each step."""
    s, model = tiny
    s.prefill("abc defg", chat_template=False)
    s.step(3)
    ids = s.ids
    for t in range(4):
        n = s.n_prompt + t
        _, att = eager_reference(model, ids[:n])
        for layer in range(2):
            for head in range(4):
                np.testing.assert_allclose(aggregate.map_at(s, layer, head, n=n), att[layer][head], atol=2e-6)


def test_next_tokens_per_step(tiny):
    s, model = tiny
    s.set_sampling(Sampling())
    s.prefill("hello world", chat_template=False)
    s.step(2)
    ids = s.ids
    for t in range(3):
        table = timeline.next_tokens(s, t, k=10)
        logits, _ = eager_reference(model, ids[: s.n_prompt + t])
        p = softmax(logits[-1])
        order = np.argsort(-p, kind="stable")[:10]
        assert [r.id for r in table.rows] == [int(i) for i in order]
        np.testing.assert_allclose([r.p_model for r in table.rows], p[order], rtol=1e-4)
        assert table.position == s.n_prompt + t
        assert table.chosen_id == (ids[s.n_prompt + t] if t < 2 else None)
        # greedy: the generated token is the argmax, and the sampler puts all its mass there
        if t < 2:
            assert table.chosen_id == table.rows[0].id
        assert table.rows[0].p_sampled == 1.0 and all(r.p_sampled == 0.0 for r in table.rows[1:])
        assert table.entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-4)


def test_next_tokens_sampling_filters(tiny):
    s, _ = tiny
    s.prefill("hello world", chat_template=False)
    logits = s.logits_at(0).astype(np.float64)
    sampling = Sampling(temperature=0.7, top_k=3, seed=1)
    table = timeline.next_tokens(s, 0, k=10, sampling=sampling)
    # by hand: softmax(logits / T) restricted to the 3 most likely tokens, renormalised
    p = softmax(logits / 0.7)
    top3 = np.argsort(-p)[:3]
    expect = p[top3] / p[top3].sum()
    np.testing.assert_allclose([r.p_sampled for r in table.rows[:3]], expect, rtol=1e-6)
    assert all(r.p_sampled == 0.0 for r in table.rows[3:])
    with pytest.raises(IndexError):
        timeline.next_tokens(s, 1)
    with pytest.raises(ValueError):
        timeline.next_tokens(s, 0, k=0)


def test_set_sampling_reseeds(tiny):
    s, _ = tiny
    runs = []
    for _ in range(2):
        s.set_sampling(Sampling())
        s.prefill("hello world", chat_template=False)
        s.set_sampling(Sampling(temperature=1.5, seed=7))
        s.step(6)
        runs.append(s.ids)
    assert runs[0] == runs[1]  # same seed, same tokens
    s.set_sampling(Sampling())
    s.prefill("hello world", chat_template=False)
    s.set_sampling(Sampling(temperature=1.5, seed=8))
    s.step(6)
    assert s.ids != runs[0]
    with pytest.raises(ValueError):
        s.set_sampling("greedy")


def test_sampled_token_depends_on_seed_and_position_only(tiny):
    """Counter-based draws: stepping back and forward again, or changing settings in between and
    back, gives the same sampled tokens; the draw at a position does not depend on earlier draws."""
    s, _ = tiny
    hot = Sampling(temperature=1.5, seed=11)
    s.set_sampling(hot)
    s.prefill("hello world", chat_template=False)
    s.step(8)
    ids = s.ids
    assert len(set(ids[-8:])) > 1  # really sampled
    s.step_back(5)
    s.set_sampling(Sampling(temperature=1.5, seed=99))  # another seed for a while...
    s.set_sampling(hot)  # ...and back: nothing was consumed
    s.step(5)
    assert s.ids == ids
    # the same draw by hand: filtered probabilities, one draw from step_rng(seed, position)
    s.step_back(1)
    pos = len(s.ids)
    p = filtered_probs(s.logits_at(), hot)
    assert (
        choose(s.logits_at(), hot, position=pos) == int(step_rng(11, pos).choice(p.shape[0], p=p)) == ids[pos]
    )
