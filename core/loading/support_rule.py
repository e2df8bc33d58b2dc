"""Which decoders AttnScope runs: a rule read from transformers' own model code, not a list of names.

A decoder runs when every softmax-attention layer of its language model calls transformers'
attention interface (``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, ...)``,
the seam :mod:`attnscope.core.backends.hf_attention` plugs into; transformers flags such models with
``PreTrainedModel._supports_attention_backend``) and passes it nothing our attention function
cannot do. The rule is decided per family from the installed transformers' modeling module of
the config's (text) ``model_type``, read as source (:mod:`ast`: no torch import, cheap enough for
the catalog):

1. the language-model class (``MODEL_MAPPING_NAMES`` of the text config's model_type) and every
   class its ``__init__`` builds, transitively (decoder layers, attention, MLP/MoE, mixers);
2. among them the attention classes: those whose ``forward`` calls ``ALL_ATTENTION_FUNCTIONS``;
   none at all is a refusal ("its layers do not call transformers' attention interface");
3. the keywords those classes pass to the attention function: ones our path lacks
   (:data:`PATH_LACKS`: sparse indices, a position bias) refuse it,
   naming what is missing;
4. a class named ``…Attention`` that computes attention without the interface is refused unless
   the config's per-layer kinds (:func:`attnscope.core.arch.layer_kinds_of`) name layers that are not
   softmax attention (a hybrid model's linear-attention / Mamba / convolution layers, which have
   no map and are shown as such);
5. the language model of a multimodal checkpoint runs only for the wrappers in
   :data:`TESTED_FAMILIES` (a wrapper may change what its language model does with text: bidirectional
   prompt attention, a logit scale);
6. non-causal attention (an encoder: ``is_causal`` not literally True and ``config.is_decoder``
   False) and encoder-decoder configs are refused.

Which families are *tested* exact against eager is :data:`TESTED_FAMILIES` (tests/core/test_families.py
proves each one; docs/models.md lists them). Every failure is one line
(:class:`attnscope.core.errors.UnsupportedModelError` where raised).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache

from attnscope.core.errors import UnsupportedModelError

# Keywords a modeling module may pass to the attention function that AttnScope's attention path
# (attnscope.core.backends.hf_attention.attnscope_attention) does not implement, and the words for them.
PATH_LACKS = {
    "indices": "its attention is sparse (each query reads selected key indices), which AttnScope's "
    "attention path does not do",
    "block_indices": "its attention is block-sparse, which AttnScope's attention path does not do",
    "position_bias": "its attention adds a learned relative position bias, which AttnScope's attention path does not do",
}

# The families whose every attention layer is proven exact against transformers eager by
# tests/core/test_families.py (tiny random models; tests/tiny_models.py FAMILIES holds the same names, a
# test keeps the two equal). What docs/models.md lists as supported and the packaged app bundles code for.
TESTED_FAMILIES = frozenset(
    {
        # dense GQA / MHA / MQA decoders
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "phi3",
        "gpt2",
        "olmo",
        "olmo2",
        "olmo3",
        "granite",
        "smollm3",
        "gemma3_text",
        "exaone4",
        "seed_oss",
        "apertus",
        "ernie4_5",
        "glm4",
        # soft-capping (Gemma 2) and learned sinks (gpt-oss, also MoE): tests/core/test_softcap.py,
        # tests/core/test_learned_sinks.py
        "gemma2",
        "gpt_oss",
        # hybrid: a few softmax-attention layers among linear-attention / Mamba / convolution ones
        # (tests/core/test_hybrid.py; tests/tiny_models.py HYBRID_FAMILIES)
        "qwen3_next",
        "qwen3_5_text",
        "granitemoehybrid",
        "falcon_h1",
        "lfm2",
        # mixture-of-experts
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "olmoe",
        # multi-head latent attention
        "deepseek_v2",
        "deepseek_v3",
        "glm4_moe_lite",
        # multimodal checkpoints, language model only
        "gemma3",
        "mistral3",
        "qwen2_5_vl",
        "qwen3_vl",
        "llama4",
        "llava",
        "internvl",
        "qwen3_vl_moe",
        "qwen3_5",  # hybrid too: tests/core/test_hybrid.py (tests/tiny_models.py HYBRID_MULTIMODAL)
    }
)


SOURCELESS = "no model source"


@dataclass(frozen=True)
class FamilyCode:
    """What the rule read from one family's modeling module. Class names as written there."""

    model_type: str  # the text config's model_type
    module: str  # "transformers.models.<mod>.modeling_<mod>"
    text_model: str  # the language-model class ("LlamaModel", "Qwen2_5_VLTextModel")
    attention_classes: tuple[str, ...]  # classes whose forward calls ALL_ATTENTION_FUNCTIONS
    other_attention: tuple[str, ...]  # "...Attention" classes that do not (hybrids' linear attention)
    keywords: frozenset[str]  # keywords passed to the attention function
    causal: bool | None  # True: is_causal = True literally; None: decided by an expression
    supports_backend: bool  # a class sets _supports_attention_backend = True


