"""The logit lens (:mod:`attnscope.core.analysis.logit_lens`) against transformers' own forward.

The reference is a plain eager transformers model on the whole prompt with ``output_hidden_states``:
layer ``i``'s residual is ``hidden_states[i + 1]`` (the last one is the model's logits instead: transformers
returns it after the final norm), read through the final norm and the unembedding in float64 with a full
softmax and a full sort of the vocabulary.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.errors import BadArgument, OutOfRange
from tiny_models import save_tiny

IDS = [5, 9, 14, 20, 9, 14, 33, 41, 7, 14, 20, 9]  # 12 tokens, with repeats
POS = [9, 2, 5, 11, 3]  # not contiguous, not sorted


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _load(family, tmp_path):
    from attnscope.core.session import Session

    ref = save_tiny(family, tmp_path / family)
    s = Session.load(str(tmp_path / family))
    s.prefill(IDS)
    return s, ref


def _reference(ref, pos, k):
    """Naive lens from the eager model: ``(top_ids, top_probs, final_ids, final_rank, final_prob)``."""
    with torch.no_grad():
        out = ref(torch.tensor([IDS]), output_hidden_states=True)
        hs = out.hidden_states
        cfg = ref.config.get_text_config()
        cap = getattr(cfg, "final_logit_softcapping", None)
        dec = getattr(ref, "model", None) or ref.transformer
        norm = getattr(dec, "norm", None) or dec.ln_f
        logits = []
        for i in range(len(hs) - 2):
            z = ref.get_output_embeddings()(norm(hs[i + 1][:, pos]))[0].double()
            logits.append(torch.tanh(z / cap) * cap if cap else z)
        logits.append(out.logits[0, pos].double())
    z = torch.stack(logits).numpy()
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    order = np.argsort(-z, axis=-1, kind="stable")[..., :k]
    final = order[-1, :, 0]
    zf = np.take_along_axis(z, np.broadcast_to(final[None, :, None], (*z.shape[:2], 1)), -1)
    rank = (z > zf).sum(-1)
    fprob = np.take_along_axis(p, np.broadcast_to(final[None, :, None], (*z.shape[:2], 1)), -1)[..., 0]
    return order, np.take_along_axis(p, order, -1), final, rank, fprob


@pytest.mark.parametrize(
    "family", ["llama", "qwen3", "mistral", pytest.param("gemma3_text", marks=pytest.mark.slow)]
)
def test_residuals_from_the_cache_are_the_forward(family, tmp_path):
    """qwen3: QK-norm; mistral: a 4-key window, far shorter than the prompt; gemma3: local/global layers,
    post-norms and a scaled embedding. The |P| positions run against the KV cache give transformers'
    hidden states and the scratch forward's, and leave the cache as it was."""
    from attnscope.core.analysis import logit_lens as LL
    from attnscope.core.analysis.head_effects import _parts

    s, ref = _load(family, tmp_path)
    before = [(cl.keys.clone(), cl.values.clone()) for cl in s.backend._cache_layers()]
    parts = _parts(s)
    got = LL._cached_residuals(s, parts, POS)
    assert got is not None  # the key check passed: these families take the cache path
    with torch.no_grad():
        hs = ref(torch.tensor([IDS]), output_hidden_states=True).hidden_states
    for i, h in enumerate(got[:-1]):
        want = hs[i + 1][0, POS]
        np.testing.assert_allclose(h.numpy(), want.numpy(), atol=1e-5 * (1 + float(want.abs().max())))
    again = LL._forward_residuals(s, parts, POS)
    for a, b in zip(got, again, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5 * (1 + float(b.abs().max())))
    assert s.seq_len == len(IDS)
    for (k, v), cl in zip(before, s.backend._cache_layers(), strict=True):
        assert torch.equal(k, cl.keys) and torch.equal(v, cl.values)


