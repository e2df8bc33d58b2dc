"""Hybrid decoders (docs/how-it-works.md "Hybrid models"): Qwen3-Next, Qwen3.5, Granite 4, Falcon-H1, LFM2.

A few softmax-attention layers among linear-attention (Gated DeltaNet), Mamba-2 or short-convolution
layers. For each family a tiny random model (tests/tiny_models.py, fixed seed) is loaded through
:meth:`Session.load` and fed as the app feeds it (a chunked prefill, then decode steps): every
attention layer's weights, found at its REAL layer index, equal transformers eager on the whole sequence
to 1e-5 and the logits eager's and SDPA's to 1e-4; a layer with no map refuses in one line; step back
followed by the same steps gives the same weights and logits (the recurrent/conv states restored from
their per-step copy); the analyses keep ``(n_layers, n_heads)`` with NaN rows for the layers with no map.
Every family runs on the CPU through transformers' torch fallbacks (no flash-linear-attention,
causal-conv1d or mamba-ssm installed here).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.errors import NoAttentionMap, UnsupportedModelError
from tiny_models import HYBRID_FAMILIES, HYBRID_MULTIMODAL, eager_reference, save_tiny, tiny_config

IDS = list(range(5, 31))  # 26 tokens: a prefill of 20 in chunks of 8 (8 + 8 + 4), then 6 decode steps
N_PREFILL = 20

# family -> (kinds by real layer index, attention layers)
EXPECTED = {
    "qwen3_next": (("linear_attention", "attention", "linear_attention", "attention"), (1, 3)),
    "qwen3_5_text": (("linear_attention", "linear_attention", "attention", "linear_attention"), (2,)),
    # the multimodal checkpoint (vision tower left unloaded): its language model is qwen3_5_text
    "qwen3_5": (("linear_attention", "linear_attention", "attention", "linear_attention"), (2,)),
    "granitemoehybrid": (("mamba", "attention", "mamba", "mamba"), (1,)),
    "falcon_h1": (("attention_mamba", "attention_mamba"), (0, 1)),
    "lfm2": (("conv", "attention", "conv", "conv"), (1,)),
}
NO_MAP_LINES = {
    "qwen3_next": "layer 0: linear attention, no map",
    "qwen3_5_text": "layer 0: linear attention, no map",
    "qwen3_5": "layer 0: linear attention, no map",
    "granitemoehybrid": "layer 0: Mamba (state space), no map",
    "lfm2": "layer 0: short convolution, no map",
}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


class _Folders(dict):
    """family -> (folder, the eager reference model), each saved the first time a test asks for it."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, fam):
        folder = self.factory.mktemp(fam)
        self[fam] = (folder, save_tiny(fam, folder))
        return self[fam]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return _Folders(tmp_path_factory)


# Each family's exactness test runs 3-15 s on a busy 2-core machine (the torch fallbacks of the
# recurrent scans are many small ops): LFM2, the quickest, runs by default; the others are slow tests.
FAMILY_PARAMS = [
    fam if fam == "lfm2" else pytest.param(fam, marks=pytest.mark.slow)
    for fam in sorted(HYBRID_FAMILIES) + list(HYBRID_MULTIMODAL)
]


def _run(be, ids=IDS, n_prefill=N_PREFILL):
    """Prefill ``ids[:n_prefill]`` then one decode step per remaining id; logits ``(len(ids), V)``."""
    first = be.forward(ids[:n_prefill], all_logits=True)
    return np.concatenate([first, *[be.forward([i], all_logits=True) for i in ids[n_prefill:]]])