def text_config_of(config):
    """The language model's config of a transformers config (itself for a text-only one)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _read_source(path: str) -> str:
    """The text of a modeling module (OSError where only bytecode is there, as in a frozen app)."""
    with open(path, encoding="utf-8") as f:
        return f.read()


@lru_cache(maxsize=256)
def family_code(text_model_type: str) -> FamilyCode | str:
    """Read the modeling module of ``text_model_type`` (a text config's model_type): a
    :class:`FamilyCode`, or one line saying why it cannot be read (no model code installed, no
    language-model class)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base = MODEL_MAPPING_NAMES.get(text_model_type)
    if isinstance(base, tuple | list):
        base = base[0]
    if not base:
        return f"transformers has no language-model class for {text_model_type!r}"
    mod = model_type_to_module_name(text_model_type)
    name = f"transformers.models.{mod}.modeling_{mod}"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return f"the model code of {text_model_type!r} ({name}) is not installed"
    try:
        tree = ast.parse(_read_source(spec.origin))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as e:
        # a frozen app keeps transformers as bytecode only: SOURCELESS (config_problem then admits the
        # tested families, whose model code the bundle was built with)
        return f"{SOURCELESS}: the model code of {text_model_type!r} cannot be read ({type(e).__name__})"
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if base not in classes:
        return f"the model code of {text_model_type!r} does not define {base}"

    def method(cls: ast.ClassDef, fname: str):
        return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == fname), None)

    def bases_of(cname: str) -> list[str]:
        cls = classes[cname]
        return [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]

    def built_by(cname: str) -> set[str]:
        """Module classes named in ``cname``'s __init__ (and its in-module bases' __init__)."""
        out: set[str] = set()
        for c in [cname, *bases_of(cname)]:
            init = method(classes[c], "__init__")
            if init is not None:
                out |= {n.id for n in ast.walk(init) if isinstance(n, ast.Name) and n.id in classes}
            out |= set(bases_of(c))
        return out

    seen, todo = set(), [base]
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        todo.extend(built_by(c) - seen)

    def forward_src(cname: str) -> ast.FunctionDef | None:
        for c in [cname, *bases_of(cname)]:
            fwd = method(classes[c], "forward")
            if fwd is not None:
                return fwd
        return None

    attn, other, keywords = [], [], set()
    causal: bool | None = True
    for c in sorted(seen):
        fwd = forward_src(c)
        if fwd is None:
            continue
        uses = any(isinstance(n, ast.Name) and n.id == "ALL_ATTENTION_FUNCTIONS" for n in ast.walk(fwd))
        if uses:
            attn.append(c)
            for call in ast.walk(fwd):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "attention_interface"
                ):
                    keywords |= {k.arg for k in call.keywords if k.arg}
            init = method(classes[c], "__init__")
            for node in ast.walk(init) if init is not None else ():
                if (
                    isinstance(node, ast.Assign)
                    and any(
                        isinstance(t, ast.Attribute)
                        and t.attr == "is_causal"
                        and isinstance(t.value, ast.Name)
                        for t in node.targets
                    )
                    and not (isinstance(node.value, ast.Constant) and node.value.value is True)
                ):
                    causal = None
        elif c.endswith("Attention"):
            other.append(c)
    # a wrapper (BertAttention builds BertSelfAttention and calls it) is not an attention of its own
    other = [c for c in other if not (built_by(c) & set(attn))]
    backend = any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_supports_attention_backend" for t in n.targets)
        and isinstance(n.value, ast.Constant)
        and n.value.value is True
        for cls in classes.values()
        for n in cls.body
    )
    return FamilyCode(
        model_type=text_model_type,
        module=name,
        text_model=base,
        attention_classes=tuple(attn),
        other_attention=tuple(other),
        keywords=frozenset(keywords),
        causal=causal,
        supports_backend=backend,
    )


