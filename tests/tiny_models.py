"""Tiny random models of each family, and the on-disk layouts users keep them in (test helpers).

* :func:`save_tiny` writes a random decoder (64 hidden, 2-3 layers, 4 query heads / 2 KV heads)
  with a 262-token byte-level BPE tokenizer into a folder, as transformers' ``save_pretrained`` does.
* :func:`write_llama_gguf` writes a llama model as a GGUF with ``gguf.GGUFWriter``, tensor names
  from gguf's own HF→GGUF name map and q/k rows permuted as llama.cpp's converter does (transformers
  reverses that permutation on load), so a float32 GGUF converts back to the very same weights;
  head size and RoPE scaling as the converter writes them (:func:`add_rope_scaling`).
* :func:`hf_cache_repo`, :func:`lmstudio_file`, :func:`ollama_model` lay files out as the Hugging
  Face hub cache, LM Studio and Ollama keep them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

COMMON = dict(
    vocab_size=272,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)

# family -> (transformers model_type, config kwargs). Each is the smallest config that exercises what
# makes the family different: mistral's sliding window (4, far shorter than the test prompts), qwen2's
# per-layer windows, qwen3's QK-norm and explicit head_dim, gpt2's Conv1D + scale by 1/(layer+1),
# gemma3's alternating local/global layers and query_pre_attn_scalar scaling.
FAMILIES = {
    "llama": ("llama", dict(COMMON)),
    "mistral": ("mistral", dict(COMMON, sliding_window=4)),
    "qwen2": (
        "qwen2",
        dict(COMMON, num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ),
    "qwen3": ("qwen3", dict(COMMON, head_dim=32)),
    "phi3": ("phi3", dict(COMMON)),
    "gpt2": (
        "gpt2",
        dict(
            vocab_size=272,
            n_embd=64,
            n_layer=3,
            n_head=4,
            n_positions=256,
            bos_token_id=1,
            eos_token_id=2,
            scale_attn_by_inverse_layer_idx=True,
        ),
    ),
    "olmo": ("olmo", dict(COMMON)),
    "olmo2": ("olmo2", dict(COMMON)),  # QK-norm over the whole projection, before the head split
    "granite": (
        "granite",
        dict(
            COMMON,
            attention_multiplier=0.3,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            logits_scaling=4.0,
        ),
    ),  # scale != 1/sqrt(d)
    "smollm3": ("smollm3", dict(COMMON, num_hidden_layers=4, no_rope_layer_interval=2)),  # NoPE layers
    "gemma3_text": (
        "gemma3_text",
        dict(
            COMMON,
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=4,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ),
    # gemma2: attention-logit soft-capping with a cap small enough to bend these random scores
    # (cap·tanh(s/cap) moves them by up to ~30 %: tests/core/test_softcap.py checks it bites), plus
    # Gemma 2's alternating windows and query_pre_attn_scalar.
    "gemma2": (
        "gemma2",
        dict(
            COMMON,
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=4,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            initializer_range=0.2,
        ),
    ),
    # gpt_oss: learned attention sinks (one logit per query head, spread by initializer_range),
    # alternating 4-key windows, a 4-expert top-2 mixture of experts, attention biases.
    "gpt_oss": (
        "gpt_oss",
        dict(
            COMMON,
            head_dim=16,
            sliding_window=4,
            num_local_experts=4,
            num_experts_per_tok=2,
            initializer_range=0.15,  # sinks ±0.2, rows' sink share from 1e-5 to 0.9
            # gpt-oss's YaRN, with the factor matching max_position_embeddings / original (256 / 8)
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=8,
            ),
        ),
    ),
    # dense newcomers (Llama-like GQA decoders with their own norms, windows and RoPE layouts)
    "olmo3": (
        "olmo3",
        dict(
            COMMON,
            num_hidden_layers=3,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
    ),
    "exaone4": (
        "exaone4",
        dict(
            COMMON,
            num_hidden_layers=4,
            sliding_window=4,
            sliding_window_pattern=4,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
        ),
    ),
    "seed_oss": ("seed_oss", dict(COMMON, head_dim=16, attention_bias=True)),
    "apertus": ("apertus", dict(COMMON)),  # xIELU activation, QK-norm
    "ernie4_5": ("ernie4_5", dict(COMMON, head_dim=16)),
    "glm4": ("glm4", dict(COMMON, head_dim=16, partial_rotary_factor=0.5)),  # RoPE on half of each head
    # mixture-of-experts: attention unchanged, the router picks experts per token
    "mixtral": ("mixtral", dict(COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    "qwen3_moe": (
        "qwen3_moe",
        dict(COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    ),
    "olmoe": ("olmoe", dict(COMMON, num_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (
        "qwen2_moe",
        dict(
            COMMON,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
    ),
    # multi-head latent attention: keys and values rebuilt from a compressed latent, value head size
    # (20) differs from the key head size (16 + 8 with the decoupled RoPE part)
    "deepseek_v2": (
        "deepseek_v2",
        dict(
            COMMON,
            num_key_value_heads=4,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=20,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
    ),
    "deepseek_v3": (
        "deepseek_v3",
        dict(
            COMMON,
            num_key_value_heads=4,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=20,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
    ),
    "glm4_moe_lite": (
        "glm4_moe_lite",
        dict(
            COMMON,
            num_key_value_heads=4,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=20,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
    ),
}

# Hybrid decoders (docs/how-it-works.md "Hybrid models"): a few softmax-attention layers among linear-attention
# (Gated DeltaNet), Mamba-2 or short-convolution layers, attention layers not at index 0 so that real and
# attention-only indices differ. Each runs on the CPU through transformers' torch fallbacks (no
# flash-linear-attention, causal-conv1d or mamba-ssm); chunk sizes small so the chunked scans see
# several chunks and a partial one.
_LINEAR = dict(
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
HYBRID_FAMILIES = {
    "qwen3_next": (
        "qwen3_next",
        dict(
            COMMON,
            **_LINEAR,
            num_hidden_layers=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        ),
    ),
    "qwen3_5_text": (
        "qwen3_5_text",
        dict(
            COMMON,
            **_LINEAR,
            num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        ),
    ),
    "granitemoehybrid": (
        "granitemoehybrid",
        dict(
            COMMON,
            num_hidden_layers=4,
            mamba_n_heads=4,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_chunk_size=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=32,
            position_embedding_type="rope",
            attention_multiplier=0.3,
            layer_types=["mamba", "attention", "mamba", "mamba"],
        ),
    ),
    "falcon_h1": (
        "falcon_h1",
        dict(
            COMMON,
            head_dim=16,
            mamba_d_ssm=64,
            mamba_n_heads=4,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_chunk_size=8,
            key_multiplier=0.5,
        ),
    ),  # attention and a Mamba-2 mixer side by side in every layer
    "lfm2": (
        "lfm2",
        dict(
            COMMON,
            num_hidden_layers=4,
            conv_L_cache=3,
            layer_types=["conv", "full_attention", "conv", "conv"],
        ),
    ),
}

# multimodal checkpoints: (model_type, text_config kwargs, vision_config kwargs, top-level kwargs).
# AttnScope loads the language model only (attnscope.core.loading.text_only); the vision tower is
# random and tiny here, and never run.
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
MULTIMODAL = {
    "gemma3": (
        "gemma3",
        dict(FAMILIES["gemma3_text"][1]),
        dict(_VISION, image_size=28, patch_size=14),
        dict(mm_tokens_per_image=4, image_token_index=270, boi_token_index=268, eoi_token_index=269),
    ),
    "mistral3": (
        "mistral3",
        dict(COMMON, head_dim=16, sliding_window=None),
        dict(_VISION, head_dim=16, image_size=28, patch_size=14),
        dict(image_token_index=270, spatial_merge_size=1),
    ),
    "qwen2_5_vl": (
        "qwen2_5_vl",
        dict(
            COMMON,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        ),
        dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64),
        dict(image_token_id=270, video_token_id=271, vision_start_token_id=268),
    ),
    "qwen3_vl": (
        "qwen3_vl",
        dict(
            COMMON,
            head_dim=16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        ),
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            deepstack_visual_indexes=[],
        ),
        dict(image_token_id=270, video_token_id=271, vision_start_token_id=268),
    ),
    # LLaVA-1.5 style (a Llama language model beside a CLIP tower), InternVL (Qwen2 language model)
    "llava": ("llava", dict(COMMON, head_dim=16), dict(_VISION), dict(image_token_index=270)),
    "internvl": ("internvl", dict(COMMON), dict(_VISION), dict(image_token_id=270)),
    # Qwen3-VL-MoE: a mixture-of-experts Qwen3-VL language model (interleaved M-RoPE)
    "qwen3_vl_moe": (
        "qwen3_vl_moe",
        dict(
            COMMON,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
        ),
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            deepstack_visual_indexes=[],
        ),
        dict(image_token_id=270, video_token_id=271, vision_start_token_id=268),
    ),
    # Qwen3.5 as published (Qwen/Qwen3.5-*): a hybrid language model (Gated DeltaNet layers among
    # gated softmax-attention ones, partial M-RoPE, interleaved sections) beside a vision tower
    "qwen3_5": (
        "qwen3_5",
        dict(
            HYBRID_FAMILIES["qwen3_5_text"][1],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        ),
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            num_position_embeddings=16,
            patch_size=14,
        ),
        dict(image_token_id=270, video_token_id=271, vision_start_token_id=268, vision_end_token_id=269),
    ),
    "llama4": (
        "llama4",
        dict(
            COMMON,
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size_mlp=128,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            no_rope_layer_interval=4,
            attention_chunk_size=1024,
        ),
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
            vision_output_dim=32,
            projector_input_dim=32,
            projector_output_dim=64,
        ),
        dict(image_token_index=270),
    ),
}

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>"]


MERGES = [("Ġ", "t")]  # one merge, so that GGUF readers find a merges list


def tokenizer_vocab() -> list[str]:
    """5 special tokens, the 256 byte-level symbols, then one merged token: 262 tokens."""
    from tokenizers import pre_tokenizers

    return SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m) for m in MERGES]


def tiny_tokenizer():
    """A byte-level BPE tokenizer (every byte one token, plus " t"), as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(tokenizer_vocab())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


