"""Head ablation, activation patching, direct logit attribution
(:mod:`attnscope.core.analysis.head_effects`) against plain transformers forwards with hooks.

The reference for every effect is what a TransformerLens-style loop computes: an eager transformers
model, a forward pre-hook on the layer's ``o_proj`` that replaces head ``h``'s slice
``[h·D, (h+1)·D)`` of its input (at the read-out position only, or at every position), and the target
read from the logits at the read-out position.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.errors import BadArgument, OutOfRange
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


def _proj(ref, layer):
    return ref.model.layers[layer].self_attn.o_proj


def _hooked_logits(ref, ids, layer, heads, D, value=None, positions=slice(None)):
    """Eager logits at every position with ``heads``' slices of layer ``layer``'s o_proj input replaced."""
    if not heads:
        with torch.no_grad():
            return ref(torch.tensor([ids])).logits[0].double().numpy()

    def hook(_m, args):
        x = args[0].clone()
        for h in heads:
            sl = slice(h * D, (h + 1) * D)
            x[:, positions, sl] = 0 if value is None else value[..., sl]
        return (x,)

    handle = _proj(ref, layer).register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            return ref(torch.tensor([ids])).logits[0].double().numpy()
    finally:
        handle.remove()


def _proj_hooked_logits(ref, ids, layer, site, index, D, values=None, positions=slice(None)):
    """Eager logits with head ``index``'s slice of q_proj's output (``site="query"``), or KV head
    ``index``'s slices of k_proj's and v_proj's outputs (``site="kv"``), replaced at ``positions`` by
    ``values[name]`` (``(L, width)`` rows) or zeros."""
    attn = ref.model.layers[layer].self_attn
    mods = {"q": attn.q_proj} if site == "query" else {"k": attn.k_proj, "v": attn.v_proj}
    sl = slice(index * D, (index + 1) * D)

    def hook_for(name):
        def hook(_m, _args, out):
            out = out.clone()
            out[:, positions, sl] = 0 if values is None else values[name][positions, sl]
            return out

        return hook

    handles = [m.register_forward_hook(hook_for(n)) for n, m in mods.items()]
    try:
        with torch.no_grad():
            return ref(torch.tensor([ids])).logits[0].double().numpy()
    finally:
        for h in handles:
            h.remove()


def _proj_outputs(ref, ids, layer):
    """``{"q"|"k"|"v": (L, width)}``: layer ``layer``'s projection outputs on ``ids``."""
    attn = ref.model.layers[layer].self_attn
    got = {}

    def keep(name):
        def hook(_m, _args, out):
            got[name] = out[0].detach().clone()

        return hook

    handles = [getattr(attn, f"{n}_proj").register_forward_hook(keep(n)) for n in "qkv"]
    with torch.no_grad():
        ref(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return got


def _logprob(logits, tok):
    x = logits - logits.max()
    return float(x[tok] - np.log(np.exp(x).sum()))


@pytest.mark.parametrize(
    "family, scope",
    [
        ("llama", "readout"),
        *[
            pytest.param(f, sc, marks=pytest.mark.slow)
            for f in ("llama", "qwen3", "mistral", "gemma3_text")
            for sc in ("readout", "everywhere")
            if (f, sc) != ("llama", "readout")
        ],
    ],
)
def test_zero_ablation_equals_hooked_forward(family, scope, tmp_path):
    from attnscope.core.analysis.head_effects import head_effects, make_target

    s, ref = _load(family, tmp_path)
    p = 9
    t = make_target(s, "logprob", position=p)
    assert t.token == IDS[p + 1]  # default: the token the sequence holds next
    eff = head_effects(s, t, "zero", scope)
    D = s.info.head_dim
    clean = _logprob(_hooked_logits(ref, IDS, 0, [], D)[p], t.token)
    assert abs(eff.clean - clean) < 1e-5
    pos = slice(p, p + 1) if scope == "readout" else slice(None)
    for layer in range(s.info.n_layers):
        for h in range(s.info.n_heads):
            want = _logprob(_hooked_logits(ref, IDS, layer, [h], D, positions=pos)[p], t.token) - clean
            assert abs(eff.query[layer, h] - want) < 1e-5, (family, scope, layer, h)
        for k in range(s.info.n_kv_heads):
            group = list(s.info.group(k))
            want = _logprob(_hooked_logits(ref, IDS, layer, group, D, positions=pos)[p], t.token) - clean
            assert abs(eff.kv[layer, k] - want) < 1e-5, (family, scope, layer, k)
            # the K/V side alone: k_proj's and v_proj's output slices of KV head k zeroed
            want = (
                _logprob(_proj_hooked_logits(ref, IDS, layer, "kv", k, D, positions=pos)[p], t.token) - clean
            )
            assert abs(eff.kv_side[layer, k] - want) < 1e-5, (family, scope, layer, k)
    assert (
        np.abs(eff.query).max() > 1e-4 and np.abs(eff.kv_side).max() > 1e-4
    )  # heads matter in a random model
    assert eff.reused  # layers below each head's were reused, not re-run


@pytest.mark.parametrize("chunk", [512, 5])
def test_mean_and_resample_ablation_and_kl(chunk, tmp_path, monkeypatch):
    """Mean and resample ablation; with 5-token forward chunks the captured outputs are every chunk's
    (the mean is over positions 0..p, not over the last chunk)."""
    import attnscope.core.backends.torch_backend as tb
    from attnscope.core.analysis.head_effects import head_effects, make_target

    monkeypatch.setattr(tb, "PREFILL_CHUNK", chunk)
    s, ref = _load("llama", tmp_path)
    D, p = s.info.head_dim, len(IDS) - 1
    captured = {}

    def keep(_m, args):
        captured["z"] = args[0][0].detach().clone()

    handle = _proj(ref, 1).register_forward_pre_hook(keep)
    with torch.no_grad():
        ref(torch.tensor([IDS]))
    handle.remove()
    mean = captured["z"].mean(0, keepdim=True)
    t = make_target(s, "kl")
    eff = head_effects(s, t, "mean", "everywhere")
    clean_logits = _hooked_logits(ref, IDS, 0, [], D)[p]
    got = _hooked_logits(ref, IDS, 1, [2], D, value=mean)[p]
    q, r = np.exp(clean_logits - clean_logits.max()), np.exp(got - got.max())
    q, r = q / q.sum(), r / r.sum()
    assert abs(eff.query[1, 2] - float(np.sum(q * np.log(q / r)))) < 1e-6
    assert eff.clean == 0.0 and np.all(eff.query >= -1e-9)
    # resample from a second prompt, read-out position only
    other = [6, 8, 13, 21, 10, 15, 34, 40, 8, 13, 21, 10]
    handle = _proj(ref, 0).register_forward_pre_hook(keep)
    with torch.no_grad():
        ref(torch.tensor([other]))
    handle.remove()
    t2 = make_target(s, "logprob", token=7)
    eff2 = head_effects(s, t2, "resample", "readout", source=other)
    want = _logprob(
        _hooked_logits(ref, IDS, 0, [1], D, value=captured["z"][p], positions=slice(p, p + 1))[p], 7
    ) - _logprob(clean_logits, 7)
    assert abs(eff2.query[0, 1] - want) < 1e-5


@pytest.mark.slow
def test_patching_denoise_and_noise_fractions(tmp_path):
    from attnscope.core.analysis.head_effects import make_target, patch_heads

    s, ref = _load("qwen3", tmp_path)
    D, p = s.info.head_dim, len(IDS) - 1
    corrupt = list(IDS)
    corrupt[3] = 44
    t = make_target(s, "logit_diff", token=9, other=14)
    res = patch_heads(s, corrupt, t, "everywhere")

    def diff(logits):
        return float(logits[p, 9] - logits[p, 14])

    clean, bad = diff(_hooked_logits(ref, IDS, 0, [], D)), diff(_hooked_logits(ref, corrupt, 0, [], D))
    assert abs(res.clean - clean) < 1e-5 and abs(res.corrupt - bad) < 1e-5
    zc = {}

    def keep(_m, args):
        zc["z"] = args[0].detach().clone()

    for layer in range(s.info.n_layers):
        handle = _proj(ref, layer).register_forward_pre_hook(keep)
        with torch.no_grad():
            ref(torch.tensor([IDS]))
        handle.remove()
        z_clean = zc["z"]
        for h in range(s.info.n_heads):
            patched = diff(_hooked_logits(ref, corrupt, layer, [h], D, value=z_clean))
            assert abs(res.denoise[layer, h] - (patched - bad) / (clean - bad)) < 1e-4
    with pytest.raises(BadArgument, match="same length"):
        patch_heads(s, corrupt[:-1], t)


@pytest.mark.parametrize(
    "family", ["llama", *[pytest.param(f, marks=pytest.mark.slow) for f in ("qwen3", "gpt2", "phi3")]]
)
def test_direct_logit_attribution_sums_to_the_logit(family, tmp_path):
    from attnscope.core.analysis.head_effects import logit_attribution, make_target

    s, _ref = _load(family, tmp_path)
    t = make_target(s, "logprob", position=7)
    dla = logit_attribution(s, t)
    assert abs(dla.total - dla.logit) < 1e-4
    assert dla.residual_error < 1e-5
    assert dla.heads.shape == (s.info.n_layers, s.info.n_heads) and np.abs(dla.heads).max() > 0
    d2 = logit_attribution(s, make_target(s, "logit_diff", position=7, token=9, other=14))
    assert abs(d2.total - d2.logit) < 1e-4


@pytest.mark.parametrize(
    "family, scope, site",
    [
        ("llama", "everywhere", "query"),
        ("llama", "readout", "kv"),
        pytest.param("qwen3", "everywhere", "kv", marks=pytest.mark.slow),
        pytest.param("qwen3", "readout", "query", marks=pytest.mark.slow),
    ],
)
def test_query_side_and_kv_side_patching_equal_projection_hooks(family, scope, site, tmp_path):
    """A head's query side alone (q_proj's output slice) and a KV head's keys and values alone (k_proj's
    and v_proj's output slices) patched from one run into the other, as plain transformers hooks do it."""
    from attnscope.core.analysis.head_effects import make_target, patch_heads

    s, ref = _load(family, tmp_path)
    D, p = s.info.head_dim, len(IDS) - 1
    corrupt = list(IDS)
    corrupt[3] = 44
    t = make_target(s, "logit_diff", token=9, other=14)
    res = patch_heads(s, corrupt, t, scope, site=site)
    assert res.site == site and res.method == "exact"

    def diff(logits):
        return float(logits[p, 9] - logits[p, 14])

    clean, bad = diff(_hooked_logits(ref, IDS, 0, [], D)), diff(_hooked_logits(ref, corrupt, 0, [], D))
    pos = slice(p, p + 1) if scope == "readout" else slice(None)
    n = s.info.n_heads if site == "query" else s.info.n_kv_heads
    for layer in range(s.info.n_layers):
        src, dst = _proj_outputs(ref, IDS, layer), _proj_outputs(ref, corrupt, layer)
        for i in range(n):
            den = diff(_proj_hooked_logits(ref, corrupt, layer, site, i, D, src, pos))
            noi = diff(_proj_hooked_logits(ref, IDS, layer, site, i, D, dst, pos))
            got_d = res.denoise[layer, i] if site == "query" else res.denoise_kv[layer, i]
            got_n = res.noise[layer, i] if site == "query" else res.noise_kv[layer, i]
            assert abs(got_d - (den - bad) / (clean - bad)) < 1e-4, (layer, i)
            assert abs(got_n - (clean - noi) / (clean - bad)) < 1e-4, (layer, i)
    if site == "kv":
        assert np.isnan(res.denoise).all()


def _failed_walk(init):
    """:class:`_WalkReadout`'s ``__init__`` whose walk reports it cannot serve."""

    def failed(self, *a, **k):
        init(self, *a, **k)
        self.reuse = False

    return failed


@pytest.mark.parametrize(
    "family, site",
    [
        ("llama", "output"),
        ("llama", "kv"),
        *[pytest.param(f, "output", marks=pytest.mark.slow) for f in ("qwen3", "mistral", "gemma3_text")],
        pytest.param("qwen3", "query", marks=pytest.mark.slow),
    ],
)
def test_readout_patching_runs_the_corrupted_prompt_once_and_equals_hooks(
    family, site, tmp_path, monkeypatch
):
    """Read-out patching runs the corrupted prompt ONCE, as one walk up the layers with no KV cache of
    it (the clean prefix is the session's own cache), every denoising unit's row beside the walk and every
    noising unit from one batched step per layer; its fractions equal the whole-forward path (the
    :class:`_Runner` fallback), the scratch-KV-cache path and plain transformers forwards with the hook at
    the read-out position, to 1e-5. Llama, Qwen3 (QK-norm), Mistral and Gemma 3 (sliding window 4 < the
    read-out position)."""
    import attnscope.core.analysis.head_effects as he
    import attnscope.core.backends.torch_backend as tb

    s, ref = _load(family, tmp_path)
    D, p = s.info.head_dim, 9
    corrupt = list(IDS)
    corrupt[3] = 44
    t = he.make_target(s, "logit_diff", position=p, token=9, other=14)
    calls, tokens = [], []
    real = tb.TorchBackend.forward
    monkeypatch.setattr(
        tb.TorchBackend,
        "forward",
        lambda self, ids, *a, **k: calls.append(list(ids)) or real(self, ids, *a, **k),
    )
    emb = s.backend.model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, args: tokens.append(args[0].numel())
    )
    import attnscope.core.backends.base as base

    monkeypatch.setattr(base, "PREFILL_CHUNK", 4)  # the walk's layers in chunks of 4 positions
    walked = []
    real_sweep = he._WalkReadout.sweep
    monkeypatch.setattr(
        he._WalkReadout, "sweep", lambda self, *a, **k: walked.append(real_sweep(self, *a, **k)) or None
    )

    def no_cache(*_a, **_k):
        raise AssertionError("the corrupted prompt ran into a KV cache")

    monkeypatch.setattr(he, "_cached_readout", no_cache)
    try:
        res = he.patch_heads(s, corrupt, t, "readout", site=site)
    finally:
        emb.remove()
    # no backend forward: the clean recording step (one token) and the corrupted prompt's one walk
    assert calls == [] and tokens == [1, p + 1] and len(walked) == 1
    assert s.ids == IDS and s.backend.seq_len == len(IDS)
    monkeypatch.undo()

    # the same through a scratch KV cache of the corrupted prefix (where the walk's check fails)
    monkeypatch.setattr(he._WalkReadout, "__init__", _failed_walk(he._WalkReadout.__init__))
    cached = he.patch_heads(s, corrupt, t, "readout", site=site)
    for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
        a, b = getattr(res, name), getattr(cached, name)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nan_to_num(np.abs(a - b)).max() * abs(res.clean - res.corrupt) < 1e-5, name
    monkeypatch.undo()

    def diff(logits):
        return float(logits[p, 9] - logits[p, 14])

    clean, bad = diff(_hooked_logits(ref, IDS, 0, [], D)), diff(_hooked_logits(ref, corrupt, 0, [], D))
    assert abs(res.clean - clean) < 1e-5 and abs(res.corrupt - bad) < 1e-5
    # fractions of clean − corrupted compared as the patched target itself (a logit difference): 1e-5
    scale = abs(clean - bad)

    monkeypatch.setattr(he, "_readout_pair", lambda *a, **k: None)  # the whole-forward path
    old = he.patch_heads(s, corrupt, t, "readout", site=site)
    for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
        a, b = getattr(res, name), getattr(old, name)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nan_to_num(np.abs(a - b)).max() * scale < 1e-5, name
    assert abs(res.clean - old.clean) < 1e-5 and abs(res.corrupt - old.corrupt) < 1e-5
    at = slice(p, p + 1)
    for layer in range(s.info.n_layers):
        if site == "output":
            zs: dict = {}

            def keep(_m, args, zs=zs):
                zs[len(zs)] = args[0][:, at].detach().clone()

            handle = _proj(ref, layer).register_forward_pre_hook(keep)
            with torch.no_grad():
                for ids in (IDS, corrupt):  # zs[0]: the clean run's, zs[1]: the corrupted run's
                    ref(torch.tensor([ids]))
            handle.remove()
            units = [([h], res.denoise, res.noise, h) for h in range(s.info.n_heads)]
            units += [
                (list(s.info.group(k)), res.denoise_kv, res.noise_kv, k) for k in range(s.info.n_kv_heads)
            ]
            for heads, den_arr, noi_arr, i in units:
                den = diff(_hooked_logits(ref, corrupt, layer, heads, D, zs[0], at))
                noi = diff(_hooked_logits(ref, IDS, layer, heads, D, zs[1], at))
                assert abs(den_arr[layer, i] * (clean - bad) - (den - bad)) < 1e-5, (layer, heads)
                assert abs(noi_arr[layer, i] * (clean - bad) - (clean - noi)) < 1e-5, (layer, heads)
            continue
        src, dst = _proj_outputs(ref, IDS, layer), _proj_outputs(ref, corrupt, layer)
        n = s.info.n_heads if site == "query" else s.info.n_kv_heads
        for i in range(n):
            den = diff(_proj_hooked_logits(ref, corrupt, layer, site, i, D, src, at))
            noi = diff(_proj_hooked_logits(ref, IDS, layer, site, i, D, dst, at))
            got_d = res.denoise[layer, i] if site == "query" else res.denoise_kv[layer, i]
            got_n = res.noise[layer, i] if site == "query" else res.noise_kv[layer, i]
            assert abs(got_d * (clean - bad) - (den - bad)) < 1e-5, (layer, i)
            assert abs(got_n * (clean - bad) - (clean - noi)) < 1e-5, (layer, i)
    assert np.nanmax(np.abs(res.denoise_kv)) > 1e-3  # patches matter in a random model


