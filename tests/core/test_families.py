"""Every decoder family AttnScope claims runs through its attention path exactly like transformers eager.

For each family a tiny random model is saved to a folder, loaded with :meth:`Session.load`
(AttnScope's registered attention), and fed in three ways the app uses: a prefill chunk, a second
chunk attending to the cached keys (L < S, the masked kernel path), and single-token decode steps.
Logits and every head's weights (from the Trace: exp(q·k·scale + mask − lse)) must equal
transformers eager on the whole sequence at once. Families whose attention needs something the
path does not do are refused with the exact reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.errors import UnsupportedModelError
from tiny_models import ALL_FAMILIES, FAMILIES, MULTIMODAL, eager_reference, save_tiny, tiny_config

IDS = list(range(5, 45))  # 40 tokens: 10x the sliding window of 4


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def language_model(ref, family: str):
    """The model whose forward is the reference: the whole checkpoint's, except Llama 4, whose
    ``Llama4ForConditionalGeneration.forward`` fails on text-only input in transformers 5.24
    (``MoeCausalLMOutputWithPast`` has no ``image_outputs``): its language model, which is all a
    text-only forward runs."""
    return ref.language_model if family == "llama4" else ref


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_family_matches_eager(family, tmp_path):
    from attnscope.core.loading.describe_model import describe_hf_folder
    from attnscope.core.session import Session

    folder = tmp_path / family
    ref = language_model(save_tiny(family, folder), family)
    s = Session.load(str(folder))
    be = s.backend
    logits = np.concatenate(
        [
            be.forward(IDS[:20], all_logits=True),  # prefill
            be.forward(IDS[20:37], all_logits=True),  # a second chunk over cached keys
            *[be.forward([i], all_logits=True) for i in IDS[37:]],  # decode steps
        ]
    )
    ref_logits, ref_att = eager_reference(ref, IDS)
    assert np.abs(logits - ref_logits).max() < 1e-4
    assert len(ref_att) == s.info.n_layers
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            w = s.trace.weights(layer, head)
            np.testing.assert_allclose(
                w, ref_att[layer][head], atol=1e-5, err_msg=f"{family} L{layer} H{head}"
            )
    # step back two tokens and run them again: the same weights
    before = [s.trace.weights(layer, 0) for layer in range(s.info.n_layers)]
    be.truncate(len(IDS) - 2)
    for i in IDS[-2:]:
        be.forward([i])
    for layer in range(s.info.n_layers):
        np.testing.assert_allclose(s.trace.weights(layer, 0), before[layer], atol=1e-6)
    # the catalog reads the same geometry from config.json alone
    e = describe_hf_folder(folder)
    assert e.supported, e.reason
    assert (e.n_layers, e.n_heads, e.n_kv_heads, e.head_dim) == (
        s.info.n_layers,
        s.info.n_heads,
        s.info.n_kv_heads,
        s.info.head_dim,
    )
    assert e.architecture == s.info.architecture == ref_architecture(family)
    # every expert counted; a multimodal checkpoint's language model only (what loads)
    assert s.info.n_params == sum(p.numel() for p in be.model.parameters())
    # the checkpoint may also hold persistent buffers (apertus' xIELU constants): counted by the catalog
    assert 0 <= e.n_params - s.info.n_params <= sum(b.numel() for b in be.model.buffers())
    assert e.text_only == (family in MULTIMODAL)
    assert e.group_size == s.info.n_heads // s.info.n_kv_heads
    assert e.attention_kind == s.info.attention_kind != ""


def ref_architecture(family: str) -> str:
    return (MULTIMODAL[family] if family in MULTIMODAL else FAMILIES[family])[0]


def test_sliding_window_is_applied():
    """Guard against a silently ignored window: mistral's window of 4 must change the weights."""
    ref = tiny_model_with_window(None), tiny_model_with_window(4)
    _, full = eager_reference(ref[0], IDS)
    _, windowed = eager_reference(ref[1], IDS)
    assert np.count_nonzero(windowed[0][0][10, :]) == 4  # row 10 sees keys 7..10 only
    assert np.count_nonzero(full[0][0][10, :]) == 11