#: multimodal checkpoints whose language model is hybrid: tested by tests/core/test_hybrid.py (by real layer
#: index, the other layers marked), not by tests/core/test_families.py's every-layer comparison
HYBRID_MULTIMODAL = ("qwen3_5",)
ALL_FAMILIES = sorted({**FAMILIES, **MULTIMODAL}.keys() - set(HYBRID_MULTIMODAL))


def tiny_config(family: str, **overrides):
    """The family's tiny config; ``overrides`` replace its (text config's) fields."""
    from transformers import AutoConfig

    if family in MULTIMODAL:
        model_type, text, vision, top = copy.deepcopy(MULTIMODAL[family])
        return AutoConfig.for_model(
            model_type, text_config={**text, **overrides}, vision_config=vision, **top
        )
    model_type, kw = FAMILIES[family] if family in FAMILIES else HYBRID_FAMILIES[family]
    return AutoConfig.for_model(model_type, **{**copy.deepcopy(kw), **overrides})


def tiny_model(family: str, seed: int = 0, attn: str = "eager", **overrides):
    """A random model of ``family`` in eval mode, float32 (a multimodal one whole: vision tower too,
    as its checkpoint is saved)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    torch.manual_seed(seed)
    auto = AutoModelForImageTextToText if family in MULTIMODAL else AutoModelForCausalLM
    return auto.from_config(tiny_config(family, **overrides), attn_implementation=attn).eval()


def save_tiny(family: str, folder: Path, seed: int = 0, **overrides):
    """Save a random ``family`` model + tokenizer into ``folder`` (safetensors); return the eager model."""
    model = tiny_model(family, seed, **overrides)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def eager_reference(model, ids: list[int]):
    """transformers eager on the whole sequence: ``(logits (T, V), [per layer (H, T, T)])`` as numpy float32."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return out.logits[0].float().numpy(), [a[0].float().numpy() for a in out.attentions]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp ``LlamaModel.permute``: HF's rotate-half q/k rows -> GGML's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_tiny_tokenizer(w, vocab_size: int) -> None:
    """Write the tiny byte-level BPE tokenizer (padded with ``<extra_i>`` to ``vocab_size``) into GGUFWriter ``w``."""
    toks = tokenizer_vocab() + [f"<extra_{i}>" for i in range(vocab_size - len(tokenizer_vocab()))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # tiny_tokenizer's split: GPT-2's byte-level pattern
    w.add_token_list(toks)
    w.add_token_types([3 if t in SPECIALS or t.startswith("<extra_") else 1 for t in toks])
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)