def _linear_tail(s):
    """Make ``s``'s model linear after its last layer's output projection: the last MLP's output zeroed
    and the final norm an identity, so that the target is linear in the last layer's head outputs."""
    model = s.backend.model
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.zero_()
    model.model.norm = torch.nn.Identity()


def test_attribution_patching_is_exact_where_linear_and_close_to_exact_patching(tmp_path):
    """Attribution patching (one forward and one backward per direction) against exact patching: equal
    where the target is linear in the activation, and ranked alike elsewhere."""
    from attnscope.core.analysis.head_effects import attribution_patching, make_target, patch_heads

    s, _ref = _load("llama", tmp_path)
    corrupt = list(IDS)
    corrupt[3] = 44
    t = make_target(s, "logit_diff", token=9, other=14)
    est = attribution_patching(s, corrupt, t, "everywhere")
    exact = patch_heads(s, corrupt, t, "everywhere")
    assert est.method == "attribution" and abs(est.clean - exact.clean) < 1e-5
    assert abs(est.corrupt - exact.corrupt) < 1e-5
    agree = est.agreement(exact)
    assert agree["denoise"]["spearman"] > 0.8 and agree["noise"]["spearman"] > 0.8, agree
    assert np.nanmax(np.abs(est.denoise)) > 1e-3
    # a group's estimate is the sum of its heads' (the estimate is linear)
    g = list(s.info.group(1))
    assert abs(est.denoise_kv[0, 1] - est.denoise[0, g].sum()) < 1e-9
    # the last layer, with a linear tail: the estimate is the exact patch (both directions, both sites)
    _linear_tail(s)
    last = s.info.n_layers - 1
    for site in ("output", "query"):
        est = attribution_patching(s, corrupt, t, "everywhere", site=site)
        exact = patch_heads(s, corrupt, t, "everywhere", site=site, layers=[last])
        if site == "output":  # linear in the last layer's head outputs
            np.testing.assert_allclose(est.denoise[last], exact.denoise[last], atol=1e-4)
            np.testing.assert_allclose(est.noise_kv[last], exact.noise_kv[last], atol=1e-4)
        else:  # the query side goes through a softmax: an estimate only
            assert np.isfinite(est.denoise[last]).all()
    one = attribution_patching(s, corrupt, t, "readout", directions=("denoise",))
    exact = patch_heads(s, corrupt, t, "readout", layers=[last])
    np.testing.assert_allclose(one.denoise[last], exact.denoise[last], atol=1e-4)
    assert np.isnan(one.noise).all()