@pytest.mark.parametrize(
    "family",
    [
        "llama",
        "mistral",
        *[pytest.param(f, marks=pytest.mark.slow) for f in ("qwen3", "gemma3_text", "gpt2")],
    ],
)
def test_lens_equals_a_full_softmax(family, tmp_path):
    """Top-k, probabilities, the final token and its rank at every layer equal a float64 full softmax
    and sort of the eager model's hidden states; the last layer is the model's own logits."""
    from attnscope.core.analysis.logit_lens import logit_lens

    s, ref = _load(family, tmp_path)
    lens = logit_lens(s, positions=[9, 2, -7, 11, 3], k=4)
    top, probs, final, rank, fprob = _reference(ref, POS, 4)
    assert lens.positions.tolist() == POS
    assert lens.top_ids.shape == (s.info.n_layers, len(POS), 4)
    np.testing.assert_array_equal(lens.top_ids, top)
    np.testing.assert_allclose(lens.top_probs, probs, atol=1e-5)
    np.testing.assert_array_equal(lens.final_ids, final)
    np.testing.assert_array_equal(lens.final_rank, rank)
    np.testing.assert_allclose(lens.final_prob, fprob, atol=1e-5)
    assert lens.final_rank[-1].tolist() == [0] * len(POS)
    assert lens.top_ids.dtype == np.int64 and lens.final_rank.dtype == np.int64
    j = lens.to_json()
    assert set(j) == {"positions", "top_ids", "top_probs", "final_ids", "final_rank", "final_prob"}


def test_fallback_forward_gives_the_same_lens(tmp_path, monkeypatch):
    """Where the re-derived keys do not match the cache (here: a tolerance no float meets) the residuals
    come from a forward of the prefix instead, with the same numbers, also when that forward runs in
    several chunks (here of 5 tokens) and the positions lie in different ones."""
    import attnscope.core.backends.torch_backend as tb
    from attnscope.core.analysis import logit_lens as LL

    s, _ = _load("mistral", tmp_path)
    fast = LL.logit_lens(s, POS, k=3)
    called = []
    real = LL._forward_residuals
    monkeypatch.setattr(LL, "KEY_TOL", {"float32": -1.0})
    monkeypatch.setattr(tb, "PREFILL_CHUNK", 5)
    monkeypatch.setattr(LL, "_forward_residuals", lambda *a: called.append(1) or real(*a))
    slow = LL.logit_lens(s, POS, k=3)
    assert called
    np.testing.assert_array_equal(fast.top_ids, slow.top_ids)
    np.testing.assert_array_equal(fast.final_rank, slow.final_rank)
    np.testing.assert_allclose(fast.top_probs, slow.top_probs, atol=1e-6)
    np.testing.assert_allclose(fast.final_prob, slow.final_prob, atol=1e-6)


@pytest.mark.parametrize(("block", "rows"), [(7, 2048), (64, 2048), (100_000, 2048), (64, 4), (7, 1)])
@pytest.mark.parametrize("cap", [None, 3.0])
def test_project_in_blocks_equals_the_whole_vocabulary(block, rows, cap):
    """Blocks smaller than k, several blocks, one block, and rows in several tiles (of 4: 4, 4, 1; of 1);
    a bias, a soft-cap, a head that is not a plain matrix; the final token's rank counts strictly larger
    logits only."""
    from attnscope.core.analysis.logit_lens import project

    g = torch.Generator().manual_seed(0)
    V, d, R, k = 300, 16, 9, 10
    head = torch.nn.Linear(d, V, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, d, generator=g))
        head.bias.copy_(torch.randn(V, generator=g))
    x = torch.randn(R, d, generator=g)
    fid = torch.randint(0, V, (R,), generator=g)
    with torch.no_grad():
        z = head(x).double()
    if cap:
        z = torch.tanh(z / cap) * cap
    lse = torch.logsumexp(z, -1)
    want_v, want_i = z.topk(k, dim=-1)
    zf = z.gather(1, fid[:, None])[:, 0]
    rank = (z > zf[:, None]).sum(-1)

    class Wrapped(torch.nn.Module):  # not a plain matrix: called on row groups
        def forward(self, h):
            return head(h)

    for h in (head, Wrapped()):
        with torch.inference_mode():
            got = project(x, h, k, final_ids=fid, softcap=cap, block=block, rows=rows)
        np.testing.assert_array_equal(got.top_ids.numpy(), want_i.numpy())
        np.testing.assert_allclose(got.top_logits.numpy(), want_v.numpy(), atol=1e-4)
        np.testing.assert_allclose(got.lse.numpy(), lse.numpy(), atol=1e-4)
        np.testing.assert_allclose(got.final_logit.numpy(), zf.numpy(), atol=1e-4)
        np.testing.assert_array_equal(got.rank.numpy(), rank.numpy())


