"""A score split by source (:mod:`attnscope.core.analysis.qk_sources`): the table adds up to the stored
score for each family, each component is the output a plain transformers forward with hooks shows for that
head or MLP, and on SmolLM2 the induction circuit reads as Olsson et al. 2022 describe it (an induction
head's key side built by a previous-token head)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from attnscope.core.errors import BadArgument, OutOfRange, SessionError, UnsupportedModelError
from tiny_models import save_tiny

IDS = [5, 9, 14, 20, 9, 14, 33, 41, 7, 14, 20, 9]  # 12 tokens, with repeats


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _load(family, tmp_path):
    from attnscope.core.session import Session

    ref = save_tiny(family, tmp_path / family)
    s = Session.load(str(tmp_path / family))
    s.prefill(IDS)
    return s, ref


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2", "phi3", "gemma3_text"])
def test_parts_add_up_to_the_stored_score(family, tmp_path):
    """Every cell of the table, the per-side totals and pairs + rest all add up to the Trace's score; the
    images of the components add up to the captured query and key (1e-6: float32 round-off)."""
    from attnscope.core.analysis.qk_sources import source_split

    s, _ = _load(family, tmp_path)
    L = s.info.n_layers - 1
    for head, (i, j) in [(3, (11, 3)), (1, (7, 7)), (0, (5, 1))]:
        r = source_split(s, L, head, i, j, top=7)
        stored = float(s.trace.scores(L, head, slice(i, i + 1), slice(j, j + 1), raw=True)[0, 0])
        assert abs(r.score - stored) <= 1e-6 * max(1.0, abs(stored))
        assert r.kv_head == head // s.info.group_size
        assert abs(r.total - r.score) <= 1e-4 * abs(r.score), (family, head, i, j, r.total, r.score)
        assert abs(sum(v for _, v in r.query_totals) - r.score) <= 1e-4 * abs(r.score)
        assert abs(sum(v for _, v in r.key_totals) - r.score) <= 1e-4 * abs(r.score)
        assert abs(sum(p[2] for p in r.pairs) + r.rest - r.score) <= 1e-4 * abs(r.score)
        assert max(r.query_error, r.key_error, r.residual_error) < 1e-5
        assert len(r.pairs) == 7 and r.table.shape == (len(r.components), len(r.components))
        mags = [abs(p[2]) for p in r.pairs]
        assert mags == sorted(mags, reverse=True) and mags[0] == np.abs(r.table).max()
        # the parts are spread over many components: the split is not one cell holding the score
        assert np.count_nonzero(np.abs(r.table) > 1e-3 * np.abs(r.table).max()) > 10
    assert "frozen" in r.approximation and "Exact" in r.approximation
    json.dumps(r.to_dict())  # JSON-ready
    if family in ("qwen3", "gemma3_text"):
        assert "QK-norm" in r.approximation


def _hooked(ref, ids, layer):
    """A plain eager forward with hooks: each layer's o_proj input, what each layer's attention and MLP add
    to the residual stream, and the input of ``layer``; every tensor ``(T, ·)``."""
    dec = ref.model if hasattr(ref, "model") else ref.transformer
    layers = dec.layers if hasattr(dec, "layers") else dec.h
    got: dict = {}
    handles = []

    def pre(name):
        def hook(_m, args, kwargs=None):
            x = args[0] if args else kwargs["hidden_states"]
            got[name] = x[0].detach().clone()

        return hook

    def post(name):
        def hook(_m, _args, out):
            got[name] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()

        return hook

    for li, ly in enumerate(layers):
        attn = ly.self_attn if hasattr(ly, "self_attn") else ly.attn
        proj = attn.o_proj if hasattr(attn, "o_proj") else attn.c_proj
        handles.append(proj.register_forward_pre_hook(pre(("z", li))))
        added_attn = ly.post_attention_layernorm if hasattr(ly, "post_feedforward_layernorm") else proj
        added_mlp = ly.post_feedforward_layernorm if hasattr(ly, "post_feedforward_layernorm") else ly.mlp
        handles.append(added_attn.register_forward_hook(post(("attn", li))))
        handles.append(added_mlp.register_forward_hook(post(("mlp", li))))
        handles.append(ly.register_forward_pre_hook(pre(("x", li)), with_kwargs=True))
    try:
        with torch.no_grad():
            ref(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return got, layers


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text", "qwen2"])
def test_each_component_is_the_hooked_output(family, tmp_path):
    """Head h's component is its slice of o_proj's input through W_O's columns for it (GPT-2's Conv1D: rows);
    the MLP's is the MLP's output (Gemma 3: its post-feed-forward norm's); the embedding is layer 0's input;
    the attention components of a layer add up to what its attention adds (Gemma 3: after its norm)."""
    from attnscope.core.analysis.qk_sources import residual_components

    s, ref = _load(family, tmp_path)
    L = s.info.n_layers - 1
    pos = [3, 9]
    comp = residual_components(s, L, pos)
    got, layers = _hooked(ref, IDS[: max(pos) + 1], L)
    H, names = s.info.n_heads, list(comp.names)
    sandwich = hasattr(layers[0], "post_feedforward_layernorm")
    for k, p in enumerate(pos):
        v = {n: torch.from_numpy(comp.vectors[k, c]).double() for c, n in enumerate(names)}
        np.testing.assert_allclose(comp.residual[k], got[("x", L)][p].numpy(), atol=1e-5, rtol=1e-5)
        if family == "gpt2":
            wpe = ref.transformer.wpe.weight[p].detach().double()
            torch.testing.assert_close(v["position embedding"], wpe, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(
                v["token embedding"] + wpe, got[("x", 0)][p].double(), atol=1e-6, rtol=0
            )
        else:
            torch.testing.assert_close(v["embedding"], got[("x", 0)][p].double(), atol=1e-5, rtol=1e-5)
        for li in range(L):
            z = got[("z", li)][p].double()
            D = z.shape[0] // H
            attn = layers[li].self_attn if hasattr(layers[li], "self_attn") else layers[li].attn
            heads = []
            for h in range(H):
                sl = slice(h * D, (h + 1) * D)
                if family == "gpt2":  # Conv1D: out = z @ W + b, W (n_heads·D, hidden)
                    want = z[sl] @ attn.c_proj.weight.detach().double()[sl]
                else:
                    want = attn.o_proj.weight.detach().double()[:, sl] @ z[sl]
                heads.append(v[f"L{li} H{h}"])
                if not sandwich:
                    torch.testing.assert_close(heads[-1], want, atol=1e-5, rtol=1e-5)
            total = sum(heads) + v.get(f"L{li} attn bias", 0.0)
            torch.testing.assert_close(total, got[("attn", li)][p].double(), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v[f"L{li} MLP"], got[("mlp", li)][p].double(), atol=1e-5, rtol=1e-5)
    assert comp.residual_error < 1e-6
    if family in ("gpt2", "qwen2"):  # projections with a bias: their own component
        assert any(n.endswith("attn bias") for n in names) == (family == "gpt2")


def test_gqa_kv_head_and_key_side(tmp_path):
    """Query heads of one GQA group share the key side: their key-side images are the same, so for the
    same cell two heads of a group differ only through the query side."""
    from attnscope.core.analysis.qk_sources import source_split

    s, _ = _load("llama", tmp_path)
    a = source_split(s, 1, 2, 10, 4)
    b = source_split(s, 1, 3, 10, 4)
    assert a.kv_head == b.kv_head == 1
    assert a.components == b.components
    assert not np.allclose(a.table, b.table)


def test_bad_arguments_and_refusals(tmp_path):
    from attnscope.core.analysis.qk_sources import source_split
    from attnscope.core.session import Session

    s, _ = _load("llama", tmp_path)
    with pytest.raises(OutOfRange, match="comes after"):
        source_split(s, 1, 0, 3, 5)
    with pytest.raises(OutOfRange):
        source_split(s, 2, 0, 3, 1)
    with pytest.raises(OutOfRange):
        source_split(s, 1, 0, 12, 1)
    with pytest.raises(BadArgument, match="top"):
        source_split(s, 1, 0, 3, 1, top=0)
    empty = Session.load(str(tmp_path / "llama"))
    with pytest.raises(SessionError, match="run a prompt"):
        source_split(empty, 1, 0, 3, 1)
    d, _ = _load("deepseek_v2", tmp_path)  # MLA: the key is rebuilt through a norm of a latent
    with pytest.raises(UnsupportedModelError, match="cannot be split by source") as e:
        source_split(d, 1, 0, 6, 2)
    assert "\n" not in str(e.value)


def test_layer_zero_has_only_the_embedding(tmp_path):
    """Layer 0 reads the embedding alone: one pair (plus the bias), equal to the score."""
    from attnscope.core.analysis.qk_sources import source_split

    s, _ = _load("llama", tmp_path)
    r = source_split(s, 0, 1, 8, 2)
    assert r.components == ("embedding", "bias")
    assert abs(r.table[0, 0] - r.score) <= 1e-5 * abs(r.score)  # no bias in llama's projections


@pytest.mark.slow
def test_smollm2_induction_head_key_side_is_a_previous_token_head(smol_session):
    """On the Head roles tab's induction probe (``[bos] r r``, |r| = 50), the strongest induction head's
    query→key cells (query in the second copy, key one after the earlier occurrence) have, as their top
    pair, a previous-token head on the key side (Olsson et al. 2022's two-head circuit). Measured once:
    L18 H6, key side L16 H0 (previous-token score 0.90) in every cell, e.g. L0 MLP × L16 H0 = +6.5 of 10.8."""
    from attnscope.core.analysis import roles
    from attnscope.core.analysis.qk_sources import source_split

    s = smol_session
    R = roles.PROBE_LEN
    ids, off = roles.probe_ids(s.tokenizer, s.info.vocab_size, R, 0)
    s.prefill(ids)
    ind = roles.induction_scores_from_trace(s.trace, R, off)
    prev = roles.sequence_scores(s.trace)["previous_token"]
    L, H = np.unravel_index(np.argmax(ind), ind.shape)
    assert (L, H) == (18, 6) and ind[L, H] > 0.8
    for i in (off + R + 10, off + 2 * R - 1):
        j = i - R + 1
        r = source_split(s, int(L), int(H), i, j, top=5)
        assert abs(r.total - r.score) <= 1e-4 * abs(r.score)
        key_side = r.pairs[0][1]
        kl, kh = (int(x) for x in key_side[1:].split(" H"))
        assert prev[kl, kh] > roles.DEFAULT_THRESHOLD, (r.pairs[0], prev[kl, kh])
        assert r.key_totals[0][0] == "L16 H0" and r.key_totals[0][1] > 0.5 * r.score


def test_explain_sources_session_cli_and_wire(tmp_path, capsys):
    """``explain(..., sources=True)`` and ``attnscope explain --sources --json`` give
    the split of :func:`source_split`; the Explanation with its split travels over the engine's wire."""
    from attnscope.core.analysis.explain import explain
    from attnscope.core.analysis.qk_sources import SourceSplit, source_split
    from attnscope.core.cli.main import main
    from attnscope.core.remote import wire

    s, _ = _load("qwen3", tmp_path)
    direct = source_split(s, 1, 2, 10, 4, top=4)
    e = explain(s, 1, 2, 10, 4, sources=True, top=4)
    assert isinstance(e.sources, SourceSplit) and e.sources.pairs == direct.pairs
    assert e.sources.score == pytest.approx(e.score, rel=1e-6)  # the band half reads the same score
    assert explain(s, 1, 2, 10, 4).sources is None
    assert explain(s, 1, 2, 10, 4, sources=True, top=4).sources.pairs == direct.pairs
    assert explain(s, 1, 2, 4, 10, sources=True).sources is None  # a key after the query: no score
    head, bufs = wire.encode(e)
    back = wire.decode(head, bufs, wire.core_dataclass)
    assert back.sources.pairs == e.sources.pairs and np.array_equal(back.sources.table, e.sources.table)

    folder, out = str(tmp_path / "qwen3"), tmp_path / "why.json"
    prompt = "the cat sat on the mat"
    s.prefill(prompt, chat_template=False)
    direct = source_split(s, 1, 2, 10, 4, top=4)
    argv = ["explain", "--model", folder, "--prompt", prompt, "--no-chat-template"]
    argv += ["--layer", "1", "--head", "2", "--query", "10", "--key", "4"]
    assert main([*argv, "--sources", "--top", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())["sources"]
    assert [(p["query"], p["key"]) for p in data["pairs"]] == [(q, k) for q, k, _ in direct.pairs]
    assert [p["value"] for p in data["pairs"]] == pytest.approx([v for *_, v in direct.pairs], abs=1e-6)
    assert sum(data["key_totals"].values()) == pytest.approx(direct.score, rel=1e-4)
    text = capsys.readouterr().out
    assert "by source" in text and "query: " in text and "frozen" in text and "rest (" in text