@pytest.mark.parametrize(
    "family",
    [
        "llama",
        "mistral",
        *[pytest.param(f, marks=pytest.mark.slow) for f in ("qwen3", "gemma3_text", "gpt_oss")],
    ],
)
def test_attribution_patching_from_the_trace_equals_the_plain_forwards(family, tmp_path, monkeypatch):
    """The clean head outputs rebuilt from the session's Trace and KV cache, and the runs started after the
    prefix both prompts share (read from that cache), give what one plain forward of the clean prompt and
    forwards with gradients over the whole prompts give (mistral: a sliding window; gemma3: local and
    global layers; gpt-oss: learned sinks), at the last position and an earlier one, both scopes."""
    from attnscope.core.analysis import head_effects
    from attnscope.core.analysis.head_effects import attribution_patching, make_target

    s, _ref = _load(family, tmp_path)
    corrupt = list(IDS)
    corrupt[5] = 44
    opened: list = []
    real_open = head_effects._TraceOutputs.open.__func__

    def spy(cls, *args):
        opened.append(real_open(cls, *args))
        return opened[-1]

    for position in (len(IDS) - 1, 8):
        t = make_target(s, "logit_diff", token=9, other=14, position=position)
        for scope in ("everywhere", "readout"):
            with monkeypatch.context() as m:
                m.setattr(head_effects._TraceOutputs, "open", classmethod(lambda cls, *a: None))
                m.setattr(head_effects, "_shared_prefix", lambda *a: 0)
                plain = attribution_patching(s, corrupt, t, scope)
            with monkeypatch.context() as m:
                m.setattr(head_effects._TraceOutputs, "open", classmethod(spy))
                if family != "gpt_oss":  # learned sinks: the runs start at 0
                    assert head_effects._shared_prefix(s, s.ids[: position + 1], corrupt[: position + 1]) == 5
                got = attribution_patching(s, corrupt, t, scope)
            assert opened[-1] is not None  # the Trace served the clean outputs
            assert abs(got.clean - plain.clean) < 1e-5 and abs(got.corrupt - plain.corrupt) < 1e-5
            for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
                a, b = getattr(got, name), getattr(plain, name)
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * (1 + np.abs(b).max()), err_msg=name)


