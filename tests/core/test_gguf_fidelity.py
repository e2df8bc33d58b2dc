"""A converted GGUF computes the maps of the model the file holds (what llama.cpp's loader reads is kept).

Each file is written as llama.cpp's converter writes it (tests/tiny_models.py ``write_llama_gguf``,
tests/gguf_families.py ``write_family_gguf(as_converter=True)``), converted and run by AttnScope;
its attention maps must equal transformers eager on the original Hugging Face model:

* RoPE scaling kept in the ``rope_freqs.weight`` tensor (Llama 3.1+'s llama3 scaling) and in the
  ``rope.scaling.*`` keys (linear, yarn), on torch and MLX;
* the head size from ``attention.key_length`` (Qwen3, Llama) and Gemma 3's ``1/sqrt(key_length)``;
* the pre-tokenizer the file names (``tokenizer.ggml.pre``), against each family's original
  tokenizer definition;
* every metadata key and tensor llama.cpp reads is used or listed as ignored
  (:mod:`attnscope.core.loading.gguf_keys`), and one that is neither is said in the load note;
* a cache entry made by an older conversion is converted again.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from gguf.constants import Keys
from gguf_families import GGUF_FAMILIES, family_model, write_family_gguf
from tiny_models import eager_reference, write_llama_gguf

IDS = [5 + (7 * i) % 250 for i in range(100)]  # 100 tokens, past original_max_position_embeddings=64
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 32.0,
    "original_max_position_embeddings": 64,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "rope_theta": 10000.0,
}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    from attnscope.core.loading.quiet import quiet_transformers

    quiet_transformers()


def _max_map_error(session_or_backend, ref_model, ids=IDS) -> float:
    """Largest |AttnScope map − transformers eager map| over every layer and head after a prefill of ``ids``."""
    be = getattr(session_or_backend, "backend", session_or_backend)
    be.forward(ids, all_logits=True)
    _, ref = eager_reference(ref_model, ids)
    return max(
        float(np.abs(be.trace.weights(layer, head) - ref[layer][head]).max())
        for layer in range(len(ref))
        for head in range(ref[layer].shape[0])
    )


def _load(path):
    from attnscope.core.session import Session

    return Session.load(str(path))


def _eager_with(model, **config):
    """The same weights under another config (e.g. without RoPE scaling): the maps a lost key gives."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    for k, v in config.items():
        setattr(cfg, k, v)
    other = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    other.load_state_dict(model.state_dict())
    return other


