"""What the model catalog says about one model on disk, before anything loads (:class:`CatalogEntry`).

Qt-free. Entries are made by :mod:`attnscope.core.loading.describe_model` (one folder or GGUF file)
and listed by :mod:`attnscope.core.loading.catalog` (every source).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogEntry:
    """One model found on disk. Counts are 0 where the metadata does not say; sizes in bytes.

    ``model_ref`` is what :meth:`attnscope.core.session.Session.load` takes (``"default"`` for the
    embedded model, else the folder or file path).
    """

    source: str  # one of attnscope.core.loading.catalog.SOURCES
    name: str
    path: Path  # HF model folder, or the .gguf file (an Ollama blob has no suffix)
    format: str  # "hf" or "gguf" ("json": a damaged models.json, listed to say so)
    architecture: str  # transformers model_type ("llama", "qwen3", ...), "" if unreadable
    n_params: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_context: int
    dtype: str  # torch dtype name for folders ("bfloat16"), quantisation for GGUF ("Q4_K_M")
    size_bytes: int
    supported: bool
    reason: str = ""  # why not, one line ("" when supported)
    sliding_window: int | None = None
    model_ref: str = ""
    checkpoint_dtype: str = (
        ""  # the file's own float precision (attnscope.core.loading.precision): "bfloat16", "float32"...
    )
    quantised: bool = (
        False  # weight matrices stored quantised: a GGUF (Q4_0, Q8_0, Q4_K...), an mlx-lm folder
    )
    # what is incomplete or left out beside a listed model, one line ("" when nothing): an unfinished
    # download in its Hugging Face cache repo, a dangling README link, a second copy of the weights not read
    note: str = ""
    # backend name -> why that backend cannot open this very file (an mlx-lm quantised folder on torch),
    # for the backends that refuse it while another one runs it; family rules are in backend_registry.problem
    refused_by: tuple[tuple[str, str], ...] = ()
    # what its attention is (attnscope.core.loading.attention_kind.describe): "GQA 32/4 · 128 experts, 8 active"
    attention_kind: str = ""
    n_experts: int = 0  # routed experts per MoE layer (0: dense) and experts per token
    experts_active: int = 0
    kv_latent_dim: int = 0  # MLA latent per token and layer (0: not MLA), and its decoupled RoPE key
    rope_head_dim: int = 0
    text_only: bool = (
        False  # a multimodal checkpoint: only its language model loads (n_params counts it alone)
    )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group size); 0 when unknown."""
        return self.n_heads // self.n_kv_heads if self.n_heads and self.n_kv_heads else 0

    def problem_on(self, backend: str) -> str | None:
        """Why ``backend`` cannot open this model (one line), None when it can: the entry is not
        supported at all (:attr:`reason`), that backend refuses this file (:attr:`refused_by`: the
        same check :func:`attnscope.core.loading.checks.check_hf_folder` makes at load time for
        that backend), or its family (:func:`attnscope.core.backend_registry.problem`)."""
        from attnscope.core.backend_registry import problem

        if not self.supported:
            return self.reason or "not supported"
        why = dict(self.refused_by).get(backend)
        return why if why else problem(self.architecture, backend)