def test_attribution_patching_falls_back_to_a_plain_forward_where_the_cache_lacks_the_prompt(tmp_path):
    """A clean prompt the session's cache no longer holds (stepped back past the read-out position) is
    run as a plain forward: the same result as with the cache."""
    from attnscope.core.analysis import head_effects
    from attnscope.core.analysis.head_effects import attribution_patching, make_target

    s, _ref = _load("llama", tmp_path)
    corrupt = list(IDS)
    corrupt[5] = 44
    t = make_target(s, "logit_diff", token=9, other=14, position=8)
    held = attribution_patching(s, corrupt, t, "everywhere")
    s.backend._ids = [0] * len(s.backend._ids)  # the cache no longer matches the prompt
    parts = head_effects._parts(s)
    with head_effects._scratch(s) as be:
        assert head_effects._TraceOutputs.open(s, be, parts, s.ids[:9]) is None
    assert head_effects._shared_prefix(s, s.ids[:9], corrupt[:9]) == 0
    plain = attribution_patching(s, corrupt, t, "everywhere")
    s.backend._ids = list(s.ids)
    early = list(IDS)
    early[1] = 44  # a shared prefix under a quarter of the 9 positions: the runs start at 0
    assert head_effects._shared_prefix(s, s.ids[:9], early[:9]) == 0
    assert head_effects._shared_prefix(s, s.ids[:9], corrupt[:9]) == 5
    np.testing.assert_allclose(held.denoise, plain.denoise, atol=1e-5 * (1 + np.abs(plain.denoise).max()))
    np.testing.assert_allclose(held.noise, plain.noise, atol=1e-5 * (1 + np.abs(plain.noise).max()))


