"""Which heads matter on the MLX backend (:mod:`attnscope.core.analysis.mlx_heads`, through the MLX models'
intervention seams, :mod:`attnscope.core.backends.mlx_interventions`) against the torch backend on the same
saved weights: ablation, exact and attribution patching, direct logit attribution and the logit lens within
1e-4. The torch backend's numbers are themselves checked against plain transformers hooks
(tests/core/test_head_effects.py).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_models import save_tiny

mx = pytest.importorskip("mlx.core")

from attnscope.core.analysis.head_effects import (  # noqa: E402
    attribution_patching,
    head_effects,
    logit_attribution,
    make_target,
    patch_heads,
)
from attnscope.core.analysis.logit_lens import logit_lens  # noqa: E402
from attnscope.core.errors import BadArgument, OutOfRange, UnsupportedModelError  # noqa: E402

IDS = [5, 9, 14, 20, 9, 14, 33, 41, 7, 14, 20, 9]  # 12 tokens, with repeats
CORRUPT = [5, 9, 14, 44, 9, 14, 33, 41, 7, 14, 20, 9]  # one token swapped: the same length
SOURCE = IDS[::-1]
TOL = 1e-4


@pytest.fixture(scope="module")
def pair(tmp_path_factory, request):
    """``family -> (torch session, MLX session)`` on one saved tiny model, both prefilled with IDS."""
    import attnscope

    root = tmp_path_factory.mktemp("mlx_heads")
    made: dict = {}

    def get(family):
        if family not in made:
            folder = root / family
            save_tiny(family, folder)
            st = attnscope.Session.load(str(folder), backend="torch")
            sm = attnscope.Session.load(str(folder), backend="mlx")
            assert sm.backend.name == "mlx"
            for s in (st, sm):
                s.prefill(IDS)
            made[family] = (st, sm)
        return made[family]

    return get


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _close(a, b, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, what
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
    ok = ~np.isnan(a)
    assert np.all(np.abs(a[ok] - b[ok]) <= TOL), (what, np.abs(a[ok] - b[ok]).max())


FAMILIES = ["llama", "qwen3"]


@pytest.mark.parametrize(
    "family", [*FAMILIES, *(pytest.param(f, marks=pytest.mark.slow) for f in ("mistral", "qwen2"))]
)
@pytest.mark.parametrize("scope", ["readout", "everywhere"])
def test_ablation_equals_torch(pair, family, scope):
    """Both scopes, every method; mistral and qwen2: sliding windows over the shared prefix (read-out rows),
    qwen2: q/k/v biases."""
    st, sm = pair(family)
    t = make_target(st, "logprob", position=9)
    assert make_target(sm, "logprob", position=9) == t
    for method in ("zero", "mean", "resample"):
        a = head_effects(st, t, method, scope, source=SOURCE)
        b = head_effects(sm, t, method, scope, source=SOURCE)
        assert abs(a.clean - b.clean) < TOL and b.reused
        for name in ("query", "kv", "kv_side"):  # query heads, whole GQA groups, K/V sides
            _close(getattr(a, name), getattr(b, name), (family, scope, method, name))
        assert np.abs(b.query).max() > 1e-3 and np.abs(b.kv_side).max() > 1e-3  # heads matter here
    kl = make_target(st, "kl", position=9)
    _close(head_effects(st, kl, "mean", scope).query, head_effects(sm, kl, "mean", scope).query, "kl")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scope", ["readout", "everywhere"])
def test_exact_patching_equals_torch(pair, family, scope):
    st, sm = pair(family)
    t = make_target(st, "logit_diff", token=9, other=14)
    for site in ("output", "query", "kv"):
        a = patch_heads(st, CORRUPT, t, scope, site=site)
        b = patch_heads(sm, CORRUPT, t, scope, site=site)
        assert b.site == site and b.method == "exact"
        assert abs(a.clean - b.clean) < TOL and abs(a.corrupt - b.corrupt) < TOL and a.clean != a.corrupt
        for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
            _close(getattr(a, name), getattr(b, name), (family, scope, site, name))
        assert np.nanmax(np.abs(b.denoise_kv)) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_attribution_patching_equals_torch(pair, family):
    """The gradient estimate (mx.value_and_grad on MLX, autograd on torch) is the same number."""
    st, sm = pair(family)
    t = make_target(st, "logit_diff", token=9, other=14)
    for scope, site in (("everywhere", "output"), ("readout", "query"), ("everywhere", "kv")):
        a = attribution_patching(st, CORRUPT, t, scope, site=site)
        b = attribution_patching(sm, CORRUPT, t, scope, site=site)
        assert b.method == "attribution"
        for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
            _close(getattr(a, name), getattr(b, name), (family, scope, site, name))
    lp = make_target(st, "logprob")
    one = attribution_patching(sm, CORRUPT, lp, "everywhere", directions=("denoise",))
    ref = attribution_patching(st, CORRUPT, lp, "everywhere", directions=("denoise",))
    # a small clean - corrupt difference: fractions of it near 20, so the estimated changes are compared
    diff = ref.clean - ref.corrupt
    _close(ref.denoise * diff, one.denoise * diff, "logprob")
    assert np.isnan(one.noise).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_direct_logit_attribution_equals_torch(pair, family):
    st, sm = pair(family)
    for t in (make_target(st, "logprob", position=7), make_target(st, "logit_diff", token=9, other=14)):
        a, b = logit_attribution(st, t), logit_attribution(sm, t)
        assert abs(b.total - b.logit) < TOL and b.residual_error < 1e-5  # the parts add up
        assert abs(a.logit - b.logit) < TOL and abs(a.total - b.total) < TOL
        _close(a.heads, b.heads, "heads")
        _close(a.mlp, b.mlp, "mlp")
        _close(a.attn_bias, b.attn_bias, "attn_bias")
        assert abs(a.embedding - b.embedding) < TOL and abs(a.constant - b.constant) < TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_logit_lens_equals_torch(pair, family):
    st, sm = pair(family)
    a, b = logit_lens(st, [2, 5, -1], k=3), logit_lens(sm, [2, 5, -1], k=3)
    assert b.positions.tolist() == [2, 5, len(IDS) - 1]
    np.testing.assert_array_equal(a.top_ids, b.top_ids)
    np.testing.assert_array_equal(a.final_ids, b.final_ids)
    np.testing.assert_array_equal(a.final_rank, b.final_rank)
    _close(a.top_probs, b.top_probs, "top_probs")
    _close(a.final_prob, b.final_prob, "final_prob")
    assert b.final_rank[-1].tolist() == [0, 0, 0]  # the last layer's lens is the model


def test_session_methods_and_layers_and_progress(pair):
    """Through the public Session's methods: a subset of layers, progress and cancel as on torch; the
    session's own sequence and cache are untouched."""
    from attnscope.core.errors import Cancelled

    st, sm = pair("llama")
    t = sm.make_target("logit_diff", token=9, other=14)
    a = st.head_effects(t, "zero", "everywhere", layers=[1])
    b = sm.head_effects(t, "zero", "everywhere", layers=[1])
    assert b.layers == (1,) and np.isnan(b.query[0]).all()
    _close(a.query, b.query, "layers=[1]")
    _close(
        st.patch_heads(CORRUPT, t, "readout", layers=[0]).noise,
        sm.patch_heads(CORRUPT, t, "readout", layers=[0]).noise,
        "patch",
    )
    _close(st.logit_lens([-1]).top_probs, sm.logit_lens([-1]).top_probs, "lens")
    seen = []
    with pytest.raises(Cancelled, match="stopped after 3 of"):
        sm.head_effects(t, progress=lambda i, n: seen.append((i, n)), cancelled=lambda: len(seen) >= 3)
    n = sm.info.n_layers * (sm.info.n_heads + 2 * sm.info.n_kv_heads)
    assert seen == [(1, n), (2, n), (3, n)]
    assert sm.ids == IDS and sm.trace.seq_len == len(IDS) and sm.backend.seq_len == len(IDS)
    np.testing.assert_allclose(sm.logits, st.logits, atol=TOL)  # the session's own state still holds


