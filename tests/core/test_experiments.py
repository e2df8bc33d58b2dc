"""Experiments: KL and perplexity by hand, each attention change against an independent reference
(transformers eager with a custom mask or scaling 1; attnscope.core.attention.fused.math_with_lse), the user's session
left intact, and SmolLM2's baseline against its own run and an independent perplexity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from attnscope.core.analysis.experiments import (
    Experiment,
    Overrides,
    default_experiments,
    kl_divergence,
    perplexity,
    run_experiments,
    run_sequence,
    separate_backend,
    token_logprobs,
)
from attnscope.core.attention.fused import math_with_lse
from attnscope.core.errors import Cancelled, SessionError, UnsupportedModelError
from tiny_models import save_tiny

PROMPT = "Hi. The cat sat, then the dog sat.\nIt ran"


# -- maths by hand ---------------------------------------------------------------------------------
def test_kl_by_hand():
    p = np.log([0.25, 0.75])  # logits whose softmax is (0.25, 0.75)
    q = np.zeros(2)  # uniform
    assert kl_divergence(p, q) == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-12)
    assert kl_divergence(p, q) == pytest.approx(0.130812, abs=1e-6)
    assert kl_divergence(p, p + 7.0) == pytest.approx(0.0, abs=1e-12)  # shift-invariant, KL(p‖p) = 0
    assert kl_divergence(q, p) == pytest.approx(
        0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75), abs=1e-12
    )
    both = kl_divergence(np.stack([p, q]), np.stack([q, q]))
    np.testing.assert_allclose(both, [0.130812, 0.0], atol=1e-6)
    assert kl_divergence(np.array([0.0, -np.inf]), np.array([-np.inf, 0.0])) == math.inf
    with pytest.raises(ValueError):
        kl_divergence(np.zeros(3), np.zeros(4))


def test_perplexity_by_hand():
    assert perplexity(np.zeros((3, 4)), [0, 1, 2, 3]) == pytest.approx(4.0)  # uniform over 4 tokens
    # p(ids[1]) = 0.5, p(ids[2]) = 0.25: ppl = exp((ln 2 + ln 4) / 2) = sqrt(8)
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]]))
    assert perplexity(logits, [2, 0, 2]) == pytest.approx(math.sqrt(8.0))
    np.testing.assert_allclose(token_logprobs(logits, [0, 1]), np.log([0.5, 0.5]))
    with pytest.raises(ValueError):
        perplexity(np.zeros((1, 4)), [1])
    with pytest.raises(ValueError):
        perplexity(np.zeros((1, 4)), [1, 2, 3])


def test_experiment_validation_and_cache_policies_by_hand():
    with pytest.raises(ValueError):
        Experiment("nope")
    with pytest.raises(ValueError):
        Experiment("evict_first", k=-1)
    with pytest.raises(ValueError):
        Experiment("sinks_window", window=0)
    T = np.arange(6)
    ev = Experiment("evict_first", k=2).allowed(T, T)
    expect = np.tril(np.ones((6, 6), bool))
    expect[2:, :2] = False  # rows from position 2 on lost keys 0 and 1
    np.testing.assert_array_equal(ev, expect)
    sw = Experiment("sinks_window", k=1, window=2).allowed(T, T)
    expect = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 0, 1, 1, 0, 0],
            [1, 0, 0, 1, 1, 0],
            [1, 0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(sw, expect)
    # decode rows: q at position 5 over 6 cached keys
    np.testing.assert_array_equal(Experiment("sinks_window", k=1, window=2).allowed([5], T), expect[5:])


# -- the hook against attnscope.core.attention.fused --------------------------------------------------------------
def _qkv(L, S, H=4, Hkv=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, H, L, D, generator=g),
        torch.randn(1, Hkv, S, D, generator=g),
        torch.randn(1, Hkv, S, D, generator=g),
    )


class _Mod:
    layer_idx = 0


def test_hook_no_scale_equals_math_with_scale_one():
    q, k, v = _qkv(5, 5)
    out, lse = Overrides(Experiment("no_scale")).attend(_Mod(), q, k, v, 8**-0.5, None)
    ref_out, ref_lse = math_with_lse(q, k, v, scale=1.0, causal=True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    scaled, _ = math_with_lse(q, k, v, scale=8**-0.5, causal=True)
    assert (out - scaled).abs().max() > 1e-2  # and it is a change


def test_hook_decode_top_left_sees_only_key0():
    q, k, v = _qkv(1, 7)
    out, lse = Overrides(Experiment("decode_top_left")).attend(_Mod(), q, k, v, 8**-0.5, None)
    # one key: softmax weight 1 on key 0, so each head outputs its KV head's v_0
    torch.testing.assert_close(out[0, :, 0], v[0, [0, 0, 1, 1], 0], atol=1e-6, rtol=1e-6)
    # prefill (L == S): top-left == bottom-right, the normal causal mask
    q, k, v = _qkv(6, 6)
    out, _ = Overrides(Experiment("decode_top_left")).attend(_Mod(), q, k, v, 8**-0.5, None)
    torch.testing.assert_close(
        out, math_with_lse(q, k, v, scale=8**-0.5, causal=True)[0], atol=1e-5, rtol=1e-5
    )


def test_hook_no_causal_prefill_and_eviction():
    q, k, v = _qkv(6, 6)
    ov = Overrides(Experiment("no_causal_prefill"))
    torch.testing.assert_close(
        ov.attend(_Mod(), q, k, v, 0.3, None)[0],
        math_with_lse(q, k, v, scale=0.3, causal=False)[0],
        atol=1e-5,
        rtol=1e-5,
    )
    q1 = q[:, :, -1:]
    torch.testing.assert_close(
        ov.attend(_Mod(), q1, k, v, 0.3, None)[0],
        math_with_lse(q1, k, v, scale=0.3, causal=True)[0],
        atol=1e-5,
        rtol=1e-5,
    )
    ex = Experiment("sinks_window", k=1, window=2)
    mask = torch.from_numpy(ex.allowed(np.arange(6), np.arange(6)))
    torch.testing.assert_close(
        Overrides(ex).attend(_Mod(), q, k, v, 0.3, None)[0],
        math_with_lse(q, k, v, scale=0.3, causal=False, mask=mask)[0],
        atol=1e-5,
        rtol=1e-5,
    )


# -- whole runs on a tiny llama against transformers eager ----------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    eager = save_tiny("llama", folder)
    from attnscope.core.session import Session

    s = Session.load(str(folder))
    return s, eager


def _eager_logits(eager, ids, allowed: np.ndarray, scaling: float | None = None) -> np.ndarray:
    """transformers eager over the whole sequence with an additive 4-D mask (and optionally scaling)."""
    mask = torch.zeros(1, 1, len(ids), len(ids)).masked_fill(~torch.from_numpy(allowed), float("-inf"))
    saved = [(m, m.scaling) for m in eager.modules() if hasattr(m, "scaling")]
    try:
        if scaling is not None:
            for m, _ in saved:
                m.scaling = scaling
        with torch.no_grad():
            return eager(torch.tensor([ids]), attention_mask=mask).logits[0].numpy()
    finally:
        for m, sc in saved:
            m.scaling = sc


def _reference_allowed(ex: Experiment, T: int, p: int) -> np.ndarray:
    """The mask each row effectively ran with: prefill rows < p in one forward, the rest one at a time."""
    causal = np.tril(np.ones((T, T), bool))
    if ex.kind in ("evict_first", "sinks_window"):
        return ex.allowed(np.arange(T), np.arange(T))
    if ex.kind == "no_causal_prefill":
        a = causal.copy()
        a[:p, :p] = True
        return a
    if ex.kind == "decode_top_left":
        a = causal.copy()
        a[p:] = False
        a[p:, 0] = True  # a decode row (1 query, S keys) sees key 0 only
        return a
    return causal


@pytest.mark.parametrize(
    "ex",
    [
        Experiment("evict_first", k=3),
        Experiment("sinks_window", k=2, window=5),
        Experiment("sinks_window", k=0, window=4),
        Experiment("no_causal_prefill"),
        Experiment("decode_top_left", decode_from=10),
        Experiment("no_scale"),
        Experiment("no_causal_prefill", decode_from=4),
    ],
    ids=lambda e: f"{e.kind}-{e.params}-{e.decode_from}",
)
def test_run_equals_eager_with_that_mask(tiny, ex):
    s, eager = tiny
    s.prefill(PROMPT, chat_template=False)
    s.step(2)
    ids, T = s.ids, s.seq_len
    p = ex.decode_from or min(s.n_prompt, T - 1)
    run = run_sequence(s, ids, p, Overrides(ex))
    ref = _eager_logits(eager, ids, _reference_allowed(ex, T, p), 1.0 if ex.kind == "no_scale" else None)
    np.testing.assert_allclose(run.last, ref[-1], atol=2e-4)
    np.testing.assert_allclose(run.target_logprob, token_logprobs(ref[:-1], ids[1:]), atol=2e-4)
    np.testing.assert_array_equal(run.argmax, ref.argmax(-1))
    base = run_sequence(s, ids, p, None)
    assert np.abs(base.last - run.last).max() > 1e-3  # each experiment does change something here


def test_results_and_session_intact(tiny):
    s, eager = tiny
    s.prefill(PROMPT, chat_template=False)
    s.step(2)
    ids, logits, w = s.ids, s.logits.copy(), s.weights(1, 2).copy()
    res = run_experiments(
        s,
        default_experiments(s.seq_len)
        + [Experiment("evict_first", k=0), Experiment("sinks_window", k=1, window=100)],
    )
    assert s.ids == ids and np.array_equal(s.logits, logits) and np.array_equal(s.weights(1, 2), w)
    assert all(
        m._attnscope_trace is s.trace for m in s.backend.model.modules() if hasattr(m, "_attnscope_trace")
    )
    assert getattr(s.trace, "overrides", None) is None
    by = {(r.experiment.kind, r.experiment.params): r for r in res}
    # no-op settings are exactly the baseline
    for key in (("evict_first", "k=0"), ("sinks_window", "sinks=1, window=100")):
        assert by[key].kl_next == pytest.approx(0.0, abs=1e-9)
        assert not by[key].top1_changed and by[key].ppl_exp == pytest.approx(by[key].ppl_base, rel=1e-9)
    # the baseline is the session's own run: same next-token distribution and an independent perplexity
    base_top = int(np.argmax(logits))
    r0 = res[0]
    assert r0.top1_base[0] == base_top
    with torch.no_grad():
        ref = eager(torch.tensor([ids])).logits[0].numpy()
    assert r0.ppl_base == pytest.approx(perplexity(ref[: s.n_prompt - 1], ids[: s.n_prompt]), rel=1e-4)
    for r in res:
        assert r.kl_next >= 0 and 0 <= r.top1_agreement <= 1 and r.nll_base.shape == (s.seq_len - 1,)
        assert r.to_json()["experiment"] == r.experiment.kind
    s.step(1)
    assert s.seq_len == len(ids) + 1


def test_cancel_restores_the_model(tiny):
    s, _ = tiny
    s.prefill(PROMPT, chat_template=False)
    with pytest.raises(Cancelled):
        run_experiments(s, [Experiment("no_scale")], cancelled=lambda: True)
    assert all(
        m._attnscope_trace is s.trace for m in s.backend.model.modules() if hasattr(m, "_attnscope_trace")
    )
    with separate_backend(s) as b:  # and a separate run still works
        assert b.trace is not s.trace and b.seq_len == 0


def test_bad_sessions(tiny):
    s, _ = tiny
    s.prefill("a", chat_template=False)  # one token
    with pytest.raises(SessionError):
        run_experiments(s, [Experiment("no_scale")])
    s.prefill(PROMPT, chat_template=False)
    with pytest.raises(ValueError, match="decode_from"):
        run_experiments(s, [Experiment("no_scale", decode_from=10_000)])

    class FakeBackend:
        name = "mlx"

    class Fake:
        backend = FakeBackend()

        def _require_run(self):
            pass

    with pytest.raises(UnsupportedModelError):
        run_experiments(Fake(), [Experiment("no_scale")])


@pytest.mark.slow
def test_smollm2_experiments(smol_session, smol_folder):
    """The baseline equals SmolLM2's own run; perplexity vs transformers SDPA; what each change does."""
    from transformers import AutoModelForCausalLM

    s = smol_session
    s.prefill("The quick brown fox jumps over the lazy dog. The quick brown fox", chat_template=False)
    s.step(2)
    res = run_experiments(s, default_experiments(s.seq_len))
    by = {r.experiment.kind: r for r in res}
    base = by["no_scale"]
    ref_model = AutoModelForCausalLM.from_pretrained(
        smol_folder, attn_implementation="sdpa", dtype=torch.float32
    )
    with torch.no_grad():
        ref = ref_model(torch.tensor([s.ids])).logits[0].numpy()
    assert base.ppl_base == pytest.approx(perplexity(ref[: s.n_prompt - 1], s.ids[: s.n_prompt]), rel=1e-3)
    assert base.top1_base[0] == int(np.argmax(s.logits))
    # measured: the repeated "quick brown fox" makes the prompt easy; reading the future makes it trivial
    assert by["no_causal_prefill"].ppl_exp < base.ppl_base / 3
    # the decode bug: the decode row sees token 0 only, the next token changes
    assert by["decode_top_left"].kl_next > 1.0 and by["decode_top_left"].top1_changed
    assert by["decode_top_left"].ppl_exp == pytest.approx(base.ppl_base, rel=1e-4)  # prefill rows untouched
    assert by["no_scale"].kl_next > 0.5 and by["no_scale"].ppl_exp > base.ppl_base
    assert by["evict_first"].ppl_exp > base.ppl_base  # losing the sink hurts


def test_default_params_fit_the_sequence_and_default_experiments_take_given_ones():
    from attnscope.core.analysis.experiments import default_params, param_fits

    assert default_params(14) == (3, 7) and default_params(32) == (4, 16) and default_params(2) == (1, 1)
    assert all(param_fits(v, n) for n in range(2, 40) for v in default_params(n))
    assert param_fits(13, 14) and not param_fits(14, 14)
    one_k = {e.kind: e for e in default_experiments(14)}
    assert one_k["evict_first"].k == one_k["sinks_window"].k == 3 and one_k["sinks_window"].window == 7
    given = {e.kind: e for e in default_experiments(14, k=2, window=5, decode_from=9)}
    assert (given["evict_first"].k, given["sinks_window"].k, given["sinks_window"].window) == (2, 2, 5)
    assert {e.decode_from for e in given.values()} == {9}