# -- RoPE scaling ------------------------------------------------------------------------------------
def test_llama3_rope_freqs_tensor_gives_the_original_maps(tmp_path):
    """The sample: llama3 scaling written only as rope_freqs.weight; 100 tokens; maps to 1e-4."""
    model = family_model("llama", overrides={"rope_parameters": dict(LLAMA3)})
    path = write_llama_gguf(model, tmp_path / "llama31.gguf")
    s = _load(path)
    assert s.info.load_note == ""
    cfg = json.loads((next((tmp_path / "cache" / "converted").iterdir()) / "config.json").read_text())
    assert cfg["rope_parameters"] == LLAMA3
    assert _max_map_error(s, model) < 1e-4
    # what the old conversion computed (unscaled RoPE) is far off: the test can tell
    unscaled = _eager_with(model, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    _, lost = eager_reference(unscaled, IDS)
    _, ref = eager_reference(model, IDS)
    assert max(np.abs(lost[i] - ref[i]).max() for i in range(2)) > 1e-3


@pytest.mark.parametrize(
    "params",
    [
        dict(factor=8.0, original_max_position_embeddings=32, low_freq_factor=1.0, high_freq_factor=4.0),
        dict(factor=16.0, original_max_position_embeddings=128, low_freq_factor=2.0, high_freq_factor=8.0),
        dict(factor=4.0, original_max_position_embeddings=100, low_freq_factor=1.0, high_freq_factor=2.0),
    ],
    ids=["llama3.1-like", "low2-high8", "one-middle-frequency"],
)
def test_llama3_parameters_are_recovered_for_other_settings(params, tmp_path):
    from attnscope.core.loading.gguf_config import llama3_factors, llama3_parameters

    rope = dict(params, rope_type="llama3", rope_theta=10000.0)
    factors = llama3_factors(rope, 10000.0, 16).astype(np.float32)
    got = llama3_parameters(factors, 10000.0, 16)
    assert got is not None and np.allclose(llama3_factors(got, 10000.0, 16), factors, rtol=2e-6)
    model = family_model("llama", overrides={"rope_parameters": rope})
    assert _max_map_error(_load(write_llama_gguf(model, tmp_path / "l.gguf")), model) < 1e-4


def test_divisors_that_are_no_llama3_curve_are_kept_exactly(tmp_path):
    """rope_freqs.weight of any shape: inv_freq_i = 1 / (f_i · theta^(2i/d)), as llama.cpp divides."""
    factors = [1.0, 1.5, 1.0, 3.0, 2.0, 7.0, 5.0, 11.0]  # not monotone: no llama3 parameters give this
    model = family_model("llama")
    path = write_llama_gguf(model, tmp_path / "odd.gguf", rope_freqs=np.array(factors))
    ref = _eager_with(
        model,
        rope_parameters={
            "rope_type": "longrope",
            "short_factor": factors,
            "long_factor": factors,
            "original_max_position_embeddings": 256,
            "attention_factor": 1.0,
            "rope_theta": 10000.0,
        },
    )
    assert _max_map_error(_load(path), ref) < 1e-4
    try:
        from attnscope.core.backends.mlx_backend import MlxBackend
    except ImportError:
        return
    assert _max_map_error(MlxBackend.load(str(path), dtype="float32"), ref) < 1e-4


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "rope_theta": 10000.0,
        },
    ],
    ids=["linear-2", "yarn-4"],
)
def test_rope_scaling_keys_are_kept(rope, tmp_path):
    model = family_model("llama", overrides={"rope_parameters": dict(rope)})
    s = _load(write_llama_gguf(model, tmp_path / "scaled.gguf"))
    assert _max_map_error(s, model) < 1e-4
    _, lost = eager_reference(
        _eager_with(model, rope_parameters={"rope_type": "default", "rope_theta": 1e4}), IDS
    )
    _, ref = eager_reference(model, IDS)
    assert max(np.abs(lost[i] - ref[i]).max() for i in range(2)) > 1e-3


def test_phi3_longrope_factor_tensors_and_window(tmp_path):
    """Phi-3 128k's longrope lives in rope_factors_long/short (+ original_context_length), its window
    in attention.sliding_window; 100 tokens cross the switch to the long factors at 64."""
    rope = {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [float(x) for x in np.geomspace(1, 40, 8)],
        "original_max_position_embeddings": 64,
        "rope_theta": 10000.0,
    }
    model = family_model(
        "phi3",
        overrides=dict(rope_parameters=rope, original_max_position_embeddings=64, sliding_window=48),
    )
    path = write_family_gguf("phi3", tmp_path / "phi3.gguf", model=model, as_converter=True)
    from attnscope.core.loading.gguf_config import gguf_config

    cfg, notes = gguf_config(path)
    assert notes == [] and cfg.rope_parameters["long_factor"] == pytest.approx(rope["long_factor"])
    assert (cfg.rope_parameters["original_max_position_embeddings"], cfg.sliding_window) == (64, 48)
    assert _max_map_error(_load(path), model) < 1e-4


