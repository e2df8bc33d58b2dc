"""Which GGUF metadata keys and tensors the conversion reads, and which it ignores on purpose.

One list for the whole conversion (transformers' GGUF config/tokenizer mappings, then
:mod:`attnscope.core.loading.gguf_config` and :mod:`attnscope.core.loading.gguf_tokenizer`):

* :func:`used_keys`: what is turned into the config or tokenizer;
* :data:`IGNORED` / :data:`IGNORED_PREFIXES`: what is deliberately left out, each with why (none of
  it changes the attention maps of the model the file holds);
* :func:`unread`: what a file holds that is neither. A key or tensor here may change the model in a
  way the conversion does not reproduce, so the load says so (one note) instead of silently
  computing another model; ``tests/core/test_gguf_fidelity.py`` fails when a family's file has one.

Names come from gguf-py's constants (``gguf.constants.Keys``), the names llama.cpp's loader reads
(``src/llama-model.cpp``, ``src/llama-vocab.cpp``).
"""

from __future__ import annotations

from gguf.constants import Keys

_A = "{arch}"


def _arch(name: str) -> str:
    """``"{arch}.rope.freq_base"`` -> ``"rope.freq_base"`` (the part after the architecture)."""
    return name.removeprefix(_A + ".")


# -- read by AttnScope itself (on top of transformers' mappings) ------------------------------------
OURS_ARCH = frozenset(
    _arch(k)
    for k in (
        Keys.LLM.CONTEXT_LENGTH,
        Keys.LLM.EMBEDDING_LENGTH,
        Keys.LLM.BLOCK_COUNT,
        Keys.LLM.VOCAB_SIZE,
        Keys.LLM.FINAL_LOGIT_SOFTCAPPING,
        Keys.Attention.HEAD_COUNT,
        Keys.Attention.KEY_LENGTH,
        Keys.Attention.VALUE_LENGTH,
        Keys.Attention.SLIDING_WINDOW,
        Keys.Rope.DIMENSION_COUNT,
        Keys.Rope.FREQ_BASE,
        Keys.Rope.FREQ_BASE_SWA,
        Keys.Rope.SCALING_TYPE,
        Keys.Rope.SCALING_FACTOR,
        Keys.Rope.SCALING_ORIG_CTX_LEN,
        Keys.Rope.SCALING_ATTN_FACTOR,
        Keys.Rope.SCALING_YARN_BETA_FAST,
        Keys.Rope.SCALING_YARN_BETA_SLOW,
        Keys.Rope.SCALING_YARN_LOG_MUL,  # these three: read to say they are not reproduced
        Keys.Rope.SCALING_YARN_EXT_FACTOR,
        Keys.Rope.SCALING_YARN_ATTN_FACTOR,
        Keys.Attention.SCALE,  # Gemma 3's query_pre_attn_scalar; refused where it is not 1/sqrt(d)
        Keys.Attention.CAUSAL,  # refused when false (an encoder)
        Keys.LLM.EXPERT_COUNT,  # refused for dense families (llama.cpp stores Mixtral as llama)
    )
) | {"rope.scale_linear"}  # the old name of rope.scaling.factor (linear), still read by llama.cpp
OURS = frozenset(
    {
        Keys.General.ARCHITECTURE,
        Keys.General.NAME,  # display name; "mistral" marks llama.cpp's Mistral files (transformers' rule)
        Keys.General.ALIGNMENT,  # where the tensor data start (gguf_meta.read_gguf_header)
        Keys.General.FILE_TYPE,  # the quantisation named in the model list
        Keys.Tokenizer.MODEL,
        Keys.Tokenizer.PRE,  # gguf_tokenizer.PRE_TOKENIZERS
    }
)