def test_bad_input_is_one_line(pair):
    _, sm = pair("llama")
    with pytest.raises(BadArgument, match="method"):
        head_effects(sm, method="nope")
    with pytest.raises(BadArgument, match="second prompt"):
        head_effects(sm, method="resample")
    with pytest.raises(BadArgument, match="same length"):
        patch_heads(sm, CORRUPT[:-1], make_target(sm, "logit_diff", token=9, other=14))
    with pytest.raises(BadArgument, match="site"):
        patch_heads(sm, CORRUPT, site="nope")
    with pytest.raises(OutOfRange):
        head_effects(sm, layers=[7])
    with pytest.raises(OutOfRange):
        logit_lens(sm, positions=[40])


def test_models_without_seams_are_refused_in_one_line():
    """An mlx-lm family's layers (mlx-lm's own code) have no seams: one line, pointing at torch."""
    from attnscope.core.backends.mlx_interventions import sites_of

    be = SimpleNamespace(model=object(), info=SimpleNamespace(architecture="gemma3_text"))
    with pytest.raises(UnsupportedModelError, match="--backend torch") as e:
        sites_of(be)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_mlx_lm_family_is_refused_in_one_line(tmp_path):
    pytest.importorskip("mlx_lm")
    from attnscope.core.session import Session

    save_tiny("qwen3_moe", tmp_path / "moe")
    s = Session.load(str(tmp_path / "moe"), backend="mlx", dtype="float32")
    s.prefill(IDS)
    for run in (lambda: head_effects(s), lambda: logit_lens(s), lambda: logit_attribution(s)):
        with pytest.raises(UnsupportedModelError, match="mlx-lm.*--backend torch"):
            run()