def test_phi3_window_and_partial_rotary_are_read():
    from attnscope.core.loading.gguf_config import fix_config
    from attnscope.core.loading.gguf_meta import GGUFHeader
    from transformers import AutoConfig

    meta = {
        "general.architecture": "phi3",
        "phi3.embedding_length": 3072,
        "phi3.attention.head_count": 24,
        "phi3.rope.dimension_count": 96,
        "phi3.attention.sliding_window": 262144,
        "phi3.block_count": 32,
    }
    cfg = AutoConfig.for_model("phi3")
    fix_config(cfg, GGUFHeader(None, 3, meta, (), 0, 0))  # type: ignore[arg-type]
    assert (cfg.head_dim, cfg.sliding_window, cfg.rope_parameters["partial_rotary_factor"]) == (
        128,
        262144,
        0.75,
    )


def _gemma(**over):
    kw = dict(
        num_hidden_layers=6,  # llama.cpp's pattern: five sliding layers, then a global one
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=8,
        layer_types=None,
    )
    kw.update(over)
    model = family_model("gemma3_text", overrides=kw)
    assert model.config.layer_types[-1] == "full_attention"
    return model


def test_gemma3_head_size_64_scales_by_its_key_length(tmp_path):
    """Gemma 3 with head size 64: 1/sqrt(64), as llama.cpp scales, not transformers' 1/sqrt(256)."""
    model = _gemma()
    s = _load(write_family_gguf("gemma3_text", tmp_path / "g.gguf", model=model, as_converter=True))
    assert s.info.head_dim == 64
    assert _max_map_error(s, model) < 1e-4


def test_gemma3_linear_scaling_applies_to_the_global_layers(tmp_path):
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    model = _gemma(rope_parameters=rope)
    s = _load(write_family_gguf("gemma3_text", tmp_path / "g8.gguf", model=model, as_converter=True))
    assert _max_map_error(s, model) < 1e-4