def test_project_ranks_ties_and_top_k_across_blocks():
    """Logits equal to the final token's are not counted above it (nor is the token itself), and a later
    block's logit equal to the k-th best so far does not displace it: the lower id stays, as in a stable
    sort of the whole vocabulary."""
    from attnscope.core.analysis.logit_lens import project

    V, d = 12, 2
    head = torch.nn.Linear(d, V, bias=False)
    w = torch.zeros(V, d)
    w[:, 0] = torch.tensor([3.0, 1, 5, 2, 5, 0, 3, 1, 5, 3, 4, 2])  # logit = w[:, 0] for x = (1, 0)
    with torch.no_grad():
        head.weight.copy_(w)
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    z = x @ w.T
    for block in (1, 3, 5, 100):
        with torch.inference_mode():
            got = project(x, head, 3, final_ids=torch.tensor([0, 10]), block=block)
        assert got.top_ids.tolist() == [[2, 4, 8], [2, 4, 8]]
        assert got.rank.tolist() == [4, 3]  # above 3: 5, 5, 5, 4; above 4: 5, 5, 5 (ties not counted)
        np.testing.assert_allclose(got.lse.numpy(), torch.logsumexp(z.double(), -1).numpy(), rtol=1e-7)


def test_bad_input_is_one_line(tmp_path):
    from attnscope.core.analysis.logit_lens import logit_lens

    s, _ = _load("llama", tmp_path)
    with pytest.raises(OutOfRange, match="position 40 is outside the sequence 0..11"):
        logit_lens(s, positions=[40])
    with pytest.raises(OutOfRange, match="position -1 is outside"):
        logit_lens(s, positions=[-13])
    with pytest.raises(BadArgument, match="at least one position"):
        logit_lens(s, positions=[])
    for k in (0, -2, 1.5):
        with pytest.raises(BadArgument, match="k must be a whole number >= 1"):
            logit_lens(s, positions=[3], k=k)  # type: ignore[arg-type]
    big = logit_lens(s, positions=[3], k=10_000)  # more than the vocabulary: all of it, ranked
    assert big.top_ids.shape == (s.info.n_layers, 1, s.info.vocab_size)
    np.testing.assert_allclose(big.top_probs.sum(-1), 1.0, atol=1e-5)


def test_lens_bench_rows(tmp_path):
    """``attnscope bench --heads --heads-rows lens`` on a tiny model: the lens's seconds (the fastest of the
    repeats), its floor (the unembedding matmul alone), its peak over the prefill's and its two targets,
    and the table's lens line; no other sweep runs."""
    from attnscope.core.bench.heads import format_heads_table, run_heads_bench

    save_tiny("llama", tmp_path / "m")
    res = run_heads_bench(str(tmp_path / "m"), seq_len=24, repeats=1, only=["lens"])
    assert res["lens_positions"] == 24 and res["rows"]["lens_s"] > 0 and res["rows"]["lens_matmul_s"] > 0
    assert "lens_error" not in res and res["ratios"]["peak_lens_over_prefill_peak"] > 0.5
    assert {"lens_s", "peak_over_prefill_peak"} <= set(res["targets"])
    assert "readout_s" not in res["rows"] and "attribution_one_s" not in res["rows"]
    assert "unembedding matmul alone" in format_heads_table(res)


@pytest.mark.slow
def test_hybrid_model_takes_the_forward(tmp_path):
    """qwen3_next's linear-attention layers keep recurrent states, not a K/V cache of every position: the
    residuals come from the prefix's forward, and the lens still ends at the model's own logits."""
    from attnscope.core.analysis import logit_lens as LL
    from attnscope.core.analysis.head_effects import _parts

    s, ref = _load("qwen3_next", tmp_path)
    assert LL._cached_residuals(s, _parts(s), POS) is None
    lens = LL.logit_lens(s, POS, k=3)
    with torch.no_grad():
        logits = ref(torch.tensor([IDS])).logits[0, POS].double().numpy()
    np.testing.assert_array_equal(lens.top_ids[-1], np.argsort(-logits, axis=-1, kind="stable")[:, :3])
    assert lens.final_rank[-1].tolist() == [0] * len(POS)