def test_attribution_patching_forms_no_weight_gradient_and_one_row_of_logits(tmp_path, monkeypatch):
    """Attribution patching's gradients flow into the activations only: no parameter gets a ``.grad``, and
    the unembedding reads the read-out position alone (never the logits of every position), in the
    forwards with gradients as in the plain ones. The heap trim is checked after every layer of the
    forward with gradients and of its backward (``_HeapTrim``: the freed heap is handed back where the
    resident memory grew, what otherwise held most of its peak memory)."""
    from attnscope.core.analysis import head_effects
    from attnscope.core.analysis.head_effects import _parts, attribution_patching, make_target

    s, _ref = _load("llama", tmp_path)
    corrupt = list(IDS)
    corrupt[3] = 44
    t = make_target(s, "logit_diff", token=9, other=14)
    model = s.backend.model
    rows: list = []

    def count(_m, args):
        rows.append((args[0].shape[-2], torch.is_grad_enabled()))

    trims = [0]

    class Counted(head_effects._HeapTrim):
        def step(self) -> None:
            trims[0] += 1
            super().step()

    monkeypatch.setattr(head_effects, "_HeapTrim", Counted)
    handle = _parts(s).lm_head.register_forward_pre_hook(count)
    try:
        est = attribution_patching(s, corrupt, t, "everywhere")
    finally:
        handle.remove()
    # per direction: each layer's forward and each layer's products in the backward
    assert trims[0] >= 2 * 2 * s.info.n_layers
    assert np.isfinite(est.denoise).all() and np.isfinite(est.noise).all()
    assert all(p.grad is None for p in model.parameters())
    assert [r for r, grad in rows if grad] == [1, 1]  # one forward with gradients per direction
    assert max(r for r, _ in rows) == 1


def test_dla_refuses_post_norm_family(tmp_path):
    from attnscope.core.analysis.head_effects import logit_attribution
    from attnscope.core.errors import UnsupportedModelError

    s, _ = _load("gemma3_text", tmp_path)
    with pytest.raises(UnsupportedModelError, match="post-norm"):
        logit_attribution(s)


def test_bad_input_is_one_line(tmp_path):
    from attnscope.core.analysis.head_effects import head_effects, make_target

    s, _ = _load("llama", tmp_path)
    with pytest.raises(OutOfRange):
        make_target(s, position=99)
    with pytest.raises(BadArgument, match="tokens"):
        make_target(s, token="tt tt")  # several tokens
    with pytest.raises(BadArgument, match="second token"):
        make_target(s, "logit_diff", token=9)
    with pytest.raises(BadArgument, match="method"):
        head_effects(s, method="nope")
    with pytest.raises(BadArgument, match="second prompt"):
        head_effects(s, method="resample")


def test_sweep_cancels_and_reports_progress(tmp_path):
    from attnscope.core.analysis.head_effects import head_effects
    from attnscope.core.errors import Cancelled

    s, _ = _load("llama", tmp_path)
    seen = []
    with pytest.raises(Cancelled, match="stopped after 3 of"):
        head_effects(s, progress=lambda i, n: seen.append((i, n)), cancelled=lambda: len(seen) >= 3)
    n = s.info.n_layers * (s.info.n_heads + 2 * s.info.n_kv_heads)  # + each KV head's K/V side
    assert seen == [(1, n), (2, n), (3, n)]
    before = s.ids
    assert head_effects(s).query.shape == (s.info.n_layers, s.info.n_heads)  # the session still works
    assert s.ids == before and s.trace.seq_len == len(IDS)  # the sweep ran in its own cache


def test_prefill_takes_token_ids(tmp_path):
    from attnscope.core.errors import BadArgument

    s, _ = _load("llama", tmp_path)
    assert s.ids == IDS and s.n_prompt == len(IDS) and not s.chat_template
    w = s.weights(0, 1)
    s.prefill(s.prompt, chat_template=False)
    with pytest.raises(BadArgument, match="vocabulary"):
        s.prefill([5, 10_000])
    s.prefill(np.array(IDS))
    np.testing.assert_array_equal(s.weights(0, 1), w)


@pytest.mark.slow
def test_cli_ablate_patch_lens(tmp_path, capsys):
    import json

    from attnscope.core.cli.main import main

    save_tiny("llama", tmp_path / "m")
    m = str(tmp_path / "m")
    prompt = ["--prompt", "ttt tt t", "--no-chat-template"]
    assert (
        main(
            [
                "ablate",
                "--model",
                m,
                *prompt,
                "--target",
                "t",
                "--json",
                str(tmp_path / "a.json"),
                "--csv",
                str(tmp_path / "a.csv"),
            ]
        )
        == 0
    )
    a = json.loads((tmp_path / "a.json").read_text())
    assert np.asarray(a["query_heads"]).shape == (2, 4) and np.asarray(a["kv_heads"]).shape == (2, 2)
    dla = a["direct_logit_attribution"]
    assert abs(dla["total"] - dla["logit"]) < 1e-4
    assert a["prompt"] == "ttt tt t" and a["method"] == "zero" and a["scope"] == "readout"
    assert a["target_text"] == "t" and a["ids"] and a["target"]["kind"] == "logprob"
    lines = (tmp_path / "a.csv").read_text().splitlines()
    assert lines[0] == '# model: "m"' or lines[0].startswith("# model: ")
    assert '# prompt: "ttt tt t"' in lines and '# scope: "readout"' in lines  # provenance first
    rows = [r for r in lines if not r.startswith("#")]
    assert rows[0] == "layer,head,kv_head,effect,direct_logit_attribution" and len(rows) == 9
    assert (
        main(
            [
                "patch",
                "--model",
                m,
                *prompt,
                "--corrupt",
                "tt tttt",
                "--target",
                "t",
                "--other",
                " t",
                "--method",
                "both",
                "--site",
                "kv",
                "--json",
                str(tmp_path / "p.json"),
                "--csv",
                str(tmp_path / "p.csv"),
            ]
        )
        == 0
    )
    p = json.loads((tmp_path / "p.json").read_text())
    assert (
        np.asarray(p["denoise_kv"]).shape == (2, 2) and p["site"] == "kv" and p["corrupt_prompt"] == "tt tttt"
    )
    assert p["corrupt_ids"] and p["attribution"]["method"] == "attribution"
    assert set(p["attribution_agreement"]) == {"denoise_kv", "noise_kv"}
    rows = [r for r in (tmp_path / "p.csv").read_text().splitlines() if not r.startswith("#")]
    assert rows[0] == "layer,kv_head,denoise,noise,attribution_denoise,attribution_noise" and len(rows) == 5
    capsys.readouterr()
    assert main(["lens", "--model", m, *prompt, "--positions", "0,-1", "--json", "-"]) == 0
    lens = json.loads(capsys.readouterr().out)  # the summary goes to stderr
    assert lens["positions"][0] == 0 and len(lens["top_ids"]) == 2
    # bad input: one line, non-zero
    assert main(["ablate", "--model", m, *prompt, "--target", "tt tt", "--json", "-"]) != 0
    assert "not one" in capsys.readouterr().err
    assert main(["patch", "--model", m, *prompt, "--corrupt", "t", "--json", "-"]) != 0
    assert "same length" in capsys.readouterr().err