def _weights(s):
    return {
        layer: np.stack([s.trace.weights(layer, h) for h in range(s.info.n_heads)])
        for layer in s.info.arch.attention_layers
    }


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_hybrid_family_matches_eager(family, folders, monkeypatch):
    import torch
    from attnscope.core.backends import torch_backend as tb
    from attnscope.core.session import Session

    monkeypatch.setattr(tb, "PREFILL_CHUNK", 8)  # the prefill runs as 8 + 8 + 4 tokens
    folder, ref = folders[family]
    s = Session.load(str(folder))
    kinds, att = EXPECTED[family]
    assert s.info.layer_kinds == kinds and s.info.arch.attention_layers == att
    assert "step back restores the recurrent/conv states" in s.info.load_note
    be = s.backend
    logits = _run(be)
    ref_logits, ref_att = eager_reference(ref, IDS)  # eager returns the attention layers' maps, in order
    assert np.abs(logits - ref_logits).max() < 1e-4
    ref.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            sdpa = ref(torch.tensor([IDS])).logits[0].numpy()
    finally:
        ref.set_attn_implementation("eager")
    assert np.abs(logits - sdpa).max() < 1e-4
    assert len(ref_att) == len(att)
    weights = _weights(s)
    for k, layer in enumerate(att):  # the trace is indexed by the real layer index
        np.testing.assert_allclose(weights[layer], ref_att[k], atol=1e-5, err_msg=f"{family} L{layer}")
    # a layer with no map refuses in one line
    no_map = [i for i in range(s.info.n_layers) if i not in att]
    for layer in no_map:
        with pytest.raises(NoAttentionMap) as e:
            s.trace.weights(layer, 0)
        assert str(e.value) == s.info.arch.no_map_line(layer) and "\n" not in str(e.value)
        with pytest.raises(NoAttentionMap):
            s.trace.lse(layer)
    if no_map:
        assert s.info.arch.no_map_line(no_map[0]) == NO_MAP_LINES[family]
    # summaries: (n_layers, n_heads) by real index, NaN rows where there is no map
    sinks = s.trace.sink_scores()
    assert sinks.shape == (s.info.n_layers, s.info.n_heads)
    assert np.isnan(sinks[no_map]).all() and np.isfinite(sinks[list(att)]).all()
    np.testing.assert_allclose(
        sinks[list(att)], np.stack([ref_att[k][:, 1:, 0].mean(-1) for k in range(len(att))]), atol=1e-5
    )
    # step back 3 tokens (a copy of the states is kept per step), then the same steps again
    be.truncate(len(IDS) - 3)
    again = np.concatenate([be.forward([i], all_logits=True) for i in IDS[-3:]])
    np.testing.assert_array_equal(again, logits[-3:])
    for layer, w in _weights(s).items():
        np.testing.assert_array_equal(w, weights[layer])
    assert not be.notices  # restored, nothing re-run
    if family in HYBRID_MULTIMODAL:  # the language model alone is loaded, said and counted
        from attnscope.core.loading.describe_model import describe_hf_folder

        assert "vision tower not loaded: text prompts only" in s.info.load_note
        assert not any("visual" in n or "vision" in n for n, _ in be.model.named_parameters())
        assert s.info.n_params == sum(p.numel() for p in be.model.parameters())
        e = describe_hf_folder(folder)
        assert e.supported and e.text_only and e.architecture == s.info.architecture == family
        assert 0 <= e.n_params - s.info.n_params <= sum(b.numel() for b in be.model.buffers())
        assert e.attention_kind == s.info.attention_kind == "GQA 4/2 · 1 of 4 layers attention"


def test_layer_kinds_from_configs():
    """transformers 5 calls every recurrent layer "linear_attention": the kind says which it is."""
    from attnscope.core.arch import ArchConfig, layer_kinds_of

    for fam, (kinds, att) in EXPECTED.items():
        cfg = tiny_config(fam).get_text_config()
        assert layer_kinds_of(cfg) == kinds, fam
        arch = ArchConfig(cfg.num_hidden_layers, 4, 2, 16, kinds)
        assert arch.attention_layers == att and arch.is_hybrid
    # a parsed config.json as checkpoints write it (the catalog reads those)
    assert layer_kinds_of(
        {
            "model_type": "granitemoehybrid",
            "num_hidden_layers": 3,
            "layer_types": ["mamba", "attention", "mamba"],
        }
    ) == ("mamba", "attention", "mamba")
    assert layer_kinds_of({"model_type": "falcon_h1", "num_hidden_layers": 2}) == ("attention_mamba",) * 2
    assert (
        layer_kinds_of(
            {"model_type": "qwen3_5", "text_config": {"num_hidden_layers": 4, "full_attention_interval": 2}}
        )
        == ("linear_attention", "attention") * 2
    )
    assert layer_kinds_of({"model_type": "llama", "num_hidden_layers": 2}) == ()
    arch = ArchConfig(4, 4, 2, 16, EXPECTED["qwen3_next"][0])
    assert arch.describe_layers() == "2 of 4 layers attention (2 linear attention)"
    assert (arch.map_layer_near(2, +1), arch.map_layer_near(2, -1), arch.map_layer_near(0)) == (3, 1, 1)
    falcon = ArchConfig(2, 4, 2, 16, EXPECTED["falcon_h1"][0])
    assert falcon.has_map(0) and falcon.has_state(0)
    assert falcon.describe_layers() == "2 of 2 layers attention (2 attention + Mamba in parallel)"
    assert not ArchConfig(3, 4, 2, 16).is_hybrid  # no layer_kinds: every layer attention
    assert not ArchConfig(3, 4, 2, 16, ("sliding_attention", "attention", "sliding_attention")).is_hybrid


