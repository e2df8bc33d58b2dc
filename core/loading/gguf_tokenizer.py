"""A GGUF's tokenizer with the pre-tokenizer its file names (``tokenizer.ggml.pre``).

A byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``) is only half a tokenizer: the text
is first split into words by a pattern, and the merges were learned inside those words. The file
names that pattern by a word llama.cpp maps to a list of regular expressions
(``src/llama-vocab.cpp``: ``tokenizer_pre == "smollm"`` → ``LLAMA_VOCAB_PRE_TYPE_SMOLLM`` →
``regex_exprs``). transformers' GGUF tokenizer (``integrations/gguf/gguf_tokenizer_mapping.py``)
knows a few of those words and falls back to GPT-2's pattern for every other, so a SmolLM2 file
(``smollm``: every digit on its own, then GPT-2's pattern) tokenizes ``"Total:   1234 items"``
differently from the tokenizer the model was trained with.

:data:`PRE_TOKENIZERS` reproduces, for every word llama.cpp maps that the families AttnScope runs
use, the original tokenizer's pre-tokenizer: where the published ``tokenizer.json`` uses
tokenizers' own pieces (``Digits(individual_digits=True)`` + ``ByteLevel`` for SmolLM and
StarCoder; ``ByteLevel`` for GPT-2) those; elsewhere ``Split(pattern, "isolated")`` per llama.cpp
regex, then ``ByteLevel(use_regex=False)``. A word not in the table keeps transformers' choice and
says so in one note (:func:`fix_tokenizer`). SentencePiece vocabularies (``"llama"``: Llama 2,
Mistral v0.1-v0.3, Gemma, Phi-3) have no pre-tokenizer in llama.cpp and are left as transformers
builds them.
"""

from __future__ import annotations

from pathlib import Path

# GPT-2's pattern (llama.cpp LLAMA_VOCAB_PRE_TYPE_GPT2; tokenizers' ByteLevel(use_regex=True))
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# the original patterns of the Llama 3 / Qwen2 / Tekken / GPT-4o tokenizer.json files, of which
# llama.cpp's are rewrites without (?i:...) (same matches)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SEED_CODER = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
    r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]

# llama.cpp's word -> ("bytelevel" | "digits" | list of regexes split in turn)
_GROUPS: list[tuple[tuple[str, ...], str | list[str]]] = [
    (
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        [_LLAMA3],
    ),
    (("jina-v5-nano", "dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), [_LLAMA3]),
    (
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
        [_QWEN2],
    ),
    (("qwen35",), [_QWEN35]),
    (("tekken",), [_TEKKEN]),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), [_GPT4O]),
    (("seed-coder",), [_SEED_CODER]),
    (("grok-2",), [_QWEN2]),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _DEEPSEEK3),
    (
        ("deepseek-coder",),
        [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    ),
    (("falcon",), [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"]),
    (("poro-chat", "bloom", "gpt3-finnish"), [r" ?[^(\s|.,!?…。，、।۔،)]+"]),
    (("viking",), [r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"]),
    (
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
        "digits",
    ),
    (
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ),
        "bytelevel",
    ),
    # a file that names no particular pre-tokenizer: llama.cpp's fallback regexes
    (("default",), [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]),
]
#: ``tokenizer.ggml.pre`` -> how its text is split before the merges (see the module docstring)
PRE_TOKENIZERS: dict[str, str | list[str]] = {name: spec for names, spec in _GROUPS for name in names}
#: words for which llama.cpp matches a whole word to a token before any merge (``ignore_merges``)
IGNORE_MERGES = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}
    | {"tekken"}
)


def pre_tokenizer(spec: str | list[str]):
    """The ``tokenizers`` pre-tokenizer for one :data:`PRE_TOKENIZERS` entry."""
    from tokenizers import Regex, pre_tokenizers

    if spec == "bytelevel":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if spec == "digits":  # SmolLM2's / StarCoder's tokenizer.json
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def fix_tokenizer(tok, metadata: dict) -> list[str]:
    """Give transformers' GGUF tokenizer ``tok`` the pre-tokenizer ``metadata`` names (in place).

    Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are changed.

    Returns:
        One note when the file's ``tokenizer.ggml.pre`` is missing or not in :data:`PRE_TOKENIZERS`
        (the split transformers chose is kept, and the note says tokens may differ); else ``[]``.
    """
    if str(metadata.get("tokenizer.ggml.model", "")) != "gpt2":
        return []
    pre = str(metadata.get("tokenizer.ggml.pre", "") or "")
    rust_tok = tok.backend_tokenizer  # the tokenizers-library object
    spec = PRE_TOKENIZERS.get(pre)
    if spec is None:
        what = f"pre-tokenizer {pre!r}" if pre else "no pre-tokenizer (tokenizer.ggml.pre)"
        return [
            f"the file names {what}, which AttnScope does not reproduce: text is split with GPT-2's "
            "pattern, so tokens may differ from the original tokenizer's"
        ]
    rust_tok.pre_tokenizer = pre_tokenizer(spec)
    if pre in IGNORE_MERGES and hasattr(rust_tok.model, "ignore_merges"):
        rust_tok.model.ignore_merges = True
    return []


def gguf_tokenizer(path: Path):
    """``(tokenizer, notes)``: transformers' tokenizer of the GGUF at ``path``, fixed by :func:`fix_tokenizer`."""
    from attnscope.core.loading.gguf_meta import read_gguf_header
    from transformers import AutoTokenizer

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    notes = fix_tokenizer(tok, read_gguf_header(path).metadata)
    return tok, notes