@pytest.mark.slow
def test_remote_engine_gives_the_same_effects(tmp_path):
    pytest.importorskip("zmq")
    from attnscope.core.analysis.head_effects import head_effects, logit_attribution, make_target
    from attnscope.core.analysis.logit_lens import logit_lens
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session
    from test_remote import TOKEN, serving

    save_tiny("qwen3", tmp_path / "m")
    local = Session.load(str(tmp_path / "m"))
    local.prefill(IDS)
    t = make_target(local, "logit_diff", token=9, other=14)
    want = head_effects(local, t, "mean")
    engine = Session.load(str(tmp_path / "m"))
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(IDS)
            t2 = make_target(r, "logit_diff", token=9, other=14)
            assert t2 == t
            got = head_effects(r, t2, "mean")
            np.testing.assert_array_equal(got.query, want.query)
            np.testing.assert_array_equal(got.kv, want.kv)
            assert logit_attribution(r, t).total == logit_attribution(local, t).total
            np.testing.assert_array_equal(logit_lens(r, [3]).top_ids, logit_lens(local, [3]).top_ids)
        finally:
            r.close()


@pytest.mark.slow
def test_readme_ioi_example_on_smollm2():
    """The docs/heads.md table: the heads that move " Mary" over " John"."""
    from attnscope.core.analysis.head_effects import head_effects, logit_attribution, make_target
    from attnscope.core.session import Session

    s = Session.load()
    s.prefill("When Mary and John went to the store, John gave a drink to", chat_template=False)
    t = make_target(s, "logit_diff", token=" Mary", other=" John")
    eff = head_effects(s, t, "zero", "readout")
    assert abs(eff.clean - 6.12) < 0.01
    top = eff.top(5)
    assert [(layer, h) for layer, h, _ in top[:3]] == [(23, 3), (29, 1), (29, 0)]
    assert abs(top[0][2] - (-2.93)) < 0.01 and abs(top[1][2] - (-1.68)) < 0.01
    assert abs(eff.kv[23, 1] - (-2.90)) < 0.01
    dla = logit_attribution(s, t)
    assert abs(dla.total - dla.logit) < 1e-4 and abs(dla.logit - eff.clean) < 1e-4
    assert abs(dla.heads[23, 3] - 2.86) < 0.01 and abs(dla.heads[29, 1] - 1.73) < 0.01


@pytest.mark.slow
def test_heads_bench_runs_and_its_loop_measures_the_same_effect(tmp_path):
    """``attnscope bench --heads`` on a tiny model: every row and ratio is there, and the plain
    transformers loop it times computes the sweep's own effect (its check)."""
    from attnscope.core.bench.heads import format_heads_table, run_heads_bench, sample_layers

    save_tiny("llama", tmp_path / "m")
    res = run_heads_bench(str(tmp_path / "m"), seq_len=24, repeats=1, loop_heads=2, everywhere_layers=1)
    assert res["loop_check_error"] < 1e-4 and res["reused"]
    assert res["units"] == 2 * (4 + 2 + 2) and res["everywhere_units"] == 4 + 2
    assert set(res["ratios"]) >= set(res["targets"]) and all(v > 0 for v in res["ratios"].values())
    assert "per-head loop" in format_heads_table(res)
    assert res["rows"]["lens_matmul_s"] > 0 and "unembedding matmul alone" in format_heads_table(res)
    # attribution patching's floor beside it: time and peak over the prefill's, in the JSON and the table
    assert res["rows"]["attribution_floor_s"] > 0 and res["ratios"]["attribution_floor_over_prefill"] > 0
    assert res["ratios"]["peak_attribution_floor_over_prefill_peak"] > 0
    assert res["ratios"]["peak_attribution_one_over_prefill_peak"] > 0
    assert "its floor, plain forward + backward / prefill" in format_heads_table(res)
    assert sample_layers(30, 5) == [3, 9, 15, 21, 27] and sample_layers(2, 1) == [1]


@pytest.mark.slow
def test_smollm2_readout_sweep_equals_hooked_forwards():
    """On the embedded SmolLM2 (float32): one layer's batched read-out sweep (every query head in one
    decode step) against a plain transformers forward per head with its slice of ``o_proj``'s input
    zeroed at the read-out position, and the GQA group against the group's slices zeroed."""
    from attnscope.core.analysis.head_effects import head_effects, make_target
    from attnscope.core.bench.overhead import HFRunner
    from attnscope.core.loading.resolve import resolve
    from attnscope.core.session import Session

    s = Session.load()
    s.prefill("When Mary and John went to the store, John gave a drink to", chat_template=False)
    t = make_target(s, "logit_diff", token=" Mary", other=" John")
    layer = 23
    eff = head_effects(s, t, "zero", "readout", layers=[layer], kv_side=False)
    assert eff.reused
    folder, _ = resolve(None)
    ref = HFRunner(folder, "sdpa", s.backend.device).model
    ids, D, p = list(s.ids), s.info.head_dim, len(s.ids) - 1
    logits = _hooked_logits(ref, ids, layer, [], D)[p]
    clean = logits[t.token] - logits[t.other]
    assert abs(eff.clean - clean) < 1e-5
    for h in range(s.info.n_heads):
        lg = _hooked_logits(ref, ids, layer, [h], D, positions=slice(p, p + 1))[p]
        assert abs(eff.query[layer, h] - (lg[t.token] - lg[t.other] - clean)) < 5e-5, (
            h
        )  # logits near 10: float32
    group = list(s.info.group(1))
    lg = _hooked_logits(ref, ids, layer, group, D, positions=slice(p, p + 1))[p]
    assert abs(eff.kv[layer, 1] - (lg[t.token] - lg[t.other] - clean)) < 5e-5
    assert abs(eff.query[layer, 3] - (-2.93)) < 0.01  # the docs' name mover