def _float64_lens(session, positions, k):
    """The lens's own residuals through the final norm and the whole unembedding in one float32 product,
    then a float64 log-softmax and a stable sort of the whole vocabulary: ``(top_ids, top_probs,
    final_ids, final_rank, final_prob)``."""
    from attnscope.core.analysis import logit_lens as LL
    from attnscope.core.analysis.head_effects import _parts

    parts = _parts(session)
    resid = LL.residuals(session, positions, parts)
    with torch.inference_mode():
        z = torch.stack([parts.lm_head(LL._normed(parts, h)).float() for h in resid])  # (L, P, vocab)
        cap = parts.final_softcap
        if cap:
            z = torch.tanh(z / cap) * cap
        logp = torch.log_softmax(z.double(), -1).numpy()
    z = z.numpy()
    order = np.argsort(-z, axis=-1, kind="stable")
    final = order[-1, :, 0]
    idx = np.broadcast_to(final[None, :, None], (*z.shape[:2], 1))
    rank = (z > np.take_along_axis(z, idx, -1)).sum(-1)
    top = order[..., :k]
    return (
        top,
        np.exp(np.take_along_axis(logp, top, -1)),
        final,
        rank,
        np.exp(np.take_along_axis(logp, idx, -1)[..., 0]),
    )


def _assert_lens_is(lens, want):
    top, probs, final, rank, fprob = want
    np.testing.assert_array_equal(lens.top_ids, top)
    np.testing.assert_array_equal(lens.final_ids, final)
    np.testing.assert_array_equal(lens.final_rank, rank)
    np.testing.assert_allclose(lens.top_probs, probs, rtol=0, atol=1e-6)
    np.testing.assert_allclose(lens.final_prob, fprob, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_lens_equals_a_float64_softmax_of_its_float32_logits(family, tmp_path, monkeypatch):
    """The tiled projection (running top-k, log-sum-exp in powers of 2, ranks counted per tile) against
    one float32 product of the whole vocabulary and a float64 log-softmax: the same top tokens, final
    tokens and ranks, probabilities within 1e-6; also in tiles of 3 rows x 7 vocabulary rows."""
    from attnscope.core.analysis import logit_lens as LL

    s, _ = _load(family, tmp_path)
    want = _float64_lens(s, POS, 4)
    _assert_lens_is(LL.logit_lens(s, POS, k=4), want)
    monkeypatch.setattr(LL.project, "__defaults__", (None, None, 7, 3))  # final_ids, softcap, block, rows
    _assert_lens_is(LL.logit_lens(s, POS, k=4), want)


@pytest.mark.slow
def test_default_model_lens_equals_a_float64_softmax():
    """SmolLM2-135M (the default model, vocabulary 49,152 in 12 tiles of 4,096), the last 24 positions of
    a 300-token prompt at all 30 layers: top-5, final tokens and ranks equal a float64 log-softmax of
    the float32 logits, probabilities within 1e-6."""
    from attnscope.core.analysis.logit_lens import logit_lens
    from attnscope.core.bench.views import long_text
    from attnscope.core.session import Session

    s = Session.load(None)
    s.prefill(long_text(s, 300), chat_template=False)
    pos = list(range(s.seq_len - 24, s.seq_len))
    want = _float64_lens(s, pos, 5)
    lens = logit_lens(s, pos, k=5)
    _assert_lens_is(lens, want)
    assert lens.final_rank.max() > 100  # early layers rank the final token far down: the counts are tested


def test_rank_is_counted_again_where_the_final_logit_differs(monkeypatch):
    """Where the final token's logit found beforehand is not the float its tile holds (here: moved on
    purpose), the tile notices and the row's rank is counted again against the tile's float."""
    from attnscope.core.analysis import logit_lens as LL

    g = torch.Generator().manual_seed(3)
    V, d, R = 50, 8, 6
    head = torch.nn.Linear(d, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, d, generator=g))
    x = torch.randn(R, d, generator=g)
    fid = torch.tensor([3, 3, 40, 17, 17, 49])
    z = (x @ head.weight.detach().T).double()
    want = (z > z.gather(1, fid[:, None])).sum(1)
    real = LL._cap

    def moved(t, cap, inplace=False):  # the final tokens' logits (4 distinct ids) made 0.5 too high
        return real(t, cap, inplace) + 0.5 if t.shape[1] == 4 else real(t, cap, inplace)

    monkeypatch.setattr(LL, "_cap", moved)
    with torch.inference_mode():
        got = LL.project(x, head, 3, final_ids=fid, block=16, rows=4)
    np.testing.assert_array_equal(got.rank.numpy(), want.numpy())
    np.testing.assert_allclose(got.final_logit.numpy(), z.gather(1, fid[:, None])[:, 0].numpy(), atol=1e-5)
