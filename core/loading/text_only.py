"""The language model of a multimodal checkpoint, loaded alone for text prompts.

Gemma 3 (4B and up), Mistral 3, Qwen2.5-VL / Qwen3-VL and Llama 4 checkpoints hold a vision tower,
a projector and a language model. AttnScope runs text prompts, so only the language model is built
(the text config, ``config.get_text_config()``) and only its weights are read: the checkpoint's
keys are renamed to the text model's (:data:`KEY_MAPPING`, from-pretrained's ``key_mapping``;
the prefixes are the ones transformers 5.24's own conversion tables use: legacy LLaVA-style
``language_model.model.`` / ``language_model.lm_head.``, and ``model.language_model.`` as
transformers 5 saves them), and the vision tower's tensors are left unread. Images as input are not
supported.

Families whose text model has no ``…ForCausalLM`` class in transformers (Qwen2.5-VL, Qwen3-VL) get
one built here (:func:`causal_lm_class`): the family's own text model plus an ``lm_head``, as
``LlamaForCausalLM`` composes them. Their M-RoPE, given text positions only, rotates every section
by the same position (transformers' text-only path), which is ordinary RoPE.
"""

from __future__ import annotations

import re
from functools import lru_cache

# checkpoint key (regex) -> text-model key, applied in order (transformers' WeightRenaming)
KEY_MAPPING = {
    r"^language_model\.lm_head\.": "lm_head.",
    r"^language_model\.model\.": "model.",
    r"^model\.language_model\.": "model.",
}

VISION_NOTE = "vision tower not loaded: text prompts only"


def is_multimodal(config) -> bool:
    """Whether ``config`` (a transformers config) wraps a language model beside a vision/audio
    tower (its text config is a different object, or it has a ``vision_config``)."""
    get = getattr(config, "get_text_config", None)
    text = get() if callable(get) else config
    return text is not config or getattr(config, "vision_config", None) is not None


def text_config(config):
    """The language model's config of ``config``, with the top-level token ids it lacks
    (``bos/eos/pad_token_id``) copied in, and the top level's ``tie_word_embeddings`` (the whole
    model ties ``lm_head`` to the embeddings by it, so its checkpoint may hold no ``lm_head``)."""
    text = config.get_text_config()
    if text is config:
        return config
    tie = getattr(config, "tie_word_embeddings", None)
    if tie is not None:
        text.tie_word_embeddings = bool(tie)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(text, k, None) is None and getattr(config, k, None) is not None:
            setattr(text, k, getattr(config, k))
    return text


@lru_cache(maxsize=32)
def _built_class(mt: str):
    import importlib

    import torch
    from torch import nn
    from transformers import GenerationMixin
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    from transformers.utils.deprecation import deprecate_kwarg

    text_config_class = CONFIG_MAPPING[mt]

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    mod = importlib.import_module(
        f"transformers.models.{model_type_to_module_name(mt)}.modeling_{model_type_to_module_name(mt)}"
    )
    base = getattr(mod, str(MODEL_MAPPING_NAMES[mt]))
    pretrained = next(c for c in base.__mro__[1:] if c.__name__.endswith("PreTrainedModel"))

    class TextOnlyForCausalLM(pretrained, GenerationMixin):  # type: ignore[misc,valid-type]
        """``base`` (the family's text model) + ``lm_head``: the language model of the checkpoint."""

        config_class = text_config_class
        base_model_prefix = "model"
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        _no_split_modules = [
            n for n in (getattr(pretrained, "_no_split_modules", None) or []) if "Vision" not in n
        ]

        def __init__(self, config):
            super().__init__(config)
            self.model = base(config)
            self.vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
        def forward(
            self,
            input_ids=None,
            attention_mask=None,
            position_ids=None,
            cache=None,
            inputs_embeds=None,
            use_cache=None,
            logits_to_keep: int | torch.Tensor = 0,
            **kwargs,
        ):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                inputs_embeds=inputs_embeds,
                use_cache=use_cache,
                **kwargs,
            )
            h = out.last_hidden_state
            if isinstance(logits_to_keep, int) and logits_to_keep:
                h = h[:, -logits_to_keep:, :]
            elif not isinstance(logits_to_keep, int):
                h = h[:, logits_to_keep, :]
            return CausalLMOutputWithPast(
                logits=self.lm_head(h),
                cache=getattr(out, "cache", None),
                hidden_states=out.hidden_states,
                attentions=out.attentions,
            )

    TextOnlyForCausalLM.__name__ = TextOnlyForCausalLM.__qualname__ = f"{base.__name__}ForCausalLM"
    return TextOnlyForCausalLM


def causal_lm_class(text_cfg):
    """The causal-LM class for a language model's config: transformers' own ``…ForCausalLM`` where
    ``AutoModelForCausalLM`` maps it, else :func:`_built_class` (the text model + ``lm_head``)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM._model_mapping[type(text_cfg)]
    except KeyError:
        return _built_class(str(text_cfg.model_type))


def from_pretrained(folder, config, **kwargs):
    """Load only the language model of the multimodal checkpoint in ``folder`` (``config``: its
    transformers config): :func:`causal_lm_class` of :func:`text_config`, weights renamed by
    :data:`KEY_MAPPING`; the vision tower's tensors are never read. ``kwargs`` go to
    ``from_pretrained`` (dtype, attn_implementation, device_map)."""
    text = text_config(config)
    return causal_lm_class(text).from_pretrained(folder, config=text, key_mapping=dict(KEY_MAPPING), **kwargs)


_NOT_LANGUAGE = re.compile(r"^model\.(visual|vision|multi_modal|audio|mm_)")


def rename(key: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text model names it (:data:`KEY_MAPPING`, in
    order), or None for a tensor outside the language model (vision tower, projector)."""
    for pattern, repl in KEY_MAPPING.items():
        key = re.sub(pattern, repl, key)
    if key.startswith("lm_head.") or (key.startswith("model.") and not _NOT_LANGUAGE.match(key)):
        return key
    return None


def language_header(header: dict) -> dict:
    """A safetensors header (``{name: entry}``) cut to the language model's tensors, renamed
    (:func:`rename`); ``__metadata__`` and the vision tower's tensors dropped."""
    out = {}
    for k, v in header.items():
        new = rename(k) if k != "__metadata__" else None
        if new is not None:
            out[new] = v
    return out
