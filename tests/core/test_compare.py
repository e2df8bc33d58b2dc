"""Compare two runs (attnscope.core.analysis.compare_runs) and the value-weighted scale (attnscope.core.analysis.value_weighted).

A tiny llama and a copy with one head's q_proj rows perturbed: that head ranks first, and every
head the perturbation cannot reach (same layer, earlier layers) has distance 0; the value norms
against a direct ‖α_ij v_j W_O^h‖ from the eager model's own tensors; the CLI's JSON.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from attnscope.core.analysis.compare_runs import align, compare_sessions, logits_divergence
from attnscope.core.analysis.value_weighted import (
    apply_norms,
    value_norms,
    value_weighted,
    value_weighted_sink_scores,
)
from attnscope.core.errors import Cancelled, SessionError
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog"


def _load(folder, backend="torch"):
    from attnscope.core.session import Session

    return Session.load(str(folder), backend=backend, device="cpu" if backend == "torch" else None)


def _perturbed_copy(src, dst, layer: int, head: int, seed: int = 1):
    """Copy the tiny model in ``src`` to ``dst`` with head ``head``'s q_proj rows in ``layer`` perturbed."""
    from tiny_models import tiny_tokenizer
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(src)
    D = m.config.hidden_size // m.config.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = m.model.layers[layer].self_attn.q_proj.weight
        w[head * D : (head + 1) * D] += 0.5 * torch.randn(w[head * D : (head + 1) * D].shape, generator=g)
    dst.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(dst)
    tiny_tokenizer().save_pretrained(dst)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("base")
    save_tiny("llama", base)  # 2 layers, 4 query heads, 2 KV heads, head_dim 16
    last = tmp_path_factory.mktemp("last")
    _perturbed_copy(base, last, layer=1, head=2)
    first = tmp_path_factory.mktemp("first")
    _perturbed_copy(base, first, layer=0, head=1)
    return {"base": base, "last": last, "first": first}


def _run(folder, prompt=PROMPT):
    s = _load(folder)
    s.prefill(prompt, chat_template=False, all_logits=True)
    return s


def test_perturbed_head_in_last_layer_ranks_first_and_nothing_else_moves(tiny):
    sa, sb = _run(tiny["base"]), _run(tiny["last"])
    res = compare_sessions(sa, sb)
    ranked = res.ranked()
    assert (ranked[0].layer, ranked[0].head) == (1, 2)
    assert ranked[0].js_mean > 0.05
    assert ranked[0].js_max >= ranked[0].js_mean
    others = [d for d in ranked[1:]]
    assert len(others) == 2 * 4 - 1
    assert max(d.js_mean for d in others) <= 1e-6  # float32 rounding at most
    assert max(d.js_max for d in others) <= 1e-6
    assert res.alignment.kind == "token" and res.alignment.first_difference is None
    # the logits see the change (the last layer feeds the head), top-1 per position reported
    assert res.kl.shape == (len(sa.ids),) and np.all(res.kl >= 0) and res.kl.max() > 0
    js = res.to_json()
    assert [h["js_mean"] for h in js["heads"]] == sorted((h["js_mean"] for h in js["heads"]), reverse=True)
    assert js["heads"][0] == {**js["heads"][0], "layer": 1, "head": 2}


def test_perturbed_head_in_first_layer_moves_only_it_and_later_layers(tiny):
    res = compare_sessions(_run(tiny["base"]), _run(tiny["first"]))
    assert res.js_mean[0, 1] == res.js_mean.max()
    assert np.all(np.delete(res.js_mean[0], 1) <= 1e-6)  # same layer, other heads: untouched
    assert np.all(res.js_mean[1] > 1e-4)  # later layers see changed inputs


def test_same_run_is_zero_and_js_matches_scipy_by_hand(tiny):
    sa, sb = _run(tiny["base"]), _run(tiny["last"])
    same = compare_sessions(sa, _run(tiny["base"]))
    assert same.js_mean.max() <= 1e-6 and np.all(same.top1_agree) and same.kl.max() <= 1e-9

    # head (1, 2) by hand: mean over rows 1..n-1 of base-2 JS
    def jensenshannon(p, q, base=2):  # the textbook formula, with 0 · log 0 = 0
        m = 0.5 * (p + q)
        kl = lambda a: sum(x * np.log(x / y) for x, y in zip(a, m, strict=True) if x > 0)  # noqa: E731
        return np.sqrt(0.5 * kl(p) + 0.5 * kl(q)) / np.sqrt(np.log(base))

    res = compare_sessions(sa, sb)
    wa, wb = sa.weights(1, 2).astype(np.float64), sb.weights(1, 2).astype(np.float64)
    d = [jensenshannon(wa[i], wb[i], base=2) for i in range(1, len(wa))]
    assert res.js_mean[1, 2] == pytest.approx(np.mean(d), abs=1e-6)
    assert res.js_max[1, 2] == pytest.approx(np.max(d), abs=1e-6)
    assert res.js_argmax[1, 2] == 1 + int(np.argmax(d))