def test_gemma3_27b_scale_rule():
    """llama.cpp: 1/sqrt(n_embd / n_head) for the 62-layer 27B, 1/sqrt(key_length) otherwise."""
    from attnscope.core.loading.gguf_config import fix_config
    from attnscope.core.loading.gguf_meta import GGUFHeader
    from transformers import AutoConfig

    for layers, want in ((62, 5376 // 32), (34, 128)):
        meta = {
            "general.architecture": "gemma3",
            "gemma3.embedding_length": 5376,
            "gemma3.attention.head_count": 32,
            "gemma3.attention.key_length": 128,
            "gemma3.attention.value_length": 128,
            "gemma3.block_count": layers,
        }
        cfg = AutoConfig.for_model("gemma3_text")
        fix_config(cfg, GGUFHeader(None, 3, meta, (), 0, 0))  # type: ignore[arg-type]
        assert (cfg.head_dim, cfg.query_pre_attn_scalar) == (128, want)


# -- head size ---------------------------------------------------------------------------------------
def test_qwen3_head_size_64_with_8_heads_over_1024(tmp_path):
    """The sample: refused with a shape mismatch before (transformers' Qwen3 default head_dim is 128)."""
    model = family_model(
        "qwen3",
        overrides=dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    )
    s = _load(write_family_gguf("qwen3", tmp_path / "q3.gguf", model=model, as_converter=True))
    assert (s.info.n_heads, s.info.head_dim) == (8, 64)
    assert _max_map_error(s, model, IDS[:40]) < 1e-4


def test_llama_head_size_other_than_hidden_over_heads(tmp_path):
    model = family_model("llama", overrides={"head_dim": 32})  # 4 heads of 32 over hidden 64
    s = _load(write_llama_gguf(model, tmp_path / "wide.gguf"))
    assert s.info.head_dim == 32
    assert _max_map_error(s, model) < 1e-4


def test_what_transformers_cannot_express_is_refused_in_one_line(tmp_path):
    from attnscope.core.errors import ModelLoadError

    model = family_model("llama")
    path = write_llama_gguf(model, tmp_path / "moe.gguf", extra={"llama.expert_count": 8})
    with pytest.raises(ModelLoadError, match="mixture of 8 experts"):
        _load(path)
    path = write_llama_gguf(model, tmp_path / "scale.gguf", extra={"llama.attention.scale": 0.5})
    with pytest.raises(ModelLoadError, match="attention scale 0.5"):
        _load(path)


# -- the MLX GGUF path -------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", [None, "Q8_0"], ids=["converted", "kept-packed"])
def test_mlx_keeps_llama3_rope_freqs(qtype, tmp_path):
    pytest.importorskip("mlx.core")
    import gguf
    from attnscope.core.backends.mlx_backend import MlxBackend

    model = family_model("llama", overrides={"rope_parameters": dict(LLAMA3)})
    q = getattr(gguf.GGMLQuantizationType, qtype) if qtype else None
    path = write_llama_gguf(model, tmp_path / "l3.gguf", qtype=q)
    mlx = MlxBackend.load(str(path), dtype="float32")
    if qtype is None:
        assert _max_map_error(mlx, model) < 1e-4
    else:  # against the torch path on the same quantised file (same dequantised weights)
        torch_s = _load(path)
        torch_s.backend.forward(IDS, all_logits=True)
        mlx.forward(IDS, all_logits=True)
        err = max(
            float(np.abs(mlx.trace.weights(layer, h) - torch_s.trace.weights(layer, h)).max())
            for layer in range(2)
            for h in range(4)
        )
        assert err < 1e-4


# -- the pre-tokenizer -------------------------------------------------------------------------------
SAMPLES = [
    "Total:   1234 items",
    "  1. First item\n  2. Second item\n    3. Third, 2024-01-31",
    "It's 3.14159   and    you'll see 1000000 TOKENS\n\n\tdone!!",
    "foo  \n  bar\r\nbaz",
]
# the pre-tokenizer of each family's published tokenizer.json / tokenizer class
_LLAMA3_JSON = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _reference_pre(name):
    from tokenizers import Regex, pre_tokenizers

    if name == "smollm":  # SmolLM2's tokenizer.json
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if name == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "qwen2":
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        split = PRETOKENIZE_REGEX
    else:  # llama-bpe: Meta's Llama 3 tokenizer.json
        split = _LLAMA3_JSON
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


@pytest.fixture(scope="module")
def smol_gguf_tokenizer():
    """transformers' own tokenizer of the embedded SmolLM2 GGUF (no pre-tokenizer fix)."""
    from attnscope.core.loading.quiet import quiet_transformers
    from attnscope.core.loading.resolve import default_gguf_path
    from transformers import AutoTokenizer

    quiet_transformers()
    p = default_gguf_path()
    return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def _with_pre(tok, pre):
    from attnscope.core.loading.gguf_tokenizer import fix_tokenizer

    t = copy.deepcopy(tok)
    notes = fix_tokenizer(t, {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre})
    return t, notes


@pytest.mark.slow
def test_smollm2_tokenizes_like_its_original_tokenizer(smol_gguf_tokenizer, tmp_path, monkeypatch):
    """The samples: the converted SmolLM2 (pre-tokenizer "smollm") against its tokenizer.json's pre-tokenizer."""
    from attnscope.core.loading.conversion_cache import convert_gguf
    from attnscope.core.loading.resolve import default_gguf_path
    from transformers import AutoTokenizer

    ref = copy.deepcopy(smol_gguf_tokenizer)
    ref.backend_tokenizer.pre_tokenizer = _reference_pre("smollm")
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "smol-cache"))
    converted = AutoTokenizer.from_pretrained(convert_gguf(default_gguf_path()))
    for text in SAMPLES:
        assert converted.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    # transformers' own GGUF tokenizer splits "   1234" otherwise: the fix is what makes it right
    assert smol_gguf_tokenizer.encode(SAMPLES[0]) != ref.encode(SAMPLES[0])