def test_readout_sweep_reads_the_session_cache_and_leaves_it_untouched(tmp_path, monkeypatch):
    """The read-out sweep starts from the session's own KV cache: no prefix forward (one token goes
    through the embedding: the recording decode step of the read-out position; the backend's forward is
    never called), and the session's cache tensors, logits and Trace are bit-identical afterwards."""
    import attnscope.core.backends.torch_backend as tb
    from attnscope.core.analysis.head_effects import head_effects, make_target

    s, ref = _load("llama", tmp_path)
    be = s.backend
    before = [(cl.keys.clone(), cl.values.clone(), cl.keys.data_ptr()) for cl in be._cache_layers()]
    logits, weights, seq = s.logits.copy(), s.weights(1, 2).copy(), be.seq_len
    calls, tokens = [], []
    real = tb.TorchBackend.forward
    monkeypatch.setattr(
        tb.TorchBackend,
        "forward",
        lambda self, ids, *a, **k: calls.append(len(ids)) or real(self, ids, *a, **k),
    )
    emb = be.model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, args: tokens.append(args[0].numel())
    )
    try:
        for p in (9, len(IDS) - 1):
            eff = head_effects(s, make_target(s, "logprob", position=p), "zero", "readout")
            assert eff.reused
    finally:
        emb.remove()
    assert calls == [] and tokens == [1, 1]  # one recording step per sweep, no prefix re-run
    after = be._cache_layers()
    for (k, v, ptr), cl in zip(before, after, strict=True):
        assert torch.equal(cl.keys, k) and torch.equal(cl.values, v) and cl.keys.data_ptr() == ptr
    assert be.seq_len == seq and s.ids == IDS
    np.testing.assert_array_equal(s.logits, logits)
    np.testing.assert_array_equal(s.weights(1, 2), weights)
    # and the effects are the hooked forwards' (the last position, one head)
    D, p = s.info.head_dim, len(IDS) - 1
    clean = _logprob(_hooked_logits(ref, IDS, 0, [], D)[p], eff.target.token)
    want = _logprob(_hooked_logits(ref, IDS, 1, [2], D, positions=slice(p, p + 1))[p], eff.target.token)
    assert abs(eff.query[1, 2] - (want - clean)) < 1e-5


@pytest.mark.parametrize("scope", ["readout", pytest.param("everywhere", marks=pytest.mark.slow)])
def test_longrope_head_effects_equal_hooked_forwards_of_the_whole_sequence(scope, tmp_path):
    """Phi-3 LongRoPE past original_max_position_embeddings (32): the session's 40 tokens run with the
    long factors. A read-out position inside the first 32 (p = 20) is measured as the whole sequence's
    forward computes it: head effects (and the mean ablation's prefix capture) need no rope_length, the
    backend's fork keeps the session's frequencies (TorchBackend.rope_floor)."""
    from attnscope.core.analysis.head_effects import head_effects, make_target
    from attnscope.core.session import Session
    from tiny_models import COMMON, tiny_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "phi3",
        **dict(
            COMMON,
            rope_theta=1e4,
            original_max_position_embeddings=32,
            max_position_embeddings=256,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0] * 8,
                "long_factor": [float(x) for x in np.geomspace(1, 40, 8)],
            },
        ),
    )
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.save_pretrained(tmp_path / "phi3")
    tiny_tokenizer().save_pretrained(tmp_path / "phi3")
    s = Session.load(str(tmp_path / "phi3"))
    ids = [(7 * i + 3) % 200 + 5 for i in range(40)]
    s.prefill(ids)
    p, D = 20, s.info.head_dim
    t = make_target(s, "logprob", position=p)
    clean = _logprob(_hooked_logits(ref, ids, 0, [], D)[p], t.token)
    short = _logprob(_hooked_logits(ref, ids[: p + 1], 0, [], D)[p], t.token)
    assert abs(clean - short) > 1e-3  # the prefix alone (short factors) would give another answer
    pos = slice(p, p + 1) if scope == "readout" else slice(None)
    eff = head_effects(s, t, "zero", scope)
    assert abs(eff.clean - clean) < 1e-5 and eff.reused
    for layer in range(s.info.n_layers):
        for h in range(s.info.n_heads):
            want = _logprob(_hooked_logits(ref, ids, layer, [h], D, positions=pos)[p], t.token) - clean
            assert abs(eff.query[layer, h] - want) < 1e-5, (scope, layer, h)
        for k in range(s.info.n_kv_heads):
            group = list(s.info.group(k))
            want = _logprob(_hooked_logits(ref, ids, layer, group, D, positions=pos)[p], t.token) - clean
            assert abs(eff.kv[layer, k] - want) < 1e-5, (scope, layer, k)
    # mean ablation: the mean of the head's output over 0..p of the whole sequence's forward
    mean = head_effects(s, t, "mean", scope, layers=[1], kv_side=False)
    z = {}
    hk = ref.model.layers[1].self_attn.o_proj.register_forward_pre_hook(
        lambda _m, a: z.setdefault("z", a[0][0].clone())
    )
    with torch.no_grad():
        ref(torch.tensor([ids]))
    hk.remove()
    avg = z["z"][: p + 1].mean(0)
    want = _logprob(_hooked_logits(ref, ids, 1, [3], D, value=avg, positions=pos)[p], t.token) - clean
    assert abs(mean.query[1, 3] - want) < 1e-5


