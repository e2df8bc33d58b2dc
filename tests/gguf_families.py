"""Tiny GGUF files of every family AttnScope runs that transformers converts from GGUF (test helper).

:func:`write_family_gguf` writes a tiny random model of ``family`` (tests/tiny_models.py) with
``gguf.GGUFWriter``: metadata under the keys transformers' ``GGUF_CONFIG_MAPPING`` reads, tensor
names from gguf's own HF→GGUF name map, 2-D weights quantised with ``gguf.quants.quantize`` when a
``qtype`` is given. The tensors are written as the HF model holds them (no llama.cpp permutation):
these files test that AttnScope's streamed conversion equals transformers' own conversion of the
*same file*, not that a round trip restores the model (tiny_models.write_llama_gguf does that).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_models import add_rope_scaling, add_tiny_tokenizer

# family -> (GGUF architecture, gguf.MODEL_ARCH member name, general.name, config overrides)
GGUF_FAMILIES = {
    "llama": ("llama", "LLAMA", "tiny-llama", {}),
    "mistral": ("llama", "LLAMA", "mistral", {}),  # llama.cpp stores Mistral as llama, named "mistral"
    "qwen2": ("qwen2", "QWEN2", "tiny-qwen2", {}),
    "qwen3": ("qwen3", "QWEN3", "tiny-qwen3", {}),  # head_dim 32 != hidden / heads: key_length says so
    "phi3": ("phi3", "PHI3", "tiny-phi3", {}),
    "gemma3_text": ("gemma3", "GEMMA3", "tiny-gemma3", {}),
}


def family_model(family: str, seed: int = 0, overrides: dict | None = None):
    """The tiny random ``family`` model the GGUF of :func:`write_family_gguf` holds (float32, eager, eval);
    ``overrides``: config values on top of the family's."""
    import copy

    import torch
    from tiny_models import FAMILIES
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kw = FAMILIES[family]
    kw = dict(copy.deepcopy(kw), **GGUF_FAMILIES[family][3])
    kw.update(overrides or {})
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **kw)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def write_family_gguf(
    family: str,
    path: Path,
    qtype=None,
    seed: int = 0,
    name: str | None = None,
    model=None,
    as_converter: bool = False,
) -> Path:
    """Write the tiny ``family`` model (or ``model``, of that family) as a GGUF at ``path`` (``qtype``:
    a ggml type for 2-D weights; ``name``: ``general.name`` instead of the family's).

    ``as_converter``: store the tensors as llama.cpp's converter does (llama q/k rows permuted,
    Gemma norms ``w + 1``), so the file converts back to ``model`` itself."""
    import gguf
    from tiny_models import _permute

    arch, arch_enum, fam_name, _ = GGUF_FAMILIES[family]
    name = name or fam_name
    model = family_model(family, seed) if model is None else model
    cfg = model.config
    qtype = gguf.GGMLQuantizationType.F32 if qtype is None else qtype
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)  # llama.cpp's converter writes both whenever the config has head_dim
    w.add_value_length(head_dim)
    if arch == "gemma3" or (arch == "phi3" and getattr(cfg, "sliding_window", None)):
        w.add_sliding_window(cfg.sliding_window)  # Phi3MiniModel writes it too
    rope = getattr(cfg, "rope_parameters", None) or {}
    if "full_attention" in rope:  # Gemma 3: the global layers' RoPE is the file's; the local base is 10k
        rope = rope["full_attention"]
    w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    if "rope_type" in rope:
        import types

        ns = types.SimpleNamespace(
            rope_parameters=rope,
            max_position_embeddings=cfg.max_position_embeddings,
            original_max_position_embeddings=getattr(cfg, "original_max_position_embeddings", None),
        )
        rope_freqs = add_rope_scaling(w, ns, head_dim)
        if rope_freqs is not None:
            w.add_tensor("rope_freqs.weight", rope_freqs)
        if rope.get("rope_type") == "longrope":
            for which in ("long", "short"):
                w.add_tensor(
                    f"rope_factors_{which}.weight", np.array(rope[f"{which}_factor"], dtype=np.float32)
                )
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    add_tiny_tokenizer(w, cfg.vocab_size)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch_enum), cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        base = hf_name.removesuffix(".weight").removesuffix(".bias")
        g = names.get_name(base)
        if g is None:
            continue
        arr = np.ascontiguousarray(t.float().numpy())
        gname = g + hf_name[len(base) :]
        if as_converter and arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg.num_attention_heads if "attn_q" in gname else cfg.num_key_value_heads
            arr = np.ascontiguousarray(_permute(arr, heads))
        if as_converter and arch == "gemma3" and gname.endswith("norm.weight"):
            arr = arr + 1  # llama.cpp's Gemma converter; transformers' processor takes the 1 off again
        if arr.ndim >= 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def transformers_tensors(path: Path, dtype=None) -> dict:
    """transformers' own GGUF conversion of ``path``: ``load_gguf_checkpoint`` (the whole state dict,
    as ``from_pretrained(gguf_file=...)`` builds it), named for the model built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(Path(path).parent, gguf_file=Path(path).name)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    return load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=meta, torch_dtype=dtype)[
        "tensors"
    ]