@pytest.mark.slow
@pytest.mark.parametrize("pre", ["smollm", "gpt-2", "qwen2", "llama-bpe"])
def test_each_named_pre_tokenizer_splits_as_the_family_does(smol_gguf_tokenizer, pre):
    ours, notes = _with_pre(smol_gguf_tokenizer, pre)
    assert notes == []
    ref = copy.deepcopy(smol_gguf_tokenizer)
    ref.backend_tokenizer.pre_tokenizer = _reference_pre(pre)
    for text in SAMPLES:
        assert ours.encode(text) == ref.encode(text), (pre, text)


@pytest.mark.slow
def test_the_named_pre_tokenizers_really_differ(smol_gguf_tokenizer):
    """The samples tell the pre-tokenizers apart, so the test above can fail (qwen2 and llama-bpe
    differ only in how digits group, which SmolLM2's one-digit tokens cannot show: next test)."""
    got = {
        pre: tuple(_with_pre(smol_gguf_tokenizer, pre)[0].encode("\n".join(SAMPLES)))
        for pre in ("smollm", "gpt-2", "qwen2")
    }
    assert len(set(got.values())) == 3


def test_digit_groups_of_qwen2_and_llama3():
    """Qwen2 splits every digit, Llama 3 groups up to three: against transformers' own Qwen2Tokenizer."""
    from tiny_models import tokenizer_vocab
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    vocab = {t: i for i, t in enumerate(tokenizer_vocab() + ["12", "123"])}
    merges = [("1", "2"), ("12", "3")]
    fast = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges)))
    fast.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=fast)
    qwen, _ = _with_pre(tok, "qwen2")
    llama, _ = _with_pre(tok, "llama-bpe")
    assert qwen.tokenize("x 1234") == Qwen2Tokenizer(vocab=vocab, merges=merges).tokenize("x 1234")
    assert qwen.tokenize("x 1234") == ["x", "Ġ", "1", "2", "3", "4"]
    assert llama.tokenize("x 1234") == ["x", "Ġ", "123", "4"]


def test_an_unknown_pre_tokenizer_is_said_once(tmp_path):
    from attnscope.core.loading.gguf_tokenizer import PRE_TOKENIZERS
    from tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    _t, notes = _with_pre(tok, "brand-new-bpe")
    assert len(notes) == 1 and "'brand-new-bpe'" in notes[0] and "may differ" in notes[0]
    assert _t.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()  # transformers' split kept
    assert "brand-new-bpe" not in PRE_TOKENIZERS
    # and it reaches the load report of a converted file
    from tiny_models import tiny_model

    path = write_llama_gguf(tiny_model("llama"), tmp_path / "t.gguf")
    raw = path.read_bytes().replace(b"gpt-2", b"gpt-9")  # same length: tokenizer.ggml.pre = "gpt-9"
    path.write_bytes(raw)
    note = _load(path).info.load_note
    assert "pre-tokenizer 'gpt-9'" in note and note.count("pre-tokenizer") == 1


def test_every_pre_tokenizer_in_the_table_builds():
    from attnscope.core.loading.gguf_tokenizer import PRE_TOKENIZERS, pre_tokenizer

    for spec in PRE_TOKENIZERS.values():
        pre_tokenizer(spec).pre_tokenize_str("Total:   1234 items\n  2. x")  # a bad regex raises here