def test_step_back_without_a_copy_re_runs_and_says_so(folders):
    """Back to a length no forward ended at: the nearest earlier copy is restored and the tokens up to
    there re-run (a notice says so); the logits of the steps after match the first run."""
    from attnscope.core.backends.recurrent_state import StateRecompute
    from attnscope.core.session import Session

    s = Session.load(str(folders["lfm2"][0]))
    be = s.backend
    logits = _run(be)
    be.truncate(12)  # inside the prefill of 20: no copy at 12
    assert isinstance(be.notices[-1], StateRecompute) and (
        be.notices[-1].restored,
        be.notices[-1].length,
    ) == (0, 12)
    assert "re-run" in str(be.notices[-1])
    again = be.forward(IDS[12:], all_logits=True)
    np.testing.assert_allclose(again, logits[12:], atol=1e-5)
    assert be.snapshots.lengths[-1] == len(IDS)


def test_a_copy_keeps_every_layer_field_but_kv():
    """A state copy is every attribute of the cache layer, not a list of known names: a field the
    library adds later (transformers 5.25's per-layer token count ``cumulative_length_linear``, updated
    in place, read by ``get_seq_length``) comes back as it was; the K/V tensors are left to the crop."""
    import torch
    from attnscope.core.backends.recurrent_state import StateSnapshots

    class Layer:
        def __init__(self):
            self.conv_states = {0: torch.ones(2, 3)}
            self.recurrent_states = {0: torch.full((2, 2), 5.0)}
            self.has_previous_state = {0: True}
            self.cumulative_length_linear = torch.tensor(7)
            self.history = [torch.zeros(2)]
            self.keys = torch.arange(4.0)
            self.values = torch.arange(4.0)

    layer = Layer()
    cache = type("Cache", (), {"layers": [layer]})()
    snaps = StateSnapshots()
    snaps.take(7, cache)
    layer.conv_states[0].add_(1)  # in place, as the model does
    layer.recurrent_states[0].mul_(2)
    layer.cumulative_length_linear.add_(3)
    layer.history[0].fill_(9)
    layer.has_previous_state[0] = False
    layer.keys = torch.arange(10.0)
    for _ in range(2):  # a second step back to the same length finds the copy unchanged
        snaps.restore(7, cache)
        assert int(layer.cumulative_length_linear) == 7
        assert layer.conv_states[0].tolist() == [[1.0] * 3] * 2
        assert layer.recurrent_states[0].tolist() == [[5.0] * 2] * 2
        assert layer.history[0].tolist() == [0.0, 0.0] and layer.has_previous_state == {0: True}
        assert layer.keys.shape == (10,)  # K/V untouched: TorchBackend._crop slices them
        layer.cumulative_length_linear.add_(1)
        layer.conv_states[0].add_(1)


