"""Synthetic real-size checkpoints: published configs with random weights (test/bench tool, not shipped).

    .venv/bin/python tests/make_synthetic.py --model llama-3.2-1b --out /tmp/synth [--formats bf16,q8_0,q4_0] [--seed 0]

writes, for one of :data:`CONFIGS` (Llama-3.2-1B, Llama-3.1-8B, Qwen2.5-7B, Mistral-7B-v0.3,
Gemma-3-1B, gpt-oss-20b (learned sinks + MoE); Qwen3-30B-A3B (MoE), Gemma-3-12B (multimodal: vision tower + language model),
DeepSeek-V2-Lite (MLA + MoE), bf16 only: their published ``config.json`` values, written out below;
``--layers N`` keeps the first N decoder layers, every tensor at its published shape):

* ``bf16``: bfloat16 safetensors (≤ 2 GB shards + index) in a Hugging Face hub cache layout,
  ``<out>/hub/models--synthetic--<Name>/snapshots/<rev>/`` (with ``refs/main``), so
  ``HF_HUB_CACHE=<out>/hub`` makes AttnScope's catalog list it;
* ``q8_0``, ``q4_0``: ``<out>/gguf/<Name>-Q8_0.gguf`` / ``-Q4_0.gguf`` (``gguf.GGUFWriter``; 2-D
  weights quantised with ``gguf.quants.quantize``, norms F32; llama/mistral q/k rows permuted as
  llama.cpp's converter does and Gemma norms stored as ``w + 1``, so transformers' loader gives
  back the same weights as the bf16 folder, up to quantisation).

Weights: ``N(0, 0.02²)`` (norms 1), drawn per tensor and per 64 Mi-element block from a generator
seeded with ``(seed, tensor index, block)``: the same bytes on every run and machine, and never
more than one block in float32 in memory, so writing an 8B model needs little RAM (the GGUF
writer streams tensor by tensor; safetensors shards are built one at a time).

Tokenizer: the embedded SmolLM2's byte-level BPE (49,152 tokens), copied as is. ``vocab_size``
stays the published one (128,256 for Llama 3, 152,064 Qwen2.5, 32,768 Mistral v0.3, 262,144
Gemma 3), so parameter counts, memory and lm_head cost are the real model's; ids the tokenizer
does not have decode to nothing (text prompts only produce ids < 49,152).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REVISION = "5eed000000000000000000000000000000000000"
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Published config.json values (architecture-relevant keys), by model.
CONFIGS: dict[str, dict] = {
    "llama-3.2-1b": dict(
        _name="Llama-3.2-1B",
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        tie_word_embeddings=True,
        vocab_size=128256,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "llama-3.1-8b": dict(
        _name="Llama-3.1-8B",
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(_LLAMA3_ROPE, factor=8.0),
        tie_word_embeddings=False,
        vocab_size=128256,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "qwen2.5-7b": dict(
        _name="Qwen2.5-7B",
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        sliding_window=131072,
        use_sliding_window=False,
        max_window_layers=28,
        tie_word_embeddings=False,
        vocab_size=152064,
        hidden_act="silu",
        bos_token_id=151643,
        eos_token_id=151643,
    ),
    "mistral-7b-v0.3": dict(
        _name="Mistral-7B-v0.3",
        model_type="mistral",
        architectures=["MistralForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
        vocab_size=32768,
        hidden_act="silu",
        bos_token_id=1,
        eos_token_id=2,
    ),
    "gemma-3-1b": dict(
        _name="Gemma-3-1B",
        model_type="gemma3_text",
        architectures=["Gemma3ForCausalLM"],
        hidden_size=1152,
        intermediate_size=6912,
        num_hidden_layers=26,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        sliding_window_pattern=6,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        vocab_size=262144,
        hidden_activation="gelu_pytorch_tanh",
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        bos_token_id=2,
        eos_token_id=1,
    ),
    # openai/gpt-oss-20b: learned attention sinks, alternating 128-key windows, 32 experts (4 active).
    # Written as bf16 (the published checkpoint stores the experts in MXFP4); use --layers.
    "gpt-oss-20b": dict(
        _name="gpt-oss-20b",
        model_type="gpt_oss",
        architectures=["GptOssForCausalLM"],
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=24,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=32,
        num_experts_per_tok=4,
        attention_bias=True,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        swiglu_limit=7.0,
        tie_word_embeddings=False,
        vocab_size=201088,
        pad_token_id=199999,
        eos_token_id=200002,
    ),
    # mixture-of-experts: 128 experts per layer, 8 active per token (Qwen/Qwen3-30B-A3B config.json)
    "qwen3-30b-a3b": dict(
        _name="Qwen3-30B-A3B",
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        use_sliding_window=False,
        sliding_window=None,
        tie_word_embeddings=False,
        vocab_size=151936,
        hidden_act="silu",
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    # the multimodal checkpoint (google/gemma-3-12b-it config.json): SigLIP vision tower + the language
    # model; AttnScope loads the language model alone
    "gemma-3-12b": dict(
        _name="Gemma-3-12B",
        model_type="gemma3",
        architectures=["Gemma3ForConditionalGeneration"],
        text_config=dict(
            model_type="gemma3_text",
            hidden_size=3840,
            intermediate_size=15360,
            num_hidden_layers=48,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=1024,
            sliding_window_pattern=6,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            max_position_embeddings=131072,
            rms_norm_eps=1e-6,
            vocab_size=262208,
            hidden_activation="gelu_pytorch_tanh",
        ),
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=27,
            num_attention_heads=16,
            image_size=896,
            patch_size=14,
            vision_use_head=False,
        ),
        mm_tokens_per_image=256,
        boi_token_index=255999,
        eoi_token_index=256000,
        image_token_index=262144,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
    ),
    # hybrid (Gated DeltaNet layers, every 4th layer gated softmax attention) with its vision tower
    # (Qwen/Qwen3.5-9B config.json; transformers' Qwen3_5TextConfig defaults are this model's)
    "qwen3.5-9b": dict(
        _name="Qwen3.5-9B",
        model_type="qwen3_5",
        architectures=["Qwen3_5ForConditionalGeneration"],
        text_config=dict(
            model_type="qwen3_5_text",
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=32,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=256,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            full_attention_interval=4,
            max_position_embeddings=262144,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
            },
            rms_norm_eps=1e-6,
            vocab_size=248320,
            hidden_act="silu",
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="qwen3_5_vision",
            depth=27,
            hidden_size=1152,
            intermediate_size=4304,
            num_heads=16,
            out_hidden_size=4096,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=2304,
        ),
        image_token_id=248056,
        video_token_id=248057,
        vision_start_token_id=248053,
        vision_end_token_id=248054,
        tie_word_embeddings=False,
        bos_token_id=248044,
        eos_token_id=248046,
    ),
    # multi-head latent attention + MoE: 64 routed experts, 6 active, 2 shared
    # (deepseek-ai/DeepSeek-V2-Lite config.json)
    "deepseek-v2-lite": dict(
        _name="DeepSeek-V2-Lite",
        model_type="deepseek_v2",
        architectures=["DeepseekV2ForCausalLM"],
        hidden_size=2048,
        intermediate_size=10944,
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        topk_method="greedy",
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        max_position_embeddings=163840,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling={
            "type": "yarn",
            "factor": 40,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
        tie_word_embeddings=False,
        vocab_size=102400,
        hidden_act="silu",
        bos_token_id=100000,
        eos_token_id=100001,
    ),
}
GGUF_ARCH = {
    "llama": ("llama", "LLAMA"),
    "mistral": ("llama", "LLAMA"),
    "qwen2": ("qwen2", "QWEN2"),
    "gemma3_text": ("gemma3", "GEMMA3"),
}
BLOCK = 64 << 20  # elements drawn per generator call
SHARD = 2 * 10**9


def hf_config(key: str, layers: int | None = None):
    """The transformers config of ``key`` (bfloat16); ``layers``: keep only the first decoder layers
    (every tensor keeps its published shape: a cheap checkpoint of the real geometry for tests)."""
    import copy

    from transformers import AutoConfig

    cfg = {k: v for k, v in copy.deepcopy(CONFIGS[key]).items() if not k.startswith("_")}
    mt = cfg.pop("model_type")
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg  # a multimodal one's LM
    if layers is not None:
        if not 1 <= layers <= text["num_hidden_layers"]:
            raise SystemExit(f"--layers must be in 1..{text['num_hidden_layers']} for {key}")
        text["num_hidden_layers"] = layers
        if "layer_types" in text:
            text["layer_types"] = text["layer_types"][:layers]
    return AutoConfig.for_model(mt, dtype="bfloat16", **cfg)


def tensor_specs(config) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every parameter, in the model's order (from the meta-device model)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config)
    tied = getattr(config, "tie_word_embeddings", False)
    return [
        (k, tuple(v.shape))
        for k, v in m.state_dict().items()
        if not (tied and k == "lm_head.weight") and not k.endswith("inv_freq")
    ]


def random_tensor(index: int, name: str, shape: tuple[int, ...], seed: int, dtype="bfloat16"):
    """Deterministic weights of tensor ``index``: norms 1, else N(0, 0.02²), drawn in blocks (torch)."""
    import torch

    tdt = getattr(torch, dtype)
    n = int(np.prod(shape))
    if name.endswith("norm.weight") or "layernorm" in name or name.endswith("_norm.weight"):
        return torch.ones(shape, dtype=tdt)
    out = torch.empty(n, dtype=tdt)
    for b, start in enumerate(range(0, n, BLOCK)):
        g = torch.Generator().manual_seed((seed * 1_000_003 + index) * 4099 + b)
        m = min(BLOCK, n - start)
        out[start : start + m] = (torch.randn(m, generator=g) * 0.02).to(tdt)
    return out.view(shape)


def _tokenizer_folder() -> Path:
    from attnscope.core.loading.resolve import resolve

    return resolve(None, dtype="float32")[0]


def write_hf(key: str, out: Path, seed: int = 0, log=print, layers: int | None = None) -> Path:
    """Write the bf16 safetensors snapshot of ``key``; return the snapshot folder. With ``layers``,
    ``<Name>-L<layers>`` holding only the first decoder layers (every tensor at its published shape)."""
    from safetensors.torch import save_file

    config = hf_config(key, layers)
    name = CONFIGS[key]["_name"] + ("" if layers is None else f"-L{layers}")
    repo = out / "hub" / f"models--synthetic--{name}"
    snap = repo / "snapshots" / REVISION
    if snap.exists():
        shutil.rmtree(snap)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    specs = tensor_specs(config)
    shards, current, size, total = [], {}, 0, 0

    def flush():
        nonlocal current, size
        if current:
            fn = f"shard-{len(shards):05d}.safetensors"
            save_file(current, str(snap / fn), metadata={"format": "pt"})
            shards.append((fn, list(current)))
            current, size = {}, 0

    for i, (tname, shape) in enumerate(specs):
        t = random_tensor(i, tname, shape, seed)
        nbytes = t.numel() * 2
        if current and size + nbytes > SHARD:
            flush()
        current[tname] = t
        size += nbytes
        total += nbytes
        if i % 20 == 0:
            log(f"{name} bf16: tensor {i + 1}/{len(specs)}")
    flush()
    weight_map = {}
    for j, (fn, names) in enumerate(shards):
        final = (
            "model.safetensors" if len(shards) == 1 else f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        (snap / fn).rename(snap / final)
        weight_map.update({n: final for n in names})
    if len(shards) > 1:
        (snap / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        )
    config.save_pretrained(snap)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        src = _tokenizer_folder() / f
        if src.is_file():
            shutil.copyfile(src, snap / f)
    return snap


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp ``LlamaModel.permute``: HF rotate-half q/k rows → GGML interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _copy_tokenizer(w, src_gguf: Path) -> None:
    from gguf import GGUFReader

    r = GGUFReader(src_gguf)

    def val(k):
        return r.fields[k].contents() if k in r.fields else None

    w.add_tokenizer_model(val("tokenizer.ggml.model"))
    if val("tokenizer.ggml.pre") is not None:
        w.add_tokenizer_pre(val("tokenizer.ggml.pre"))
    w.add_token_list(val("tokenizer.ggml.tokens"))
    w.add_token_types(val("tokenizer.ggml.token_type"))
    w.add_token_merges(val("tokenizer.ggml.merges"))
    for key, fn in (
        ("bos_token_id", w.add_bos_token_id),
        ("eos_token_id", w.add_eos_token_id),
        ("unknown_token_id", w.add_unk_token_id),
        ("padding_token_id", w.add_pad_token_id),
    ):
        v = val(f"tokenizer.ggml.{key}")
        if v is not None:
            fn(int(v))
    if val("tokenizer.chat_template"):
        w.add_chat_template(val("tokenizer.chat_template"))


def write_gguf(key: str, out: Path, qname: str, seed: int = 0, log=print, layers: int | None = None) -> Path:
    """Write ``<out>/gguf/<Name>-<Q>.gguf`` (``qname`` "Q8_0" or "Q4_0"), streaming tensor by tensor;
    with ``layers``, ``<Name>-L<layers>-<Q>.gguf`` holding only the first decoder layers."""
    import gguf
    from attnscope.core.loading.resolve import default_gguf_path

    qtype = getattr(gguf.GGMLQuantizationType, qname)
    config = hf_config(key, layers)
    c = CONFIGS[key]
    arch, arch_enum = GGUF_ARCH[c["model_type"]]
    tag = "" if layers is None else f"-L{layers}"
    path = out / "gguf" / f"{c['_name']}{tag}-{qname}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("mistral" if c["model_type"] == "mistral" else c["_name"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qname == "Q8_0" else gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(config.sliding_window)
    w.add_rope_freq_base(float(c["rope_theta"]))
    from tiny_models import add_rope_scaling

    # RoPE scaling as llama.cpp's converter writes it (Llama 3.x: only the rope_freqs.weight divisors)
    rope_freqs = add_rope_scaling(w, config, head_dim) if arch == "llama" else None
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)
    _copy_tokenizer(w, default_gguf_path())
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch_enum), config.num_hidden_layers)
    specs = []
    for i, (hf, shape) in enumerate(tensor_specs(config)):
        base = hf.removesuffix(".weight").removesuffix(".bias")
        g = names.get_name(base)
        if g is None:
            raise SystemExit(f"no GGUF name for {hf}")
        q = qtype if len(shape) == 2 and shape[-1] % 32 == 0 else gguf.GGMLQuantizationType.F32
        specs.append((i, hf, g + hf[len(base) :], shape, q))
    if rope_freqs is not None:
        w.add_tensor_info("rope_freqs.weight", rope_freqs.shape, np.dtype(np.float32), rope_freqs.nbytes)
    for _i, _hf, gname, shape, q in specs:
        if q == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(gname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            qshape = gguf.quants.quant_shape_to_byte_shape(shape, q)
            w.add_tensor_info(gname, qshape, np.dtype(np.uint8), int(np.prod(qshape)), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    if rope_freqs is not None:
        w.write_tensor_data(rope_freqs)
    for k, (i, hf, gname, shape, q) in enumerate(specs):
        arr = random_tensor(i, hf, shape, seed, "bfloat16").float().numpy()  # the bf16 folder's values
        if arch == "llama" and gname.endswith("attn_q.weight"):
            arr = _permute(arr, n_heads)
        elif arch == "llama" and gname.endswith("attn_k.weight"):
            arr = _permute(arr, n_kv)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            arr = arr + 1.0  # llama.cpp stores Gemma's (1 + w); transformers subtracts 1 on load
        if q != gguf.GGMLQuantizationType.F32:
            rows = max(1, BLOCK // shape[-1])
            arr = np.concatenate(
                [
                    gguf.quants.quantize(np.ascontiguousarray(arr[r : r + rows]), q)
                    for r in range(0, shape[0], rows)
                ]
            )
        w.write_tensor_data(np.ascontiguousarray(arr))
        del arr
        if k % 20 == 0:
            log(f"{path.name}: tensor {k + 1}/{len(specs)}")
    w.close()
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(CONFIGS))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--formats", default="bf16,q8_0,q4_0", help="comma-separated: bf16, q8_0, q4_0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--layers", type=int, default=None, help="keep the first N decoder layers (published tensor shapes)"
    )
    a = p.parse_args(argv)
    for f in a.formats.split(","):
        f = f.strip().lower()
        if f == "bf16":
            print(write_hf(a.model, a.out, a.seed, layers=a.layers))
        elif f in ("q8_0", "q4_0"):
            print(write_gguf(a.model, a.out, f.upper(), a.seed, layers=a.layers))
        else:
            raise SystemExit(f"unknown format {f!r}: bf16, q8_0, q4_0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