@pytest.mark.parametrize(
    "family",
    ["llama", "qwen3", *[pytest.param(f, marks=pytest.mark.slow) for f in ("mistral", "gemma3_text")]],
)
def test_attribution_patching_chunked_mlp_equals_the_whole_mlp(family, tmp_path, monkeypatch):
    """Attribution patching runs each position-wise MLP's recompute and backward in chunks of positions
    (``_MLP_ROWS``): the products equal those of the MLP over every position at once (within 1e-6
    relative), both directions, both sites with a product per head, the runs from position 0 and after a
    shared prefix; the chunked path did run (every layer's MLP, forward and backward), its forwards as
    many as the whole MLP's where the layer has nothing after its MLP to re-run first."""
    from attnscope.core.analysis import head_effects
    from attnscope.core.analysis.head_effects import _parts, attribution_patching, make_target

    s, _ref = _load(family, tmp_path)
    parts = _parts(s)
    assert all(head_effects._position_wise(m) for m in parts.mlp)
    t = make_target(s, "logit_diff", token=9, other=14)
    real = head_effects._chunked_mlp
    calls: list = []

    def spy():
        fn = real()

        class Counted(fn):
            @staticmethod
            def forward(ctx, x, run, rows):
                calls.append(("forward", x.shape[1], rows))
                return fn.forward(ctx, x, run, rows)

            @staticmethod
            def backward(ctx, g):
                calls.append(("backward", g.shape[1], ctx.rows))
                return fn.backward(ctx, g)

        return Counted

    monkeypatch.setattr(head_effects, "_chunked_mlp", spy)
    mlp_class = type(parts.mlp[0])
    real_forward = mlp_class.forward
    ran = [0]  # positions through an MLP's forward

    def counting(self, x):
        ran[0] += x.shape[1]
        return real_forward(self, x)

    monkeypatch.setattr(mlp_class, "forward", counting)
    # nothing shared but the first token; a shared prefix of 4 (8 positions run). Mistral's window of 4
    # over 2 layers reaches back to position 5 only: its change is there, with the runs from position 0
    cases = ((5, False),) if family == "mistral" else ((1, True), (4, True))
    for changed, prefix in cases:
        corrupt = list(IDS)
        corrupt[changed] = 44
        if not prefix:
            monkeypatch.setattr(head_effects, "_shared_prefix", lambda *a: 0)
        for site in ("output", "kv"):
            monkeypatch.setattr(head_effects, "_MLP_ROWS", 10**9)
            ran[0] = 0
            whole = attribution_patching(s, corrupt, t, "everywhere", site=site)
            assert calls == []
            whole_ran, ran[0] = ran[0], 0
            monkeypatch.setattr(head_effects, "_MLP_ROWS", 4)
            chunked = attribution_patching(s, corrupt, t, "everywhere", site=site)
            # the MLP runs forward twice in all (the forward, the re-run taking the gradients), as whole;
            # Gemma's norm after the MLP has its layer re-run before the MLP's backward: once more there
            assert ran[0] > whole_ran if family == "gemma3_text" else ran[0] == whole_ran
            L = s.info.n_layers
            assert [c[0] for c in calls].count("forward") >= 2 * 2 * L  # forward and re-run, per direction
            assert [c[0] for c in calls].count("backward") == 2 * L
            assert all(c[2] == 4 and c[1] > 4 for c in calls)
            calls.clear()
            for a, b in ((chunked.clean, whole.clean), (chunked.corrupt, whole.corrupt)):
                assert abs(a - b) <= 1e-6 * abs(b)
            names = ("denoise_kv", "noise_kv") + (("denoise", "noise") if site == "output" else ())
            for name in names:
                a, b = getattr(chunked, name), getattr(whole, name)
                assert np.isfinite(a).all(), name
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * np.abs(b).max(), err_msg=name)


def test_position_wise_takes_dense_mlps_only():
    """Only a dense MLP (linear maps and parameter-free activations) is chunked over positions; a mixture
    of experts (a router and a list of experts) and a module with parameters of its own are not."""
    from attnscope.core.analysis.head_effects import _position_wise

    dense = torch.nn.Module()
    dense.up, dense.down, dense.act = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4), torch.nn.SiLU()
    assert _position_wise(dense)
    moe = torch.nn.Module()
    moe.gate = torch.nn.Linear(4, 2)
    moe.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    assert not _position_wise(moe)
    fused = torch.nn.Module()
    fused.gate = torch.nn.Linear(4, 2)
    fused.weight = torch.nn.Parameter(torch.zeros(2, 4, 4))
    assert not _position_wise(fused)
    normed = torch.nn.Module()
    normed.up, normed.down, normed.norm = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4), torch.nn.LayerNorm(8)
    assert not _position_wise(normed) and not _position_wise(None)


def test_readout_patching_walk_reports_progress_and_cancels(tmp_path):
    """Read-out patching's corrupted walk (no KV cache of that prompt) moves the progress layer by layer
    before its units' results are counted, never backwards; a cancel during the walk stops it, and the
    session and the next patch are as before."""
    import attnscope.core.analysis.head_effects as he
    from attnscope.core.errors import Cancelled

    s, _ = _load("llama", tmp_path)
    corrupt = list(IDS)
    corrupt[3] = 44
    t = he.make_target(s, "logit_diff", position=9, token=9, other=14)
    seen: list = []
    full = he.patch_heads(s, corrupt, t, "readout", progress=lambda i, n: seen.append((i, n)))
    n = seen[-1][1]
    units = n // 2  # both directions
    assert seen[-1] == (n, n) and [i for i, _ in seen] == sorted({i for i, _ in seen})  # monotonic
    # the walk's ticks (one per layer) come before any unit of the second direction is counted
    walk = [i for i, _ in seen if i <= units]
    assert len(walk) >= s.info.n_layers and walk[-1] == units
    calls = []
    with pytest.raises(Cancelled):
        he.patch_heads(s, corrupt, t, "readout", cancelled=lambda: calls.append(1) or len(calls) > 2)
    assert s.ids == IDS and s.backend.seq_len == len(IDS)
    again = he.patch_heads(s, corrupt, t, "readout")
    assert np.array_equal(again.denoise, full.denoise) and np.array_equal(again.noise, full.noise)