def tiny_model_with_window(window):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_config("mistral")
    cfg.sliding_window = window
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def test_mistral_window_reaches_the_trace(tmp_path):
    from attnscope.core.session import Session

    save_tiny("mistral", tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.backend.forward(IDS[:12])
    w = s.trace.weights(0, 0)
    assert np.count_nonzero(w[10]) == 4
    assert s.trace.allowed(0)[10].tolist() == [j in (7, 8, 9, 10) for j in range(12)]


def test_tested_families_are_the_ones_tested():
    """README's supported list (support_rule.TESTED_FAMILIES) is exactly the families this file proves."""
    from attnscope.core.loading.support_rule import TESTED_FAMILIES
    from tiny_models import HYBRID_FAMILIES, HYBRID_MULTIMODAL

    assert TESTED_FAMILIES == (
        {ref_architecture(f) for f in ALL_FAMILIES} | set(HYBRID_FAMILIES) | set(HYBRID_MULTIMODAL)
    )


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("mamba", r"^mamba is not supported: its layers do not call transformers' attention interface"),
        ("rwkv", r"^rwkv is not supported: its layers do not call transformers' attention interface"),
        ("t5", r"^t5 is not supported: it is an encoder-decoder model"),
        ("bert", r"^bert is not supported: its attention is bidirectional \(an encoder\)"),
        ("xlnet", r"^xlnet is not supported: its layers do not call transformers' attention interface"),
        ("no_such_family", r"^architecture 'no_such_family' is not supported: transformers does not know it"),
        # multimodal wrappers that change their language model on text (PaliGemma attends both ways over
        # the prompt, Aya Vision scales the logits): untested wrappers are refused, not run causally
        ("paligemma", r"^paligemma is not supported: .*multimodal checkpoint only for the families tested"),
        ("aya_vision", r"^aya_vision is not supported: .*multimodal checkpoint only for the families tested"),
    ],
)
def test_rule_refuses_with_one_line(model_type, why):
    """Decided from transformers' model code (support_rule), not a list: the reason names what is missing."""
    from attnscope.core.loading.checks import check_architecture

    with pytest.raises(UnsupportedModelError, match=why) as e:
        check_architecture(model_type)
    assert "\n" not in str(e.value)


def test_rule_admits_from_the_code_not_a_list():
    """Families never named anywhere in AttnScope run when their attention calls the interface."""
    from attnscope.core.loading.support_rule import TESTED_FAMILIES, family_code, model_type_problem

    for mt in ("cohere", "starcoder2", "hunyuan_v1_dense"):
        assert mt not in TESTED_FAMILIES
        assert model_type_problem(mt) is None, mt
        code = family_code(mt)
        assert not isinstance(code, str) and code.attention_classes and code.supports_backend


def test_rule_without_model_source_admits_tested_families(monkeypatch):
    """A packaged app keeps transformers as bytecode: no source to read, so the tested families run
    and any other is refused saying why."""
    from attnscope.core.loading import support_rule

    def no_source(path):
        raise FileNotFoundError(path)

    support_rule.family_code.cache_clear()
    support_rule.model_type_problem.cache_clear()
    monkeypatch.setattr(support_rule, "_read_source", no_source)
    try:
        assert support_rule.model_type_problem("qwen3_moe") is None
        assert support_rule.model_type_problem("gemma3") is None
        why = support_rule.model_type_problem("cohere")
        assert why is not None and why.startswith("cohere is not supported: no model source")
    finally:
        monkeypatch.undo()
        support_rule.family_code.cache_clear()
        support_rule.model_type_problem.cache_clear()


def test_multimodal_language_model_only(tmp_path):
    """A Gemma 3 checkpoint with its vision tower: the language model loads alone and says so."""
    from attnscope.core.session import Session

    save_tiny("gemma3", tmp_path / "g3")
    s = Session.load(str(tmp_path / "g3"))
    assert "vision tower not loaded: text prompts only" in s.info.load_note
    assert type(s.backend.model).__name__ == "Gemma3ForCausalLM"
    assert not any("vision" in n for n, _ in s.backend.model.named_parameters())