def config_problem(config) -> str | None:
    """Why AttnScope's attention path cannot run the decoder of the transformers ``config`` (one line,
    starting with its model_type), None when the rule admits it (module docstring). The language
    model of a multimodal config is judged (its text config)."""
    from attnscope.core.arch import ATTENTION_KINDS, layer_kinds_of

    mt = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        return f"{mt} is not supported: it is an encoder-decoder model; AttnScope runs decoder-only language models"
    text = text_config_of(config)
    tmt = getattr(text, "model_type", mt) or mt
    code = family_code(tmt)
    if isinstance(code, str) and code.startswith(SOURCELESS) and mt in TESTED_FAMILIES:
        return None  # no source to read (a packaged app): a family proven exact runs
    multimodal = text is not config or getattr(config, "vision_config", None) is not None
    if multimodal and mt not in TESTED_FAMILIES:
        # The wrapper may change what its language model does with text alone (PaliGemma attends both
        # ways over the prompt, Aya Vision scales the logits): only the wrappers proven equal to the full
        # model on text (tests/core/test_families.py, tests/core/test_hybrid.py) run.
        return (
            f"{mt} is not supported: AttnScope runs the language model of a multimodal checkpoint only for "
            "the families tested equal to the whole model on text prompts, and this one is not among them"
        )
    if isinstance(code, str):
        return f"{mt} is not supported: {code}"
    if not code.attention_classes:
        return (
            f"{mt} is not supported: its layers do not call transformers' attention interface "
            "(ALL_ATTENTION_FUNCTIONS), the seam AttnScope's attention function captures through"
        )
    for kw in sorted(code.keywords):
        if kw in PATH_LACKS:
            return f"{mt} is not supported: {PATH_LACKS[kw]}"
    kinds = layer_kinds_of(text)
    hybrid = any(k not in ATTENTION_KINDS for k in kinds)
    if code.other_attention and not hybrid:
        return (
            f"{mt} is not supported: {code.other_attention[0]} computes attention itself, not through "
            "transformers' attention interface"
        )
    if code.causal is None and getattr(text, "is_decoder", None) is False:
        return f"{mt} is not supported: its attention is bidirectional (an encoder); AttnScope runs causal decoders"
    return None


@lru_cache(maxsize=256)
def model_type_problem(model_type: str) -> str | None:
    """:func:`config_problem` for the default config of ``model_type``; one line when transformers
    does not know the name."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(model_type)
    except (ValueError, KeyError, TypeError):
        return f"architecture {model_type!r} is not supported: transformers does not know it"
    except Exception as e:  # noqa: BLE001 - a config class that needs arguments: one line, never a crash
        return (
            f"architecture {model_type!r} is not supported: its config cannot be built ({type(e).__name__})"
        )
    return config_problem(config)


_dict_memo: dict[str, str | None] = {}


def dict_problem(cfg: dict) -> str | None:
    """:func:`config_problem` for a parsed ``config.json`` (built with ``AutoConfig.for_model(**cfg)``,
    so a multimodal checkpoint's ``text_config`` is judged as it will load); a config transformers
    cannot build is judged by its model_type alone (:func:`model_type_problem`). Memoised by content."""
    import json

    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt:
        return "config.json has no model_type: not a transformers model config"
    try:
        key = json.dumps(cfg, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return model_type_problem(mt)
    if key not in _dict_memo:
        why = model_type_problem(mt)
        if why is None or "transformers does not know" not in why:
            try:
                import logging

                from transformers import AutoConfig

                logging.getLogger("transformers").setLevel(logging.ERROR)
                why = config_problem(AutoConfig.for_model(**cfg))
            except Exception:  # noqa: BLE001 - a value the class refuses: the family's verdict stands
                pass
        _dict_memo[key] = why
    return _dict_memo[key]


def check_model_type(model_type: str) -> None:
    """Raise :class:`UnsupportedModelError` with :func:`model_type_problem`'s line, if any."""
    why = model_type_problem(model_type)
    if why:
        raise UnsupportedModelError(why)


def loaded_problem(model) -> str | None:
    """The module-tree half of the rule, on a loaded model: at least one module of an attention class
    (:func:`family_code`) is in it; one line when none is (the model is not the family's own code)."""
    config = getattr(model, "config", None)
    code = family_code(getattr(text_config_of(config), "model_type", "") or "")
    if isinstance(code, str):
        return None if code.startswith(SOURCELESS) else code
    names = set(code.attention_classes)
    if not any(type(m).__name__ in names for m in model.modules()):
        return (
            f"{getattr(config, 'model_type', '?')}: none of its modules is an attention class that calls "
            f"transformers' attention interface ({', '.join(sorted(names))})"
        )
    return None