# -- keys and tensors: used, or ignored with a reason ----------------------------------------------
# what llama.cpp's loader reads for these architectures (src/llama-model.cpp load_hparams: the
# common part, then the architecture's case; src/llama-vocab.cpp load; llama_model_chat_template)
_COMMON = [
    Keys.General.NAME,
    Keys.LLM.CONTEXT_LENGTH,
    Keys.LLM.EMBEDDING_LENGTH,
    Keys.LLM.EMBEDDING_LENGTH_OUT,
    Keys.LLM.BLOCK_COUNT,
    Keys.LLM.EXPERT_COUNT,
    Keys.LLM.EXPERT_USED_COUNT,
    Keys.LLM.EXPERT_GROUP_COUNT,
    Keys.LLM.EXPERT_GROUP_USED_COUNT,
    Keys.LLM.FEED_FORWARD_LENGTH,
    Keys.LLM.VOCAB_SIZE,
    Keys.LLM.POOLING_TYPE,
    Keys.Attention.HEAD_COUNT,
    Keys.Attention.HEAD_COUNT_KV,
    Keys.Attention.KEY_LENGTH,
    Keys.Attention.VALUE_LENGTH,
    Keys.Attention.CAUSAL,
    Keys.Rope.FREQ_BASE,
    Keys.Rope.DIMENSION_COUNT,
    Keys.Rope.DIMENSION_SECTIONS,
    Keys.Rope.SCALING_TYPE,
    Keys.Rope.SCALING_FACTOR,
    Keys.Rope.SCALING_ATTN_FACTOR,
    Keys.Rope.SCALING_ORIG_CTX_LEN,
    Keys.Rope.SCALING_FINETUNED,
    Keys.Rope.SCALING_YARN_LOG_MUL,
    Keys.Rope.SCALING_YARN_EXT_FACTOR,
    Keys.Rope.SCALING_YARN_ATTN_FACTOR,
    Keys.Rope.SCALING_YARN_BETA_FAST,
    Keys.Rope.SCALING_YARN_BETA_SLOW,
]
_VOCAB = [
    getattr(Keys.Tokenizer, k)
    for k in (
        "MODEL PRE TOKEN_TYPE_COUNT LIST SCORES TOKEN_TYPE MERGES BOS_ID EOS_ID EOT_ID EOM_ID UNK_ID "
        "SEP_ID PAD_ID MASK_ID FIM_PRE_ID FIM_SUF_ID FIM_MID_ID FIM_PAD_ID FIM_REP_ID FIM_SEP_ID PREFIX_ID "
        "SUFFIX_ID MIDDLE_ID ADD_BOS ADD_EOS ADD_SEP ADD_PREFIX REMOVE_EXTRA_WS PRECOMPILED_CHARSMAP "
        "CHAT_TEMPLATE"
    ).split()
]
LLAMA_CPP_READS = {
    "llama": _COMMON + [Keys.Attention.LAYERNORM_RMS_EPS, Keys.Attention.SCALE],
    "qwen2": _COMMON + [Keys.Attention.LAYERNORM_RMS_EPS],
    "qwen3": _COMMON + [Keys.Attention.LAYERNORM_RMS_EPS],
    "phi3": _COMMON + [Keys.Attention.LAYERNORM_RMS_EPS, Keys.Attention.SLIDING_WINDOW],
    "gemma3": _COMMON
    + [
        Keys.Attention.SLIDING_WINDOW,
        Keys.Attention.LAYERNORM_RMS_EPS,
        Keys.LLM.FINAL_LOGIT_SOFTCAPPING,
        Keys.Rope.FREQ_BASE_SWA,
    ],
}
_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3": "gemma3_text"}


@pytest.mark.parametrize("arch", sorted(LLAMA_CPP_READS))
def test_every_key_llama_cpp_reads_is_used_or_ignored_with_a_reason(arch):
    from attnscope.core.loading.gguf_keys import used_keys, why_ignored

    used = used_keys(arch, _MODEL_TYPE[arch])
    missing = [
        key
        for template in LLAMA_CPP_READS[arch] + _VOCAB
        if (key := template.format(arch=arch)) not in used and not why_ignored(key, arch)
    ]
    assert missing == []


def _plan(path):
    from attnscope.core.loading.gguf_convert import tensor_plan
    from attnscope.core.loading.gguf_keys import unread
    from attnscope.core.loading.gguf_meta import read_gguf_header

    _reader, _proc, name_map, config = tensor_plan(path)
    return unread(read_gguf_header(path), config.model_type, name_map)