def test_small_blocks_give_the_same_table(tiny):
    sa, sb = _run(tiny["base"]), _run(tiny["first"])
    a, b = compare_sessions(sa, sb, block_rows=256), compare_sessions(sa, sb, block_rows=3)
    # bands change only the matmul blocking of the weights: float32 rounding
    np.testing.assert_allclose(a.js_mean, b.js_mean, atol=1e-6)
    np.testing.assert_allclose(a.js_max, b.js_max, atol=1e-6)


def test_progress_and_cancel_between_heads(tiny):
    sa, sb = _run(tiny["base"]), _run(tiny["last"])
    seen = []
    compare_sessions(sa, sb, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(i, 8) for i in range(1, 9)]
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(Cancelled):
        compare_sessions(sa, sb, cancelled=cancel)


def test_alignment_token_and_prefix():
    assert align([1, 2, 3], [1, 9, 3]).kind == "token"
    assert align([1, 2, 3], [1, 9, 3]).first_difference == 1
    a = align([1, 2, 3, 4], [1, 2, 5])
    assert (a.kind, a.n, a.first_difference) == ("prefix", 2, 2)
    a = align([1, 2, 3], [1, 2, 3, 4, 5])
    assert (a.kind, a.n) == ("prefix", 3) and "3 of 3 (A) / 5 (B)" in a.description
    with pytest.raises(SessionError):
        align([1, 2], [3, 4, 5])
    with pytest.raises(SessionError):
        align([], [1])


def test_edited_prompt_same_length_moves_rows_after_the_edit_only(tiny):
    sa = _run(tiny["base"], "The cat sat on the mat.")
    sb = _run(tiny["base"], "The dog sat on the mat.")
    res = compare_sessions(sa, sb)
    assert res.alignment.kind == "token" and res.alignment.first_difference == 4  # "The " = 4 bytes
    assert res.js_mean.min() > 0  # every head's later rows see the edited key
    # rows before the edit are identical: the maximum is never there
    assert np.all(res.js_argmax >= 4)
    sc = _run(tiny["base"], "The cat sat on the mat. And")
    res = compare_sessions(sa, sc)
    assert res.alignment.kind == "prefix" and res.alignment.n == len(sa.ids)
    assert res.js_mean.max() <= 1e-6 and res.kl.shape == (len(sa.ids),)


def test_logits_divergence_by_hand():
    la = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    lb = np.array([[0.0, 1.0, 2.0], [0.0, 3.0, 0.0]])
    kl, ta, tb, agree = logits_divergence(la, lb)
    pa = np.exp(la[1]) / np.exp(la[1]).sum()
    pb = np.exp(lb[1]) / np.exp(lb[1]).sum()
    assert kl[0] == pytest.approx(0.0, abs=1e-12)
    assert kl[1] == pytest.approx(float((pa * np.log2(pa / pb)).sum()), rel=1e-12)
    assert list(ta) == [2, 0] and list(tb) == [2, 1] and list(agree) == [True, False]


def test_different_layouts_are_one_line_error(tiny, tmp_path):
    q2 = tmp_path / "q2"
    save_tiny("qwen2", q2)  # 3 layers against the llama's 2
    with pytest.raises(SessionError, match="different attention layouts"):
        compare_sessions(_run(tiny["base"]), _run(q2))