def add_rope_scaling(w, cfg, head_dim: int) -> np.ndarray | None:
    """Write ``cfg``'s RoPE scaling as llama.cpp's converter does (``convert_hf_to_gguf.py``):
    linear / yarn as ``rope.scaling.*`` keys; llama3 as no key at all, only the per-frequency divisors
    it returns for the ``rope_freqs.weight`` tensor (computed with the converter's formula from the
    model's own ``rope_parameters``)."""
    import math

    import gguf

    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    kind = rp.get("rope_type", "default")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rp["factor"]))
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rp["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rp["original_max_position_embeddings"]))
        for key in ("beta_fast", "beta_slow"):
            if rp.get(key) is not None:
                getattr(w, f"add_rope_scaling_yarn_{key}")(float(rp[key]))
    elif kind == "longrope":  # Phi3MiniModel: the two factor sets are tensors (the caller adds them)
        orig = int(rp.get("original_max_position_embeddings") or cfg.original_max_position_embeddings)
        scale = cfg.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(
            1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(orig))
        )
        w.add_rope_scaling_orig_ctx_len(orig)
    elif kind == "llama3":
        base = float(rp["rope_theta"])
        freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        out = []
        for freq in freqs:
            wavelen = 2 * math.pi / freq
            if wavelen < high_wl:
                out.append(1)
            elif wavelen > low_wl:
                out.append(factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append(1 / ((1 - smooth) / factor + smooth))
        return np.array(out, dtype=np.float32)
    return None


def write_llama_gguf(
    model,
    path: Path,
    qtype=None,
    name: str = "tiny-llama",
    unknown_type_tensor: str | None = None,
    tokenizer: bool = True,
    rope_freqs: np.ndarray | None = None,
    extra: dict | None = None,
    extra_tensors: dict | None = None,
) -> Path:
    """Write a llama ``model`` as GGUF at ``path``.

    ``qtype``: a ``gguf.GGMLQuantizationType`` for 2-D weights (default F32; 1-D norms stay F32).
    ``unknown_type_tensor``: give that tensor the ggml type id 99, which no gguf release defines.
    ``rope_freqs``: a ``rope_freqs.weight`` tensor to write instead of the one the config implies.
    ``extra``: more metadata, ``{key: value}`` (ints as uint32, floats as float32, strings);
    ``extra_tensors``: more tensors, ``{gguf name: float32 array}``.
    """
    import gguf

    cfg = model.config
    qtype = gguf.GGMLQuantizationType.F32 if qtype is None else qtype
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)  # the converter writes both whenever the config has head_dim
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    implied = add_rope_scaling(w, cfg, head_dim)
    rope_freqs = implied if rope_freqs is None else np.asarray(rope_freqs, dtype=np.float32)
    for key, value in (extra or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, str(value))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(
        gguf.LlamaFileType.ALL_F32
        if qtype == gguf.GGMLQuantizationType.F32
        else gguf.LlamaFileType.MOSTLY_Q8_0
    )
    if tokenizer:
        add_tiny_tokenizer(w, cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    for gname, arr in (extra_tensors or {}).items():
        w.add_tensor(gname, np.ascontiguousarray(arr, dtype=np.float32))
    for hf_name, t in model.state_dict().items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        arr = t.float().numpy()
        base = hf_name.removesuffix(".weight").removesuffix(".bias")
        suffix = hf_name[len(base) :]
        g = names.get_name(base)
        assert g is not None, hf_name
        if g.endswith("attn_q"):
            arr = _permute(arr, cfg.num_attention_heads)
        elif g.endswith("attn_k"):
            arr = _permute(arr, cfg.num_key_value_heads)
        gname = g + suffix
        if arr.ndim >= 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, gguf.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if unknown_type_tensor is not None:
        set_tensor_type(path, unknown_type_tensor, 99)
    return path


def set_tensor_type(path: Path, tensor: str, type_id: int) -> None:
    """Overwrite one tensor's ggml type id in a GGUF's tensor table, in place."""
    from attnscope.core.loading.gguf_meta import read_gguf_header

    h = read_gguf_header(path)
    raw = bytearray(path.read_bytes())
    key = tensor.encode()
    # tensor info: u64 len, name, u32 n_dims, u64 dims[n], u32 type, u64 offset
    i = raw.index(len(key).to_bytes(8, "little") + key)
    n_dims = int.from_bytes(raw[i + 8 + len(key) : i + 12 + len(key)], "little")
    pos = i + 12 + len(key) + 8 * n_dims
    raw[pos : pos + 4] = type_id.to_bytes(4, "little")
    assert any(t.name == tensor for t in h.tensors)
    path.write_bytes(bytes(raw))


def hf_cache_repo(
    cache: Path, repo_id: str, src: Path, revision: str = "0123456789abcdef0123456789abcdef01234567"
) -> Path:
    """Copy the files of ``src`` into a hub-cache repo laid out as huggingface_hub does; return the snapshot.

    ``models--org--name/blobs/<sha256>`` holds each file once, ``snapshots/<rev>/<file>`` links to
    it (relative symlink) and ``refs/main`` names the revision.
    """
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if not f.is_file():
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / digest)
    (repo / "refs" / "main").write_text(revision)
    return snap


def lmstudio_file(root: Path, publisher: str, repo: str, gguf_file: Path) -> Path:
    """Place a GGUF as LM Studio does: ``<root>/<publisher>/<repo>/<file>.gguf``."""
    d = root / publisher / repo
    d.mkdir(parents=True, exist_ok=True)
    out = d / gguf_file.name
    shutil.copyfile(gguf_file, out)
    return out


def ollama_model(
    root: Path,
    model: str,
    tag: str,
    gguf_file: Path,
    namespace: str = "library",
    host: str = "registry.ollama.ai",
) -> Path:
    """Store a GGUF as Ollama does: a manifest whose model layer names ``blobs/sha256-<hex>``; return the blob."""
    data = gguf_file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    params = b'{"temperature":0.7}'
    pdig = hashlib.sha256(params).hexdigest()
    (root / "blobs" / f"sha256-{pdig}").write_bytes(params)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": "sha256:" + "0" * 64,
            "size": 2,
        },
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": len(data),
            },
            {
                "mediaType": "application/vnd.ollama.image.params",
                "digest": f"sha256:{pdig}",
                "size": len(params),
            },
        ],
    }
    m = root / "manifests" / host / namespace / model / tag
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(json.dumps(manifest))
    return blob