# -- deliberately ignored, with why ------------------------------------------------------------------
_DESCRIPTIVE = "descriptive metadata (names, authors, licence, links, tags): no effect on the model"
_SAMPLING = "sampling defaults for a chat front end: AttnScope decodes with its own settings"
_SPECIAL_IDS = "ids for chat and fill-in-the-middle front ends: no effect on tokenisation or attention"
_ENCODER = "BERT-style encoder tokenizers only"
IGNORED: dict[str, str] = {
    Keys.General.QUANTIZATION_VERSION: "the quantisation format's version: each tensor's type says how to dequantise",
    Keys.General.TYPE: "'model' or 'adapter': adapters are refused as architectures transformers cannot convert",
    Keys.Tokenizer.EOT_ID: _SPECIAL_IDS,
    Keys.Tokenizer.EOM_ID: _SPECIAL_IDS,
    Keys.Tokenizer.FIM_PRE_ID: _SPECIAL_IDS,
    Keys.Tokenizer.FIM_SUF_ID: _SPECIAL_IDS,
    Keys.Tokenizer.FIM_MID_ID: _SPECIAL_IDS,
    Keys.Tokenizer.FIM_PAD_ID: _SPECIAL_IDS,
    Keys.Tokenizer.FIM_REP_ID: _SPECIAL_IDS,
    Keys.Tokenizer.FIM_SEP_ID: _SPECIAL_IDS,
    Keys.Tokenizer.PREFIX_ID: _SPECIAL_IDS,
    Keys.Tokenizer.SUFFIX_ID: _SPECIAL_IDS,
    Keys.Tokenizer.MIDDLE_ID: _SPECIAL_IDS,
    Keys.Tokenizer.SEP_ID: _ENCODER,
    Keys.Tokenizer.MASK_ID: _ENCODER,
    Keys.Tokenizer.ADD_SEP: _ENCODER,
    Keys.Tokenizer.TOKEN_TYPE_COUNT: _ENCODER,
    Keys.Tokenizer.REMOVE_EXTRA_WS: "applied by llama.cpp to T5-style (unigram) vocabularies only",
    Keys.Tokenizer.HF_JSON: "the tokenizer is rebuilt from the token list and merges, as transformers does",
    Keys.Tokenizer.RWKV: "RWKV vocabularies only",
    Keys.Tokenizer.CHAT_TEMPLATES: "named extra chat templates: the default one (tokenizer.chat_template) is kept",
}
#: key prefixes ignored as a group, with why
IGNORED_PREFIXES: dict[str, str] = {
    "general.": _DESCRIPTIVE,  # after the exact keys above and OURS
    "general.sampling.": _SAMPLING,
    "tokenizer.chat_template.": "named extra chat templates: the default one (tokenizer.chat_template) is kept",
    "quantize.": "how llama-quantize chose its quantisation (imatrix): no effect on the dequantised weights",
    "split.": "split files are refused before conversion (merge them with llama.cpp's gguf-split --merge)",
}
#: architecture keys ignored, with why (the part after ``<arch>.``)
IGNORED_ARCH: dict[str, str] = {
    _arch(Keys.Rope.SCALING_FINETUNED): "llama.cpp reads it and uses it nowhere",
    _arch(Keys.LLM.POOLING_TYPE): "embedding models' pooling: a causal LM's forward does not pool",
    _arch(
        Keys.LLM.TENSOR_DATA_LAYOUT
    ): "old Falcon files' tensor layout: not an architecture AttnScope converts",
    _arch(
        Keys.LLM.EMBEDDING_LENGTH_OUT
    ): "the output size of embedding models: a causal LM's output is its vocabulary",
    _arch(
        Keys.LLM.EXPERT_USED_COUNT
    ): "experts per token: read with expert_count, which dense families refuse",
    _arch(Keys.LLM.EXPERT_GROUP_COUNT): "expert groups: read with expert_count, which dense families refuse",
    _arch(
        Keys.LLM.EXPERT_GROUP_USED_COUNT
    ): "expert groups: read with expert_count, which dense families refuse",
    _arch(
        Keys.Rope.DIMENSION_SECTIONS
    ): "multimodal M-RoPE sections (Qwen2-VL): not a text decoder AttnScope runs",
}
#: tensors read by gguf_config (RoPE scaling) rather than converted to weights
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def _transformers_keys(arch: str, model_type: str) -> tuple[set[str], set[str]]:
    """``(full keys, arch keys)`` transformers' GGUF config and tokenizer mappings turn into values."""
    from typing import cast

    from transformers.integrations import ggml
    from transformers.integrations.gguf import gguf_tokenizer_mapping

    GGUF_CONFIG_MAPPING = cast(dict[str, dict[str, str | None]], ggml.GGUF_CONFIG_MAPPING)
    GGUF_TOKENIZER_MAPPING = gguf_tokenizer_mapping.GGUF_TOKENIZER_MAPPING

    full = {f"general.{k}" for k, v in GGUF_CONFIG_MAPPING["general"].items() if v is not None}
    full |= {f"tokenizer.{k}" for k, v in GGUF_CONFIG_MAPPING["tokenizer"].items() if v is not None}
    for group in GGUF_TOKENIZER_MAPPING.values():
        full |= {k if k == "chat_template" else f"tokenizer.{k}" for k in group}
    full = {("tokenizer.chat_template" if k == "chat_template" else k) for k in full}
    table = (
        GGUF_CONFIG_MAPPING.get(arch)
        or GGUF_CONFIG_MAPPING.get(model_type)
        or GGUF_CONFIG_MAPPING.get(model_type.removesuffix("_text"))
        or {}
    )
    return full, {k for k, v in table.items() if v is not None}


def used_keys(arch: str, model_type: str) -> frozenset[str]:
    """Every full metadata key the conversion of a ``arch`` file turns into config or tokenizer values."""
    full, arch_keys = _transformers_keys(arch, model_type)
    return frozenset(full | OURS | {f"{arch}.{k}" for k in arch_keys | OURS_ARCH})


def why_ignored(key: str, arch: str) -> str | None:
    """Why ``key`` is deliberately ignored, or None when it is not on the list."""
    if key in IGNORED:
        return IGNORED[key]
    if key.startswith(arch + ".") and key[len(arch) + 1 :] in IGNORED_ARCH:
        return IGNORED_ARCH[key[len(arch) + 1 :]]
    for prefix in sorted(IGNORED_PREFIXES, key=len, reverse=True):
        if key.startswith(prefix):
            return IGNORED_PREFIXES[prefix]
    return None


def unread(header, model_type: str, converted_tensors) -> tuple[list[str], list[str]]:
    """``(keys, tensors)`` of the file ``header`` that the conversion neither uses nor lists as ignored.

    ``converted_tensors``: the GGUF tensor names the conversion turns into weights (the name map's keys).
    """
    arch = header.architecture
    used = used_keys(arch, model_type)
    keys = [k for k in header.metadata if k not in used and why_ignored(k, arch) is None]
    converted = set(converted_tensors) | set(ROPE_TENSORS)
    tensors = [t.name for t in header.tensors if t.name not in converted]
    return keys, tensors


def unread_note(keys: list[str], tensors: list[str]) -> str:
    """One load-report line naming what :func:`unread` found, ``""`` when nothing."""
    parts = []
    if keys:
        parts.append(f"metadata {', '.join(keys[:6])}{' …' if len(keys) > 6 else ''}")
    if tensors:
        parts.append(f"tensors {', '.join(tensors[:6])}{' …' if len(tensors) > 6 else ''}")
    if not parts:
        return ""
    return (
        "the GGUF conversion does not read "
        + " and ".join(parts)
        + ": whatever they change in the model is not reproduced"
    )
