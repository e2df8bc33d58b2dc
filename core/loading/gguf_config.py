"""A GGUF's model config as llama.cpp reads it: what transformers' GGUF config mapping drops.

transformers rebuilds a config from a GGUF's metadata (``AutoConfig.from_pretrained(gguf_file=)``,
``integrations/ggml.py``'s ``GGUF_CONFIG_MAPPING``) but, for the families AttnScope runs, drops
four things llama.cpp's loader (``src/llama-model.cpp``, ``load_hparams``) reads, so the converted
model computes other attention maps than the file's model, without a word:

* **head size**: ``attention.key_length`` / ``value_length`` (llama.cpp: ``n_embd_head_k``,
  default ``n_embd / n_head``). transformers keeps its config class's default (Qwen3: 128), so a
  Qwen3 file with head size 64 is refused with a shape mismatch, and a llama one takes
  ``rope.dimension_count`` for it.
* **Gemma 3's attention scale**: llama.cpp scales by ``1/sqrt(key_length)`` (``n_embd / n_head``
  for the 62-layer 27B), so ``query_pre_attn_scalar`` is that; transformers keeps 256.
* **RoPE scaling in the metadata**: ``rope.scaling.type`` (linear, yarn, longrope),
  ``rope.scaling.factor``, ``original_context_length``, ``yarn_beta_fast`` / ``yarn_beta_slow``,
  ``attn_factor`` (Gemma 3 4B-27B: linear x8 on the global layers).
* **RoPE scaling in tensors**: llama.cpp's converter writes Llama 3.1+'s ``llama3`` scaling as the
  per-frequency divisors ``rope_freqs.weight`` (``convert_hf_to_gguf.py``, ``LlamaModel``), and
  Phi-3's ``longrope`` as ``rope_factors_long`` / ``rope_factors_short``: no metadata key says so.
  :func:`llama3_parameters` recovers ``factor``, ``low_freq_factor``, ``high_freq_factor`` and
  ``original_max_position_embeddings`` from the divisors; divisors that no llama3 parameters
  reproduce are kept exactly as a ``longrope`` with equal short and long factors
  (``inv_freq = 1 / (factor_i · theta^(2i/d))``, attention factor 1: what llama.cpp computes).

:func:`fix_config` applies these to transformers' config; tests/core/test_gguf_fidelity.py checks each
against the original Hugging Face model's eager attention maps.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

#: families whose transformers config takes ``head_dim`` (the head size need not be hidden / heads)
HEAD_DIM_FAMILIES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "gemma2", "gemma3_text"}
)
#: families with one feed-forward per layer (a file with experts is another model)
DENSE_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text"})
#: families whose attention rotates only the first ``partial_rotary_factor`` of each head
PARTIAL_ROTARY_FAMILIES = frozenset({"phi3"})
# a recovered llama3 parameter set is used when it reproduces every divisor to this relative
# error (the file stores float32: 6e-8; the fit and snapping add less than this when right)
LLAMA3_RTOL = 2e-6


def read_small_tensor(header, name: str) -> np.ndarray | None:
    """The float64 values of the 1-D tensor ``name`` of a parsed GGUF (``None`` when absent).

    Read straight from the file (``header.data_offset + offset``), dequantised by
    ``gguf.quants.dequantize`` for any type other than F32.
    """
    t = next((t for t in header.tensors if t.name == name), None)
    if t is None:
        return None
    nbytes = t.n_bytes()
    if nbytes is None:
        return None
    with open(header.path, "rb") as f:
        f.seek(header.data_offset + t.offset)
        raw = f.read(nbytes)
    if t.type_name == "F32":
        values = np.frombuffer(raw, dtype="<f4")
    else:
        from gguf.quants import dequantize

        values = dequantize(np.frombuffer(raw, dtype=np.uint8), t.type_id)
    return np.asarray(values, dtype=np.float64).reshape(-1)


def llama3_factors(params: dict, theta: float, dim: int) -> np.ndarray:
    """The ``dim // 2`` RoPE divisors llama.cpp's converter writes for llama3 ``params``
    (``convert_hf_to_gguf.py``, ``LlamaModel.generate_extra_tensors``), float64."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wl:
            out.append(1.0)
        elif wavelen > low_wl:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float64)