@pytest.mark.slow
def test_cli_ablate_patch_lens_on_mlx_equal_torch(tmp_path):
    from attnscope.core.cli.main import main

    save_tiny("llama", tmp_path / "m")
    got = {}
    for backend in ("torch", "mlx"):
        out = tmp_path / f"{backend}.json"
        args = ["ablate", "--model", str(tmp_path / "m"), "--backend", backend, "--prompt", "ttt tt t"]
        args += ["--no-chat-template", "--target", "t", "--scope", "everywhere", "--json", str(out)]
        assert main(args) == 0
        got[backend] = json.loads(out.read_text())
    a, b = got["torch"], got["mlx"]
    assert a["ids"] == b["ids"] and abs(a["clean"] - b["clean"]) < TOL
    for key in ("query_heads", "kv_heads", "kv_side"):
        _close(a[key], b[key], key)
    da, db = a["direct_logit_attribution"], b["direct_logit_attribution"]
    assert abs(db["total"] - db["logit"]) < TOL
    _close(da["heads"], db["heads"], "dla")
    # patch (exact and attribution) and the lens from the command line on MLX too
    got = {}
    for backend in ("torch", "mlx"):
        out = tmp_path / f"p_{backend}.json"
        args = ["patch", "--model", str(tmp_path / "m"), "--backend", backend, "--prompt", "ttt tt t"]
        args += ["--no-chat-template", "--corrupt", "tt tttt", "--target", "t", "--other", " t"]
        assert main([*args, "--method", "both", "--site", "query", "--json", str(out)]) == 0
        lens = tmp_path / f"l_{backend}.json"
        args = ["lens", "--model", str(tmp_path / "m"), "--backend", backend, "--prompt", "ttt tt t"]
        assert main([*args, "--no-chat-template", "--positions", "0,-1", "--json", str(lens)]) == 0
        got[backend] = json.loads(out.read_text()), json.loads(lens.read_text())
    (pa, la), (pb, lb) = got["torch"], got["mlx"]
    for key in ("denoise", "noise", "denoise_kv", "noise_kv"):
        _close(pa[key], pb[key], key)
        _close(pa["attribution"][key], pb["attribution"][key], key)
    assert la["top_ids"] == lb["top_ids"]
    _close(la["top_probs"], lb["top_probs"], "lens")