@pytest.mark.parametrize("family", list(GGUF_FAMILIES))
def test_each_family_file_holds_nothing_unread(family, tmp_path):
    """Every key and tensor of each family's file is converted, read into the config, or ignored on purpose."""
    assert _plan(write_family_gguf(family, tmp_path / f"{family}.gguf")) == ([], [])


def test_llama_with_rope_freqs_holds_nothing_unread(tmp_path):
    model = family_model("llama", overrides={"rope_parameters": dict(LLAMA3)})
    assert _plan(write_llama_gguf(model, tmp_path / "l3.gguf")) == ([], [])


def test_a_key_or_tensor_nobody_reads_is_said_in_the_load_note(tmp_path):
    model = family_model("llama")
    path = write_llama_gguf(model, tmp_path / "extra.gguf", extra={"llama.attention.new_thing": 3})
    keys, tensors = _plan(path)
    assert keys == ["llama.attention.new_thing"] and tensors == []
    note = _load(path).info.load_note
    assert "llama.attention.new_thing" in note and "not reproduced" in note
    # a tensor llama.cpp's loader would refuse and the conversion would drop
    path = write_llama_gguf(
        model, tmp_path / "t.gguf", extra_tensors={"blk.0.attn_new_gate.weight": np.ones(64)}
    )
    assert _plan(path) == ([], ["blk.0.attn_new_gate.weight"])
    assert "tensors blk.0.attn_new_gate.weight" in _load(path).info.load_note


# -- the cache ---------------------------------------------------------------------------------------
def test_an_entry_made_by_the_older_conversion_is_converted_again(tmp_path):
    from attnscope.core.loading.conversion_cache import convert_gguf
    from attnscope.core.loading.gguf_convert import CONVERSION_VERSION, SOURCE, is_current

    model = family_model("llama", overrides={"rope_parameters": dict(LLAMA3)})
    path = write_llama_gguf(model, tmp_path / "l3.gguf")
    out = convert_gguf(path)
    assert is_current(out) and json.loads((out / SOURCE).read_text())["conversion"] == CONVERSION_VERSION
    # what the old conversion left: no version in the record, unscaled RoPE in config.json
    meta = json.loads((out / SOURCE).read_text())
    del meta["conversion"]
    (out / SOURCE).write_text(json.dumps(meta))
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (out / "config.json").write_text(json.dumps(cfg))
    said, notes = [], []
    assert convert_gguf(path, lambda m, f: said.append(m), notes=notes) == out
    assert any("out of date" in m for m in said)
    assert notes == ["the cached conversion of l3.gguf was made by an older AttnScope: converted again"]
    assert is_current(out) and json.loads((out / "config.json").read_text())["rope_parameters"] == LLAMA3
    said.clear()
    assert convert_gguf(path, lambda m, f: said.append(m)) == out and said == []  # current: used as is


def test_conversion_records_its_notes_and_repeats_them_on_every_load(tmp_path):
    from attnscope.core.loading.conversion_cache import convert_gguf

    path = write_llama_gguf(family_model("llama"), tmp_path / "x.gguf", extra={"llama.mystery": 1.5})
    first, again = [], []
    convert_gguf(path, notes=first)
    convert_gguf(path, notes=again)  # from the cache
    assert first == again and len(first) == 1 and "llama.mystery" in first[0]


def test_llama3_factor_formula_matches_transformers():
    """:func:`llama3_factors` is the divisor transformers' llama3 inv_freq implies (float32 roundoff)."""
    import torch
    from attnscope.core.loading.gguf_config import llama3_factors
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(
        hidden_size=64, num_attention_heads=4, rope_parameters=dict(LLAMA3), max_position_embeddings=256
    )
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    base = 1.0 / (10000.0 ** (np.arange(0, 16, 2) / 16))
    np.testing.assert_allclose(base / inv.double().numpy(), llama3_factors(LLAMA3, 10000.0, 16), rtol=1e-6)
    assert math.isclose(llama3_factors(LLAMA3, 10000.0, 16).max(), 32.0)