def _snap(v: float, digits: int = 3) -> float:
    """``v`` rounded to ``digits`` decimals when that moves it by under 1e-5 relative (a fit's noise)."""
    r = round(v, digits)
    return float(r) if abs(r - v) <= 1e-5 * max(abs(v), 1e-12) else float(v)


def llama3_parameters(
    factors: np.ndarray, theta: float, dim: int, original: int | None = None
) -> dict | None:
    """llama3 RoPE parameters whose divisors (:func:`llama3_factors`) are ``factors``, or None.

    The divisors are 1 above the high-frequency wavelength ``old/high``, ``factor`` below the
    low-frequency one ``old/low`` and ``1 / ((1 − s)/factor + s)`` between, with ``s`` linear in
    ``1/wavelength``: a line fitted through the middle ones gives both wavelengths. They fix only
    the ratios ``old/low`` and ``old/high``, so ``original`` (the file's
    ``rope.scaling.original_context_length``) sets ``old`` where given, else ``low_freq_factor`` is
    taken as 1 (Llama 3.1-3.3's value) and ``old`` as that wavelength, rounded to an integer.

    Returns:
        ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings"}`` when these reproduce every divisor to
        :data:`LLAMA3_RTOL`; ``{}`` when every divisor is 1 (no scaling); None otherwise.
    """
    f = np.asarray(factors, dtype=np.float64)
    if f.shape != (dim // 2,) or not np.all(np.isfinite(f)) or np.any(f <= 0):
        return None
    if np.allclose(f, 1.0, rtol=0, atol=1e-7):
        return {}
    wavelen = 2 * math.pi * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor = float(f.max())
    if factor <= 1.0:
        return None
    high = np.isclose(f, 1.0, rtol=1e-6, atol=0)
    low = np.isclose(f, factor, rtol=1e-6, atol=0)
    mid = ~high & ~low
    x = 1.0 / wavelen
    s = (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor)  # 1 at high frequencies, 0 at low ones
    if mid.sum() >= 2:
        a, b = np.polyfit(x[mid], s[mid], 1)
        if a <= 0:
            return None
        low_wl, high_wl = a / -b if b < 0 else math.inf, a / (1.0 - b)
    else:
        # no line to fit: any wavelengths between the samples give the same divisors
        w_hi = wavelen[high].max() if high.any() else wavelen.min() / 2
        w_lo = wavelen[low].min() if low.any() else wavelen.max() * 2
        if mid.sum() == 1:
            wm, sm = float(wavelen[mid][0]), float(s[mid][0])
            low_wl = math.sqrt(wm * w_lo)
            a = sm / (1 / wm - 1 / low_wl)  # s = a·(1/wavelength − 1/low_wl), 1 at high_wl
            high_wl = 1.0 / (1.0 / low_wl + 1.0 / a)
        else:
            high_wl, low_wl = w_hi * (w_lo / w_hi) ** (1 / 3), w_hi * (w_lo / w_hi) ** (2 / 3)
    if not (math.isfinite(low_wl) and math.isfinite(high_wl)) or not 0 < high_wl < low_wl:
        return None
    if original:
        old = int(original)
        lo, hi = _snap(old / low_wl), _snap(old / high_wl)
    else:
        old = int(round(low_wl))
        lo = _snap(old / low_wl)
        hi = _snap(old / high_wl)
    params = {
        "rope_type": "llama3",
        "factor": _snap(factor),
        "low_freq_factor": lo,
        "high_freq_factor": hi,
        "original_max_position_embeddings": old,
    }
    got = llama3_factors(params, theta, dim)
    return params if np.allclose(got, f, rtol=LLAMA3_RTOL, atol=0) else None


def _key(meta: dict, arch: str, name: str, default=None):
    return meta.get(f"{arch}.{name}", default)


def _scalar(v):
    """A per-layer array's single value (llama.cpp's ``get_key_or_arr``), or ``v`` itself."""
    if isinstance(v, list) and v and all(x == v[0] for x in v):
        return v[0]
    return v


def rope_scaling_from_metadata(header, n_ctx: int, rope_dim: int) -> tuple[dict, list[str]]:
    """``(rope parameters to merge, notes)`` from the file's ``rope.scaling.*`` keys and RoPE tensors.

    Raises:
        UnsupportedModelError: a scaling type transformers has no RoPE for.
    """
    from attnscope.core.errors import UnsupportedModelError

    meta, arch = header.metadata, header.architecture
    notes: list[str] = []
    kind = str(_key(meta, arch, "rope.scaling.type", "") or "").lower()
    factor = _key(meta, arch, "rope.scaling.factor", _key(meta, arch, "rope.scale_linear"))
    orig = _key(meta, arch, "rope.scaling.original_context_length")
    attn = _key(meta, arch, "rope.scaling.attn_factor")
    theta = float(_key(meta, arch, "rope.freq_base", 10000.0))
    if (
        kind in ("", "none")
        and factor not in (None, 1.0)
        and _key(meta, arch, "rope.scale_linear") is not None
    ):
        kind = "linear"  # the old key llama.cpp still reads as a linear factor
    params: dict = {}
    if kind == "linear" and factor not in (None, 1.0):
        params = {"rope_type": "linear", "factor": float(factor)}
    elif kind == "yarn":
        params = {
            "rope_type": "yarn",
            "factor": float(factor or 1.0),
            "original_max_position_embeddings": int(orig or round(n_ctx / float(factor or 1.0))),
        }
        for gguf_name, hf_name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            v = _key(meta, arch, f"rope.scaling.{gguf_name}")
            if v is not None:
                params[hf_name] = float(v)
        if attn not in (None, 1.0):
            # llama.cpp multiplies YaRN's own 1 + 0.1·ln(factor) by attn_factor; transformers'
            # attention_factor is the whole product
            params["attention_factor"] = float(attn) * (0.1 * math.log(params["factor"]) + 1.0)
        for name, neutral in (
            ("yarn_log_multiplier", (0.0,)),
            ("yarn_ext_factor", (-1.0, 1.0)),
            ("yarn_attn_factor", (1.0,)),
        ):
            v = _key(meta, arch, f"rope.scaling.{name}")
            if v is not None and float(v) not in neutral:
                notes.append(f"the file's rope.scaling.{name} = {float(v):g} is not reproduced (YaRN)")
    elif kind == "longrope" or (
        kind in ("", "none") and any(t.name.startswith("rope_factors_") for t in header.tensors)
    ):
        long_f = read_small_tensor(header, "rope_factors_long.weight")
        short_f = read_small_tensor(header, "rope_factors_short.weight")
        if long_f is None and short_f is None:
            raise UnsupportedModelError(
                "the file says longrope RoPE scaling but holds no rope_factors tensors"
            )
        longs = short_f if long_f is None else long_f  # one of them is there (checked above)
        shorts = long_f if short_f is None else short_f
        assert longs is not None and shorts is not None
        o = int(orig or n_ctx)
        params = {
            "rope_type": "longrope",
            "long_factor": [float(v) for v in longs],
            "short_factor": [float(v) for v in shorts],
            "original_max_position_embeddings": o,
        }
        default = 1.0 if n_ctx <= o else math.sqrt(1 + math.log(n_ctx / o) / math.log(o))
        if attn is not None and abs(float(attn) - default) > 1e-6 * default:
            params["attention_factor"] = float(attn)
    elif kind not in ("", "none", "linear"):
        raise UnsupportedModelError(f"RoPE scaling type {kind!r} in the file has no transformers equivalent")
    freqs = read_small_tensor(header, "rope_freqs.weight")
    if freqs is not None:
        if params:
            raise UnsupportedModelError(
                f"the file holds rope_freqs.weight and {kind} RoPE scaling: both together are not supported"
            )
        if freqs.shape != (rope_dim // 2,):
            raise UnsupportedModelError(
                f"rope_freqs.weight has {freqs.size} values, RoPE over {rope_dim} dims needs {rope_dim // 2}"
            )
        p = llama3_parameters(freqs, theta, rope_dim, int(orig) if orig else None)
        if p is None:  # not a llama3 curve: the divisors themselves, exactly as llama.cpp divides
            params = {
                "rope_type": "longrope",
                "long_factor": [float(v) for v in freqs],
                "short_factor": [float(v) for v in freqs],
                "original_max_position_embeddings": int(n_ctx),
                "attention_factor": 1.0,
            }
        else:
            params = p
    return params, notes


def fix_config(config, header) -> list[str]:
    """Set on transformers' GGUF ``config`` (in place) what the file says and transformers dropped.

    ``header``: the file's :class:`attnscope.core.loading.gguf_meta.GGUFHeader`. Sets ``head_dim``
    (``attention.key_length``, else ``embedding_length / head_count``, llama.cpp's rule),
    ``partial_rotary_factor`` where ``rope.dimension_count`` is smaller (Phi-3 family), Gemma 3's
    ``query_pre_attn_scalar``, ``final_logit_softcapping``, the sliding layers' ``rope_theta``
    (``rope.freq_base_swa``) and RoPE scaling (:func:`rope_scaling_from_metadata`).

    Returns:
        Notes for the load report (what the file holds that is not reproduced); usually empty.

    Raises:
        UnsupportedModelError: a head size, rotary size or RoPE scaling transformers' model of this
            family cannot express.
    """
    from attnscope.core.errors import UnsupportedModelError

    meta, arch = header.metadata, header.architecture
    model_type = config.model_type
    n_head = _scalar(_key(meta, arch, "attention.head_count"))
    n_embd = _key(meta, arch, "embedding_length")
    n_layer = _key(meta, arch, "block_count")
    n_ctx = int(
        _key(meta, arch, "context_length") or getattr(config, "max_position_embeddings", 2048) or 2048
    )
    if not isinstance(n_head, int) or not isinstance(n_embd, int) or n_head <= 0:
        return []
    if _key(meta, arch, "attention.causal") is False:
        raise UnsupportedModelError(
            "the file's attention is not causal (an encoder): AttnScope runs decoders"
        )
    n_expert = _key(meta, arch, "expert_count")
    if isinstance(n_expert, int) and n_expert > 0 and model_type in DENSE_FAMILIES:
        raise UnsupportedModelError(
            f"the file is a mixture of {n_expert} experts, which transformers' {model_type} cannot hold "
            "(a llama.cpp Mixtral file is stored as llama)"
        )
    k_len = _scalar(_key(meta, arch, "attention.key_length"))
    v_len = _scalar(_key(meta, arch, "attention.value_length"))
    head_dim = int(k_len) if isinstance(k_len, int) and k_len > 0 else n_embd // n_head
    if isinstance(v_len, int) and v_len > 0 and v_len != head_dim:
        raise UnsupportedModelError(
            f"the file's key head size {head_dim} differs from its value head size {v_len}: "
            f"transformers' {model_type} has one head size"
        )
    if model_type in HEAD_DIM_FAMILIES:
        config.head_dim = head_dim
    elif head_dim != n_embd // n_head:
        raise UnsupportedModelError(
            f"the file's head size {head_dim} is not embedding_length / head_count = {n_embd // n_head}, "
            f"which transformers' {model_type} assumes"
        )
    rope_dim = _key(meta, arch, "rope.dimension_count")
    rope_dim = int(rope_dim) if isinstance(rope_dim, int) and rope_dim > 0 else head_dim
    if rope_dim != head_dim:
        if model_type not in PARTIAL_ROTARY_FAMILIES or rope_dim > head_dim:
            raise UnsupportedModelError(
                f"the file rotates {rope_dim} of each head's {head_dim} dims (rope.dimension_count): "
                f"transformers' {model_type} rotates them all"
            )
        config.partial_rotary_factor = rope_dim / head_dim
    scale = _key(meta, arch, "attention.scale")
    if model_type == "gemma3_text":
        # llama.cpp (LLM_ARCH_GEMMA3): 1/sqrt(n_embd_head_k), 1/sqrt(n_embd / n_head) for the 27B (62 layers)
        config.query_pre_attn_scalar = n_embd // n_head if n_layer == 62 else head_dim
        if isinstance(scale, float) and scale > 0:
            config.query_pre_attn_scalar = 1.0 / scale**2
    elif isinstance(scale, float) and abs(scale - head_dim**-0.5) > 1e-6 * head_dim**-0.5:
        raise UnsupportedModelError(
            f"the file's attention scale {scale:g} is not 1/sqrt(head size {head_dim}), "
            f"which transformers' {model_type} uses"
        )
    window = _key(meta, arch, "attention.sliding_window")
    if model_type == "phi3" and isinstance(window, int) and window > 0:
        config.sliding_window = window  # llama.cpp LLM_ARCH_PHI3 reads n_swa; transformers' mapping does not
    softcap = _key(meta, arch, "final_logit_softcapping")
    if softcap is not None and hasattr(config, "final_logit_softcapping"):
        config.final_logit_softcapping = float(softcap) or None
    params, notes = rope_scaling_from_metadata(header, n_ctx, rope_dim)
    rp = dict(getattr(config, "rope_parameters", None) or {})
    nested = bool(rp) and all(isinstance(v, dict) for v in rp.values())
    if nested:
        # per layer type (Gemma 3): llama.cpp scales the global layers only (rope_freq_scale_train_swa = 1)
        rp = {k: dict(v) for k, v in rp.items()}
        if params:
            target = rp.setdefault(
                "full_attention", {"rope_theta": float(_key(meta, arch, "rope.freq_base", 1e6))}
            )
            theta = target.get("rope_theta")
            target.clear()
            target.update(params, rope_theta=theta)
        swa_base = _key(meta, arch, "rope.freq_base_swa")
        if swa_base is not None and "sliding_attention" in rp:
            rp["sliding_attention"]["rope_theta"] = float(swa_base)
    elif params or rope_dim != head_dim:
        theta = rp.get("rope_theta", float(_key(meta, arch, "rope.freq_base", 10000.0)))
        kept = {k: v for k, v in rp.items() if k == "partial_rotary_factor"}  # Phi-3 reads it here
        rp = dict(kept, **(params or {"rope_type": rp.get("rope_type", "default")}), rope_theta=theta)
        if rope_dim != head_dim:
            rp["partial_rotary_factor"] = rope_dim / head_dim
    if params or nested or rope_dim != head_dim:
        config.rope_parameters = rp
        if "original_max_position_embeddings" in params and params["rope_type"] != "llama3":
            config.original_max_position_embeddings = params["original_max_position_embeddings"]
    return notes


def gguf_config(path: Path):
    """``(config, notes)``: transformers' config of the GGUF at ``path``, fixed by :func:`fix_config`.

    Raises:
        Whatever transformers raises for a file it cannot read; UnsupportedModelError (see
        :func:`fix_config`).
    """
    from attnscope.core.loading.gguf_meta import read_gguf_header
    from transformers import AutoConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    notes = fix_config(config, read_gguf_header(path))
    return config, notes
