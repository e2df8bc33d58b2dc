"""The torch backend: transformers models running through AttnScope's registered attention function.

:mod:`attnscope.core.backends.hf_attention` puts :func:`attnscope_attention` in transformers'
attention interface; :func:`attnscope.core.backends.torch_load.load_torch` loads a model with it, and
:class:`TorchBackend` points every attention module at its :class:`attnscope.core.trace.torch_trace.TorchTrace`,
which the function fills with the new query rows and their LSE. A padding mask, a custom 4-d mask
or a batch of several sequences is refused with one line (:data:`attnscope.core.ids.BATCH_REFUSAL`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from attnscope.core import backend_registry as registry
from attnscope.core.attention.rope_length import LengthDependentRope, RopeRecompute
from attnscope.core.backends.base import PREFILL_CHUNK as BASE_CHUNK
from attnscope.core.backends.base import chunked_forward
from attnscope.core.backends.hf_attention import (  # noqa: F401 (re-exported: the torch seam's names)
    ATTN_NAME,
    attnscope_attention,
    attnscope_mask,
    register_attention,
)
from attnscope.core.backends.recurrent_state import StateRecompute, StateSnapshots, state_layer_bytes
from attnscope.core.errors import ModelLoadError, UnsupportedModelError
from attnscope.core.ids import as_token_ids
from attnscope.core.trace import finite
from attnscope.core.trace.torch_trace import TorchTrace

PREFILL_CHUNK = BASE_CHUNK  # tokens per prefill chunk (this module's name: tests set it per backend)
# ModelInfo.load_note of a hybrid model: how step back treats its recurrent/conv states
STEP_BACK_NOTE = "step back restores the recurrent/conv states from a copy kept per step (re-runs from the nearest copy when none)"


def pick_device(requested: str | None = None) -> str:
    """``requested`` if given and usable, else ``"cuda"`` when torch sees a GPU, else ``"cpu"``.

    Raises:
        ModelLoadError: ``requested`` is not a torch device string (``cpu``, ``cuda``, ``cuda:N``,
            ``mps``…), or names a device this machine or this torch build does not have.
    """
    if not requested:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(requested)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {requested!r}: use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
            raise ModelLoadError(f"device {requested!r} is not available: {why}; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {requested!r} is not available: torch sees {torch.cuda.device_count()} CUDA GPU(s)"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {requested!r} is not available on this machine; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"device {requested!r} is not supported: use cpu, cuda, cuda:N or mps")
    return requested


class TorchBackend:
    """Owns a transformers model, its KV cache and the Trace. Not thread-safe: one engine thread.

    Implements :class:`attnscope.core.backends.base.Backend`."""

    name = registry.name_for(__name__, "TorchBackend")
    supports_overrides = True  # fork(overrides=...): experiments change mask and scale per layer

    def __init__(self, model, tokenizer, info, device: str = "cpu"):
        from transformers import DynamicCache

        self.model, self.tokenizer, self.info, self.device = model, tokenizer, info, device
        self.memo: dict = {}  # analyses' results that depend on the model alone (Backend.memo)
        self._DynamicCache = DynamicCache
        # transformers renamed past_key_values -> cache (deprecated in 5.2x, removed in 5.40)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        arch = info.arch
        self.trace = TorchTrace(info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim, arch.layer_kinds)
        # A hybrid model (docs/how-it-works.md "Hybrid models") has softmax attention in arch.attention_layers only; its
        # linear-attention / Mamba / convolution modules run as transformers runs them, states in the cache.
        found = []
        for mod in model.modules():
            if type(mod).__name__.endswith("Attention") and hasattr(mod, "layer_idx"):
                mod._attnscope_trace = self.trace
                found.append(int(mod.layer_idx))
        if not arch.attention_layers:
            raise UnsupportedModelError(
                f"{info.name} has no softmax-attention layer ({arch.n_layers} layers of "
                f"{', '.join(sorted(set(arch.layer_kinds)))}): there is no attention map to inspect"
            )
        if sorted(found) != list(arch.attention_layers):
            want = len(arch.attention_layers)
            raise UnsupportedModelError(
                f"found {len(found)} attention modules with a layer index, expected {want}: this family's layout is not supported"
            )
        self.hybrid = arch.is_hybrid
        self.snapshots = StateSnapshots()  # recurrent/conv states per length, for step back (hybrid only)
        if self.hybrid and STEP_BACK_NOTE not in info.load_note:
            self.info = info = dataclasses.replace(
                info, load_note="; ".join(n for n in (info.load_note, STEP_BACK_NOTE) if n)
            )
        finite.watch_layers(model)  # hidden states checked as they happen (attnscope.core.trace.finite)
        # RoPE whose frequencies depend on the length (LongRoPE, dynamic NTK): see attnscope.core.attention.rope_length
        self.rope = LengthDependentRope(model)
        # The sequence length whose length-dependent RoPE frequencies every forward uses, at least: 0 for
        # a session's own backend; a fork's is the length of the backend it was forked from, so that a
        # prefix re-run there is rotated as that sequence was (fork, forward)
        self.rope_floor = 0
        self.notices: list[RopeRecompute | StateRecompute] = []  # KV-cache recomputes of the current sequence
        # Chunked attention (Llama 4: layer_types "chunked_attention", attention_chunk_size): its mask
        # equals the causal one up to one chunk, and our attention function applies only causal +
        # window, so sequences longer than a chunk are refused rather than run with the wrong mask.
        cfg = getattr(model, "config", None)
        chunked = "chunked_attention" in (getattr(cfg, "layer_types", None) or ())
        self.attention_chunk = getattr(cfg, "attention_chunk_size", None) if chunked else None
        self.reset()

    @classmethod
    def load(
        cls,
        model=None,
        device: str | None = None,
        dtype: str = "auto",
        progress=None,
        quantize: str = "none",
        device_map=None,
        max_memory: dict | None = None,
    ) -> TorchBackend:
        """Load for torch on ``device``, or spread over devices with ``device_map`` (then the ids
        go to the input embeddings' device: :func:`attnscope.core.loading.device_map.input_device`).

        Raises:
            ModelLoadError: as :func:`attnscope.core.backends.torch_load.load_torch`; also a checkpoint
                whose weights do not cover config.json (tensors that would be random: ``config.json
                says 40 layers but the weights hold 30``) or whose shapes differ from it (the tensor
                and both shapes), from transformers' own loading report
                (:mod:`attnscope.core.loading.load_report`).
        """
        from attnscope.core.backends.torch_load import load_torch
        from attnscope.core.loading import load_report
        from attnscope.core.loading.device_map import input_device

        device = pick_device(device)
        with load_report.collect() as reports:
            try:
                m, tok, info = load_torch(
                    model,
                    device=device,
                    dtype=dtype,
                    progress=progress or (lambda *_: None),
                    quantize=quantize,
                    device_map=device_map,
                    max_memory=max_memory,
                )
            except ModelLoadError as e:
                why = load_report.mismatch_message(reports)
                if why is None:
                    raise
                raise ModelLoadError(f"{str(e).partition(': ')[0]}: {why}") from None
        names = [k for k, _ in m.named_parameters(remove_duplicate=False)]  # names only: nothing materialised
        why = load_report.missing_message(reports, names, info.n_layers)
        if why is not None:
            raise ModelLoadError(f"cannot load {info.name}: {why}")
        if device_map is not None:
            device = input_device(m)
        return cls(m, tok, info, device)

    def reset(self) -> None:
        # A plain DynamicCache (no config) keeps every position in every layer, also for
        # sliding-window layers: key index == position, and our function applies the window.
        self._clear()
        self.notices = []

    def _cache_layers(self) -> list[Any]:
        """The DynamicCache's layers: transformers types them as a union that includes linear-attention
        layers without ``keys``/``values``; a plain DynamicCache of the families we run holds
        DynamicLayers, whose ``keys``/``values`` are ``(1, n_kv_heads, S, D)`` tensors once filled."""
        return self.cache.layers

    def _new_cache(self):
        """An empty cache: a plain ``DynamicCache`` (every position of every layer kept, also for
        sliding-window layers), or for a hybrid model one with a ``LinearAttentionLayer`` (recurrent /
        conv states) for each layer with no map, a full ``DynamicLayer`` for each attention layer, and both
        for Falcon-H1's attention + Mamba layers (the layer classes transformers' own
        ``DynamicCache(config=...)`` picks, windows left to our attention function)."""
        cache = self._DynamicCache()
        if not self.hybrid:
            return cache
        from transformers.cache_utils import (
            DynamicLayer,
            LinearAttentionAndFullAttentionLayer,
            LinearAttentionLayer,
        )

        cfg = getattr(self.model, "config", None)
        text = (
            cfg.get_text_config(decoder=True) if cfg is not None and hasattr(cfg, "get_text_config") else cfg
        )
        n_states = int(getattr(text, "number_of_conv_states", 1) or 1)
        arch = self.info.arch
        layers: list[Any] = []
        for i in range(arch.n_layers):
            if arch.has_map(i) and arch.has_state(i):
                layers.append(LinearAttentionAndFullAttentionLayer(number_of_states=n_states))
            elif arch.has_map(i):
                layers.append(DynamicLayer())
            else:
                layers.append(LinearAttentionLayer(number_of_states=n_states))
        cache.layers = layers
        cache.layer_class_to_replicate = None
        return cache

    def _clear(self) -> None:
        self.cache = self._new_cache()
        self.snapshots.clear()
        self.trace.reset()
        self.seq_len = 0
        self._ids: list[int] = []  # the ids in the cache (a length-dependent RoPE may re-run them)
        self._rope_key: tuple | None = None  # the RoPE frequencies the cache was built with

    @torch.inference_mode()
    def forward(
        self,
        ids: list[int],
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        all_logits: bool = False,
        rope_length: int | None = None,
    ) -> np.ndarray:
        """Feed ``ids`` after the cached positions; return logits, float32.

        Returns ``(vocab,)`` for the last position, or ``(len(ids), vocab)`` with ``all_logits``.
        Long inputs run in chunks of :data:`PREFILL_CHUNK`; ``progress(done, total)`` is called
        after each and ``cancelled()`` checked before each (raising :class:`Cancelled`, after
        rolling the cache back to where it was).

        A model whose RoPE frequencies depend on the length (:mod:`attnscope.core.attention.rope_length`) runs every
        chunk with the frequencies of the whole sequence; when those differ from the ones the
        cache was built with, the whole sequence is re-run from position 0 and a
        :class:`attnscope.core.attention.rope_length.RopeRecompute` is appended to :attr:`notices`.
        ``rope_length`` (at least the length reached) holds those frequencies at that many positions
        instead: a prefix rotated as the forward of a longer sequence rotated it. Its default is
        :attr:`rope_floor`: on a :meth:`fork`, the length of the sequence it was forked from, so that an
        analysis re-running a prefix there (the source split of a score, head effects) gets the
        frequencies the session's own forward used without passing anything.

        Raises:
            ValueError: ``ids`` is not one flat sequence of ints (a batch is refused).
            UnsupportedModelError: a chunked-attention model past one chunk (:attr:`attention_chunk`).
            Cancelled: as above.
        """
        ids = as_token_ids(ids)
        start = self.seq_len
        if self.attention_chunk and start + len(ids) > self.attention_chunk:
            raise UnsupportedModelError(
                f"this model attends in chunks of {self.attention_chunk} tokens (attention_chunk_size), which "
                f"AttnScope's attention path does not apply: sequences up to {self.attention_chunk} tokens only"
            )
        if not self.rope.active:
            return self._run(ids, progress, cancelled, all_logits)
        total = max(start + len(ids), int(rope_length or self.rope_floor or 0))
        key = self.rope.key(total, self.device)
        if start and key != self._rope_key:  # the cached keys were rotated with other frequencies
            old = list(self._ids)
            self._clear()
            try:
                logits = self._run_at(old + ids, total, key, progress, None, all_logits)
            except BaseException:
                self._rebuild(old)
                raise
            self.notices.append(self.rope.notice(start, total))
            return logits[-len(ids) :] if all_logits else logits
        return self._run_at(ids, total, key, progress, cancelled, all_logits)

    def _run_at(self, ids, total, key, progress, cancelled, all_logits):
        """:meth:`_run` with the rotary modules held at the frequencies of ``total`` positions."""
        self.rope.target = total
        try:
            out = self._run(ids, progress, cancelled, all_logits)
        finally:
            self.rope.target = None
        self._rope_key = key
        return out

    @torch.inference_mode()
    def _rebuild(self, ids: list[int]) -> None:
        """Run ``ids`` from an empty cache (after a failed or needed recompute); empty on failure."""
        self._clear()
        if ids:
            total = max(len(ids), self.rope_floor)
            try:
                self._run_at(ids, total, self.rope.key(total, self.device), None, None, False)
            except BaseException:
                self._clear()
                raise

    def _run(self, ids, progress, cancelled, all_logits):
        """The chunk loop of :meth:`forward`."""
        start = self.seq_len
        if (
            self.trace.enabled
        ):  # one allocation for the whole capture (see attnscope.core.trace.torch_trace._RowStore)
            self.trace.reserve(start + len(ids), dtype=self.model.dtype, device=self.device)

        def run_chunk(part: Sequence[int]) -> np.ndarray:
            watch = self.trace.finite
            watch.begin(self.seq_len, self.seq_len + len(part) - 1, self.model.dtype)
            res = self.model(
                input_ids=torch.tensor([part], device=self.device),
                **{self._cache_kw: self.cache},
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
            )
            self.seq_len += len(part)
            self._ids += part
            watch.check(None, "logits", res.logits)
            logits = res.logits[0].float().cpu().numpy()
            finite.note(self.notices, watch)  # the first non-finite tensor, said once
            return logits

        out = chunked_forward(
            ids, PREFILL_CHUNK, run_chunk, lambda: self._rollback(start), progress, cancelled, all_logits
        )
        if self.hybrid:  # the states after this forward, for a step back to this length
            self.snapshots.take(self.seq_len, self.cache)
        return out

    def _rollback(self, start: int) -> None:
        """Put the cache and Trace back to ``start`` positions after a failed or cancelled forward. A hybrid
        model's states may have moved even when no chunk finished (a layer ran before the error), so they
        are restored from the copy at ``start`` whatever ``seq_len`` says."""
        if not self.hybrid:
            self.truncate(start)
        elif start <= 0:
            self.reset()
        elif self.snapshots.nearest(start) == start:
            self.snapshots.restore(start, self.cache)
            self._crop(start)
        else:
            self._rebuild(self._ids[:start])

    def truncate(self, n: int) -> None:
        """Drop positions ``>= n`` from the KV cache and the Trace (nothing is recomputed, unless a
        length-dependent RoPE uses other frequencies at ``n`` positions: then the ``n`` positions are
        re-run and a notice recorded, see :meth:`forward`)."""
        if n >= self.seq_len:
            return
        if n <= 0:
            self.reset()
            return
        if self.rope.active and self.rope.key(max(n, self.rope_floor), self.device) != self._rope_key:
            before = self.seq_len
            self._rebuild(self._ids[:n])
            self.notices.append(self.rope.notice(before, n))
            return
        if self.hybrid:
            self._truncate_states(n)
            return
        self._crop(n)

    def _crop(self, n: int) -> None:
        """Cut the KV cache's K/V tensors and the Trace to ``n`` positions (``0 < n < seq_len``)."""
        self._ids = self._ids[:n]
        # Crop each layer's tensors ourselves: DynamicCache.crop's argument changed meaning across
        # transformers 5.x releases (final length vs. tokens to remove).
        layers = self._cache_layers()
        for cl in layers:
            if getattr(cl, "keys", None) is not None and cl.keys.numel():
                cl.keys = cl.keys[..., :n, :]
                cl.values = cl.values[..., :n, :]
        self.trace.truncate(n)
        # the trace's key references must follow the cropped cache tensors
        for layer in self.trace.arch.attention_layers:
            self.trace.layers[layer].keys = layers[layer].keys[0]
        self.seq_len = n

    @torch.inference_mode()
    def _truncate_states(self, n: int) -> None:
        """Step back a hybrid model to ``n`` positions (:mod:`attnscope.core.backends.recurrent_state`):
        restore the recurrent/conv states copied at ``n``; with no copy there, restore the nearest earlier
        copy and re-run the tokens up to ``n`` (a :class:`StateRecompute` notice)."""
        ids = list(self._ids[:n])
        m = self.snapshots.nearest(n)
        if m is None or m == 0:
            self._clear()
            self._ids = []
            m = 0
        else:
            self.snapshots.restore(m, self.cache)
            self._crop(m)
        if m < n:
            self._run(ids[m:], None, None, False)
            self.notices.append(StateRecompute(m, n))

    @torch.inference_mode()
    def value_norms(self, layer: int) -> np.ndarray:
        """``‖v_j W_O^h‖`` for every query head ``h`` and cached key ``j`` of ``layer``: ``(n_heads, seq_len)``
        float32 (see :mod:`attnscope.core.analysis.value_weighted`; Kobayashi et al. 2020). From the KV cache's values and
        the layer's output projection, in float32.

        Raises:
            IndexError: ``layer`` out of range. RuntimeError: nothing cached yet.
            UnsupportedModelError: the attention module has no ``o_proj``/``c_proj``/``dense``.
        """
        if not 0 <= layer < self.info.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.info.n_layers - 1}")
        self.info.arch.check_map(layer)  # NoAttentionMap: a hybrid model's layer without softmax attention
        if self.seq_len == 0 or len(self.cache.layers) <= layer:
            raise RuntimeError("nothing cached yet: run a prompt first")
        mod = next(
            m
            for m in self.model.modules()
            if getattr(m, "_attnscope_trace", None) is self.trace and getattr(m, "layer_idx", None) == layer
        )
        cl = self._cache_layers()[layer]
        if getattr(self.info, "kv_latent_dim", 0) and hasattr(mod, "expand_kv"):
            # MLA (DeepSeek-V2/V3): the cache holds the latent and the RoPE key; the per-head values are
            # rebuilt from it as the model does (its expand_kv), (n_heads, S, v_head_dim)
            _k, v = mod.expand_kv(cl.keys[:, :, : self.seq_len], cl.values[:, :, : self.seq_len])
            values = v[0].float()
        else:
            values = cl.values[0, :, : self.seq_len].float()  # (n_kv_heads, S, D)
        proj = next((getattr(mod, n) for n in ("o_proj", "c_proj", "dense") if hasattr(mod, n)), None)
        if proj is None:
            raise UnsupportedModelError(f"{type(mod).__name__} has no output projection AttnScope knows")
        w = proj.weight
        if type(w) in (torch.Tensor, torch.nn.Parameter):
            w = w.float().T if type(proj).__name__ == "Conv1D" else w.float()  # GPT-2's Conv1D: (in, out)
        else:  # a quantised weight (torchao tensor subclass): read W back through the layer itself
            eye = torch.eye(proj.in_features, dtype=self.model.dtype, device=values.device)
            w = (proj(eye) - proj(torch.zeros_like(eye[:1]))).float().T  # (hidden, H*D), bias removed
        H, D = self.info.n_heads, values.shape[-1]
        kv = self.info.kv_head
        # v_j W_O^h = W_O[:, hD:(h+1)D] v_j: (S, D) @ (D, hidden) per head, one head at a time
        out = [
            torch.linalg.vector_norm(values[kv(h)] @ w[:, h * D : (h + 1) * D].T, dim=-1) for h in range(H)
        ]
        return torch.stack(out).cpu().numpy().astype(np.float32)  # (n_heads, S)

    def state_layer_bytes(self) -> np.ndarray:
        """Bytes each layer's recurrent / convolution states hold now (a hybrid model's linear-attention,
        Mamba and convolution layers; :mod:`attnscope.core.backends.recurrent_state`), ``(n_layers,)``
        int64; zeros for a model with attention layers only. Not part of :meth:`kv_layer_bytes`."""
        return state_layer_bytes(self.cache, self.info.n_layers)

    def kv_layer_bytes(self) -> np.ndarray:
        """Bytes each layer's K and V tensors in the ``DynamicCache`` hold now (``numel × element_size``),
        ``(n_layers,)`` int64 (a hybrid model's recurrent/conv states are :meth:`state_layer_bytes`)."""
        n = self.info.n_layers
        out = np.zeros(n, dtype=np.int64)
        for i, layer in enumerate(self.cache.layers[:n]):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None and t.numel():
                    out[i] += t.numel() * t.element_size()
        return out

    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache tensors hold now (K and V of every layer)."""
        return int(self.kv_layer_bytes().sum())

    def cache_dtype(self) -> str:
        """The cached keys' element type (``"float32"``, ``"bfloat16"``…); the model's dtype before a prompt."""
        for layer in self.cache.layers:
            k = getattr(layer, "keys", None)
            if k is not None and k.numel():
                return str(k.dtype).removeprefix("torch.")
        return str(self.info.dtype)

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window from the model's transformers config
        (:func:`attnscope.core.kv_formula.config_layer_windows`: ``layer_types`` + ``sliding_window``,
        ``use_sliding_window``, Mistral's window on every layer); no config: no windows."""
        from attnscope.core.kv_formula import config_layer_windows

        n = self.info.n_layers
        config = getattr(self.model, "config", None)
        if config is None:
            return (None,) * n
        config = getattr(config, "get_text_config", lambda: config)()
        return config_layer_windows(config, n)

    @contextmanager
    def fork(self, overrides=None, capture: bool = True) -> Iterator[TorchBackend]:
        """A :class:`TorchBackend` on this model with its own empty cache and Trace (``with`` block).

        The attention modules' single ``_attnscope_trace`` attribute is pointed at the new Trace for
        the block and restored afterwards (also on error); ``overrides`` (an object with
        ``attend(...)``, :class:`attnscope.core.analysis.experiments.Overrides`) is set on that Trace and
        changes every layer's attention; ``capture=False`` records nothing (experiments need logits only).
        The fork's :attr:`rope_floor` is this backend's length: a length-dependent RoPE (LongRoPE) rotates
        whatever the fork runs with the frequencies this sequence was run with.
        """
        saved = [(m, m._attnscope_trace) for m in self.model.modules() if hasattr(m, "_attnscope_trace")]
        try:
            scratch = TorchBackend(self.model, self.tokenizer, self.info, self.device)
            scratch.trace.overrides = overrides
            scratch.trace.enabled = capture
            # a length-dependent RoPE keeps this sequence's frequencies in the fork (forward)
            scratch.rope_floor = max(self.seq_len, self.rope_floor)
            yield scratch
        finally:
            for m, t in saved:
                m._attnscope_trace = t

    def release_weights(self) -> None:
        """Drop the model (its weights); Trace, cache and logits stay, so ``trace.weights`` still works."""
        self.model = None

    def layer_matrix_params(self) -> int:
        """Elements of the decoder layers' weight matrices (2-d parameters; for ``attnscope bench``)."""
        return sum(p.numel() for p in self.model.model.layers.parameters() if p.dim() == 2)