def test_cancelled_prefill_restores_the_states(folders):
    """A prefill cancelled after its first chunk rolls the KV cache, the trace AND the recurrent/conv
    states back: the same prefill afterwards gives the same logits."""
    from attnscope.core.backends import torch_backend as tb
    from attnscope.core.errors import Cancelled
    from attnscope.core.session import Session

    s = Session.load(str(folders["lfm2"][0]))
    be = s.backend
    first = be.forward(IDS[:10], all_logits=True)
    calls = [0]

    def cancelled():
        calls[0] += 1
        return calls[0] > 1  # after the first chunk

    old = tb.PREFILL_CHUNK
    tb.PREFILL_CHUNK = 4
    try:
        with pytest.raises(Cancelled):
            be.forward(IDS[10:], cancelled=cancelled)
    finally:
        tb.PREFILL_CHUNK = old
    assert be.seq_len == 10 and s.trace.seq_len == 10
    rest = be.forward(IDS[10:], all_logits=True)
    s2 = Session.load(str(folders["lfm2"][0]))
    ref = s2.backend.forward(IDS, all_logits=True)
    np.testing.assert_allclose(np.concatenate([first, rest]), ref, atol=1e-5)


def test_kv_numbers_count_states_apart(folders):
    """The KV cache is the attention layers' K and V only; the other layers' recurrent/conv states are
    counted beside it (KV tab, status bar, Session.kv_cache_bytes)."""
    from attnscope.core.analysis.kv_live import kv_live
    from attnscope.core.session import Session

    s = Session.load(str(folders["qwen3_next"][0]))
    s.prefill("The cat sat on the mat.", chat_template=False)
    live = kv_live(s)
    T, per = s.seq_len, 2 * 2 * 16 * 4  # K + V, 2 KV heads of 16, float32
    assert live.kv_layers == (1, 3)
    assert live.layer_bytes.tolist() == [0, T * per, 0, T * per]
    assert live.total_bytes == live.formula_bytes == 2 * T * per == s.kv_cache_bytes()
    assert live.config.n_layers == 2
    assert (live.state_layer_bytes[[0, 2]] > 0).all() and (live.state_layer_bytes[[1, 3]] == 0).all()
    # a Gated DeltaNet layer: conv state (1, 2·2·8 + 4·8, 3) and recurrent state (1, 4, 8, 8), float32
    assert live.state_layer_bytes[0] == (64 * 4 + 4 * 8 * 8) * 4
    assert live.state_bytes == int(live.state_layer_bytes.sum())
    # Falcon-H1: every layer has both K + V and a Mamba state
    f = Session.load(str(folders["falcon_h1"][0]))
    f.prefill("The cat sat on the mat.", chat_template=False)
    lf = kv_live(f)
    assert (lf.layer_bytes > 0).all() and (lf.state_layer_bytes > 0).all() and lf.kv_layers == (0, 1)


@pytest.mark.slow
def test_analyses_follow_the_attention_layers(folders):
    """Compare, roles, GQA, thumbnails, exports and experiments on a hybrid model: exact on the attention
    layers, NaN (or left out) on the others, or refused in one line."""
    from attnscope.core.analysis import aggregate, compare_runs, experiments, gqa, roles
    from attnscope.core.analysis.sinks import session_sink_report
    from attnscope.core.io import batch_export
    from attnscope.core.session import Session

    folder = str(folders["qwen3_next"][0])
    a, b = Session.load(folder), Session.load(folder)
    a.prefill("The cat sat on the mat.", chat_template=False, all_logits=True)
    b.prefill("The dog sat on the mat.", chat_template=False, all_logits=True)
    with pytest.raises(NoAttentionMap, match="^layer 0: linear attention, no map$"):
        a.weights(0, 0)
    res = compare_runs.compare_sessions(a, b)
    assert np.isnan(res.js_mean[[0, 2]]).all() and np.isfinite(res.js_mean[[1, 3]]).all()
    assert {d.layer for d in res.ranked()} == {1, 3}
    table = roles.role_table(a, induction=False)
    assert table.no_map == (0, 2) and set(table.labels[0]) == {roles.NO_MAP}
    assert roles.NO_MAP not in set(table.labels[1].tolist())
    within, across, _ = gqa.layer_table(a)
    assert np.isnan(within[[0, 2]]).all() and np.isfinite(within[[1, 3]]).all()
    thumbs = aggregate.thumbnails(a, size=8)
    assert np.isnan(thumbs[[0, 2]]).all() and np.isfinite(thumbs[[1, 3]]).all()
    assert aggregate.heads_in(a.info, 1, 0, "all") == [(la, h) for la in (1, 3) for h in range(4)]
    assert batch_export.heads_in_scope(4, 4, None, a.info.arch) == [
        (la, h) for la in (1, 3) for h in range(4)
    ]
    with pytest.raises(NoAttentionMap, match="^layer 2: linear attention, no map$"):
        batch_export.heads_in_scope(4, 4, 2, a.info.arch)
    with pytest.raises(UnsupportedModelError, match="layer 0 is linear attention") as e:
        experiments.run_experiments(a, [experiments.Experiment("evict_first", k=2)])
    assert "\n" not in str(e.value)
    assert {x.kind for x in experiments.default_experiments(a.seq_len, a.info.arch)} == {
        "no_causal_prefill",
        "decode_top_left",
        "no_scale",
    }
    before = a.trace.weights(1, 0)
    out = experiments.run_experiments(a, [experiments.Experiment("no_scale")])
    assert out[0].kl_next > 0 and np.isfinite(out[0].kl_next)
    np.testing.assert_array_equal(a.trace.weights(1, 0), before)  # a separate cache: the session unchanged
    js = json.loads(json.dumps(session_sink_report(a).to_json(), allow_nan=False))  # no NaN in the JSON
    assert js["sink"][0] == [None] * 4 and None not in js["sink"][1]