# -- value-weighted scale --------------------------------------------------------------------------
def _direct_value_weighted(folder, prompt):
    """‖α_ij v_j W_O^h‖ from transformers eager's own weights and a hooked v_proj: (L, H, T, T)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = AutoTokenizer.from_pretrained(folder)(prompt)["input_ids"]
    vs = {}
    hooks = [
        lay.self_attn.v_proj.register_forward_hook(lambda mod, i, o, k=k: vs.__setitem__(k, o.detach()))
        for k, lay in enumerate(m.model.layers)
    ]
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_attentions=True)
    for hk in hooks:
        hk.remove()
    cfg = m.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = cfg.hidden_size // H
    res = []
    for k, lay in enumerate(m.model.layers):
        att = out.attentions[k][0].double()  # (H, T, T)
        v = vs[k][0].double().reshape(len(ids), Hkv, D)  # (T, Hkv, D)
        wo = lay.self_attn.o_proj.weight.double()  # (hidden, H*D)
        per = []
        for h in range(H):
            f = v[:, h // (H // Hkv)] @ wo[:, h * D : (h + 1) * D].T  # (T, hidden): v_j W_O^h
            vec = att[h][:, :, None] * f[None, :, :]  # (T, T, hidden): α_ij v_j W_O^h
            per.append(torch.linalg.vector_norm(vec, dim=-1))
        res.append(torch.stack(per))
    return torch.stack(res).detach().numpy(), ids


def test_value_weighted_matches_direct_norms(tiny):
    s = _run(tiny["base"])
    direct, ids = _direct_value_weighted(tiny["base"], PROMPT)
    assert list(ids) == s.ids
    for layer in range(2):
        norms = value_norms(s, layer)
        assert norms.shape == (4, len(ids)) and norms.dtype == np.float32
        for h in range(4):
            vw = value_weighted(s, layer, h)
            np.testing.assert_allclose(vw, direct[layer, h], rtol=2e-5, atol=1e-6)
            rn = value_weighted(s, layer, h, normalise=True)
            want = direct[layer, h] / direct[layer, h].sum(axis=1, keepdims=True)
            np.testing.assert_allclose(rn, want, rtol=2e-5, atol=1e-6)
            np.testing.assert_allclose(rn.sum(axis=1), 1.0, atol=1e-5)
            # a column tile, row-normalised over whole rows
            tile = value_weighted(s, layer, h, rows=slice(5, 12), cols=slice(2, 6), normalise=True)
            np.testing.assert_allclose(tile, want[5:12, 2:6], rtol=2e-5, atol=1e-6)


def test_value_weighted_sink_scores(tiny):
    s = _run(tiny["base"])
    direct, _ = _direct_value_weighted(tiny["base"], PROMPT)
    share = direct[..., 1:, 0] / direct[..., 1:, :].sum(axis=-1)  # (L, H, T-1)
    np.testing.assert_allclose(value_weighted_sink_scores(s), share.mean(axis=-1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        value_weighted_sink_scores(s, normalise=False, block_rows=4),
        direct[..., 1:, 0].mean(axis=-1),
        rtol=1e-5,
        atol=1e-7,
    )


def test_apply_norms_masked_rows_stay_zero():
    w = np.array([[0.0, 0.0], [0.25, 0.75]], np.float32)
    out = apply_norms(w, np.array([2.0, 1.0]), normalise=True)
    np.testing.assert_allclose(out, [[0, 0], [0.4, 0.6]], atol=1e-7)
    assert not np.isnan(out).any()


def test_value_weighted_compare_ranks_the_perturbed_head(tiny):
    res = compare_sessions(_run(tiny["base"]), _run(tiny["last"]), weighting="value-weighted")
    assert res.weighting == "value-weighted"
    assert (res.ranked()[0].layer, res.ranked()[0].head) == (1, 2)
    assert sorted(res.js_mean.ravel())[-2] <= 1e-6


def test_mlx_value_norms_match_torch(tiny):
    pytest.importorskip("mlx.core")
    st, sm = _run(tiny["base"]), _load(tiny["base"], "mlx")
    sm.prefill(PROMPT, chat_template=False, all_logits=True)
    for layer in range(2):
        np.testing.assert_allclose(value_norms(sm, layer), value_norms(st, layer), rtol=1e-4, atol=1e-6)
    res = compare_sessions(st, sm)
    assert res.js_max.max() <= 1e-3 and np.all(res.top1_agree)


# -- CLI ----------------------------------------------------------------------------------------------
def test_cli_compare_json(tiny, tmp_path, capsys):
    from attnscope.core.cli.main import main

    out = tmp_path / "cmp.json"
    rc = main(
        [
            "compare",
            "--model",
            str(tiny["base"]),
            "--model-b",
            str(tiny["last"]),
            "--prompt",
            PROMPT,
            "--no-chat-template",
            "--device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert (data["heads"][0]["layer"], data["heads"][0]["head"]) == (1, 2)
    assert set(data["heads"][0]) >= {"layer", "head", "js_mean", "js_max"}
    means = [h["js_mean"] for h in data["heads"]]
    assert means == sorted(means, reverse=True) and len(means) == 8
    assert len(data["logits"]) == data["alignment"]["n"]
    assert {"kl_a_b_bits", "top1_agree"} <= set(data["logits"][0])
    assert data["run_a"]["model"] and data["run_b"]["ids"] == data["run_a"]["ids"]


def test_cli_compare_prompt_b_and_bad_input(tiny, tmp_path, capsys):
    from attnscope.core.cli.main import main

    out = tmp_path / "p.json"
    rc = main(
        [
            "compare",
            "--model",
            str(tiny["base"]),
            "--prompt",
            "The cat sat.",
            "--prompt-b",
            "The dog sat.",
            "--no-chat-template",
            "--device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["alignment"]["kind"] == "token" and data["alignment"]["first_difference"] == 4
    rc = main(
        [
            "compare",
            "--model",
            str(tiny["base"]),
            "--prompt",
            "  ",
            "--device",
            "cpu",
            "--json",
            str(tmp_path / "x.json"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "empty" in err
    rc = main(
        ["compare", "--model", str(tiny["base"]), "--prompt", "x", "--json", str(tmp_path / "no" / "x.json")]
    )
    assert rc == 1


def test_cli_sinks_value_weighted(tiny, tmp_path):
    from attnscope.core.cli.main import main
    from attnscope.core.session import Session

    out = tmp_path / "s.json"
    rc = main(
        [
            "sinks",
            "--model",
            str(tiny["base"]),
            "--prompt",
            PROMPT,
            "--no-chat-template",
            "--device",
            "cpu",
            "--value-weighted",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    s = Session.load(str(tiny["base"]), device="cpu")
    s.prefill(PROMPT, chat_template=False)
    np.testing.assert_allclose(data["sink_value_weighted"], value_weighted_sink_scores(s), atol=1e-5)
    assert data["weighting"] == ["attention", "value-weighted"]


# -- SmolLM2-135M (the embedded default) -------------------------------------------------------------
SMOL_CMP_PROMPT = "The quick brown fox jumps over the lazy dog. Then the dog wakes up and chases the fox."


@pytest.fixture()
def smol_a(smol_session):
    from attnscope.core.session import Session

    s = smol_session if smol_session.info.dtype == "float32" else Session.load(None, dtype="float32")
    s.prefill(SMOL_CMP_PROMPT, chat_template=False, all_logits=True)
    return s


@pytest.mark.slow
def test_smollm2_torch_vs_mlx_agree_to_float32_rounding(smol_a):
    """Same weights, two backends: every head's JS distance is float32 rounding that grows with depth.

    Measured (51-token prompt, this machine): layer 0 max 9.3e-7, all layers max 7.5e-6, i.e. a JS
    *divergence* (distance², bits) of at most 5.6e-11 bits; the top-1 token agrees everywhere.
    """
    pytest.importorskip("mlx.core")
    from attnscope.core.session import Session

    sm = Session.load(None, backend="mlx", dtype="float32")
    sm.prefill(SMOL_CMP_PROMPT, chat_template=False, all_logits=True)
    res = compare_sessions(smol_a, sm)
    assert res.alignment.kind == "token" and res.alignment.first_difference is None
    assert res.js_max[0].max() <= 2e-6  # layer 0: inputs identical, only the q/k/LSE rounding
    assert res.js_max.max() <= 2e-5  # deeper layers: the residual stream's float32 rounding accumulates
    assert (res.js_max.max() ** 2) <= 1e-6  # as a divergence, far below 1e-6 bits
    assert res.kl.max() <= 1e-6 and res.top1_agree.all()


@pytest.mark.slow
def test_smollm2_float32_vs_bfloat16_table(smol_a):
    from attnscope.core.session import Session

    sb = Session.load(None, dtype="bfloat16")
    sb.prefill(SMOL_CMP_PROMPT, chat_template=False, all_logits=True)
    res = compare_sessions(smol_a, sb)
    ranked = res.ranked()
    assert len(ranked) == 30 * 9
    assert [d.js_mean for d in ranked] == sorted((d.js_mean for d in ranked), reverse=True)
    assert res.run_b.dtype == "bfloat16" and res.run_a.dtype == "float32"
    # bf16 (8 mantissa bits) moves every head a little, none a lot; the least moved is the sink head
    # that puts all its weight on token 0 (L18 H8 here: 1.6e-5)
    assert ranked[-1].js_mean > 0 and np.median(res.js_mean) > 1e-3 and ranked[0].js_mean < 0.1
    assert all(d.js_max >= d.js_mean for d in ranked)
    assert 0 < res.kl.mean() < 0.05 and res.top1_agree.mean() >= 0.8


def test_run_pair_low_memory_gives_the_same_table(tiny):
    from attnscope.core.analysis.compare_runs import release_model, run_pair

    kw = dict(prompt=PROMPT, chat_template=False, device="cpu", weighting="value-weighted")
    full = run_pair(str(tiny["base"]), str(tiny["last"]), **kw)
    low = run_pair(str(tiny["base"]), str(tiny["last"]), low_memory=True, **kw)
    np.testing.assert_array_equal(full.js_mean, low.js_mean)
    np.testing.assert_array_equal(full.kl, low.kl)
    assert (low.ranked()[0].layer, low.ranked()[0].head) == (1, 2)
    # a released session still answers weights from its trace
    s = _run(tiny["base"])
    w = s.weights(1, 0)
    release_model(s)
    np.testing.assert_array_equal(s.weights(1, 0), w)