def test_a_model_with_no_attention_layer_is_refused(tmp_path):
    """Nothing to inspect: a Granite 4 config of Mamba layers only is refused in one line."""
    from attnscope.core.session import Session
    from tiny_models import HYBRID_FAMILIES, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    fam = "granitemoehybrid"
    folder = tmp_path / fam
    cfg = tiny_config(fam)
    cfg.layer_types = ["linear_attention"] * HYBRID_FAMILIES[fam][1]["num_hidden_layers"]
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    with pytest.raises(
        UnsupportedModelError,
        match="has no softmax-attention layer|none of its modules is an attention class",
    ) as e:
        Session.load(str(folder))
    assert "\n" not in str(e.value)


def test_catalog_reads_a_hybrid_folder(folders):
    from attnscope.core.loading.describe_model import describe_hf_folder

    for fam in (*HYBRID_FAMILIES, *HYBRID_MULTIMODAL):
        folder, ref = folders[fam]
        e = describe_hf_folder(folder)
        assert e.supported, (fam, e.reason)
        assert e.n_layers == ref.config.get_text_config().num_hidden_layers


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5"])
def test_long_chunked_prefill_and_decode_exact(family, tmp_path, monkeypatch):
    """A 608-token prefill (chunks of 512 + 96) and 8 decode steps on a Qwen3.5 text model and on
    the language model of a Qwen3.5 multimodal checkpoint (partial, interleaved M-RoPE): every
    attention layer exact against eager, logits against eager and SDPA, and a step back of 4 steps
    followed by the same 4 gives the same weights."""
    import torch
    from attnscope.core.session import Session
    from tiny_models import tiny_model, tiny_tokenizer

    ref = tiny_model(
        family,
        seed=1,
        max_position_embeddings=1024,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    )
    folder = tmp_path / f"{family}_long"
    ref.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 270, size=616).tolist()
    s = Session.load(str(folder))
    logits = _run(s.backend, ids, 608)
    ref_logits, ref_att = eager_reference(ref, ids)
    assert np.abs(logits - ref_logits).max() < 1e-4
    ref.set_attn_implementation("sdpa")
    with torch.no_grad():
        sdpa = ref(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(logits - sdpa).max() < 1e-4
    weights = _weights(s)
    for k, layer in enumerate((1, 3)):
        np.testing.assert_allclose(weights[layer], ref_att[k], atol=1e-5)
    s.backend.truncate(612)
    again = np.concatenate([s.backend.forward([i], all_logits=True) for i in ids[612:]])
    np.testing.assert_array_equal(again, logits[612:])
    for layer, w in _weights(s).items():
        np.testing.assert_array_equal(w, weights[layer])
