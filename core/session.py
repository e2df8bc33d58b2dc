"""The headless session API that the GUI and the CLI both drive.

    s = Session.load()                      # embedded SmolLM2-135M-Instruct on CUDA or CPU
    s.prefill("The cat sat on the mat.")    # tokens, KV cache, Trace filled
    s.step(3)                               # three decode steps (greedy by default)
    w = s.weights(layer=3, head=4)          # (seq_len, seq_len) float32, exact
    s.kv_cache_bytes()                      # 2 × L × n_kv_heads × head_dim × seq_len × bytes

Order of a step (mlx-lm ``generate_step``, gpt-fast ``decode_one_token``): the next token is
chosen from the last logits, appended, then run through the model, so after prefill + N steps
the Trace holds ``len(prompt) + N`` rows and every shown token has its own attention row.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

import numpy as np
from attnscope.core import backend_registry as registry
from attnscope.core.checks import flag, in_range, index, span, whole
from attnscope.core.errors import BadArgument, OutOfRange, SessionError, WrongType
from attnscope.core.ids import BATCH_REFUSAL as _BATCH
from attnscope.core.ids import as_token_ids
from attnscope.core.kv_formula import kv_cache_bytes as kv_formula
from attnscope.core.loading.model_info import ModelInfo
from attnscope.core.sampling import GREEDY, Sampling, choose, softmax
from attnscope.core.tokens import NO_TOKENS, Token, decode_text, roundtrip_notice, token_text


@dataclass(frozen=True)
class TopToken:
    """One entry of the next-token distribution."""

    id: int
    text: str
    prob: float


@dataclass(frozen=True)
class Snapshot:
    """Immutable picture of a session after a command, safe to hand to the GUI thread."""

    info: ModelInfo
    backend: str
    device: str
    tokens: tuple[Token, ...]
    n_prompt: int
    prompt: str | None
    chat_template: bool
    kv_cache_bytes: int
    notices: tuple[str, ...] = ()  # Session.notices as one line each (e.g. a RoPE cache recompute)
    #: each layer's sliding window in tokens (None: causal only), as the backend's ``layer_windows()``;
    #: () when unknown (an older engine)
    layer_windows: tuple[int | None, ...] = ()
    #: the softmax variant as the forwards ran (:mod:`attnscope.core.trace.softmax_variant`): the
    #: attention-logit cap (Gemma 2) or None, and whether learned sinks (gpt-oss) join the denominator
    softcap: float | None = None
    learned_sinks: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.tokens)

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.n_prompt


class Session:
    """A loaded model plus one running sequence. Single-threaded: call it from one thread."""

    #: after :meth:`prefill`: one line when the tokenizer drops or replaces characters of the prompt
    #: (:func:`attnscope.core.tokens.roundtrip_notice`), else None
    notice: str | None = None

    def __init__(self, backend):
        self.backend = backend
        self.info: ModelInfo = backend.info
        self.tokenizer = backend.tokenizer
        self.trace = backend.trace
        self.prompt: str | None = None
        self.chat_template = False
        self.sampling: Sampling = GREEDY
        self._ids: list[int] = []
        self._n_prompt = 0
        self._logits: np.ndarray | None = None
        self._logits_history: list[np.ndarray] = []  # logits after each position fed (for step back)

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        model: str | os.PathLike | None = None,
        backend: str = registry.DEFAULT,
        device: str | None = None,
        dtype: str = "auto",
        progress: Callable[[str, float], None] | None = None,
        quantize: str = "none",
        device_map: str | dict | None = None,
    ) -> Self:
        """Load ``model`` (None = embedded default) on ``backend`` ("torch" or "mlx"), as an
        instance of the class it is called on (``attnscope.Session.load()`` gives the public subclass
        with the analyses as methods, :mod:`attnscope.core.analysis.methods`).

        ``dtype``: ``auto`` (the checkpoint's own precision; :func:`attnscope.core.loading.precision.decide`, which
        says why in ``info.dtype_reason``), ``float32``, ``bfloat16`` or ``float16``.

        ``quantize``: ``none|int8|int4`` weight-only quantisation of the linear layers
        (:mod:`attnscope.core.loading.quantize` for torch; ``mlx.nn.quantize`` for MLX).

        ``device_map``: ``auto|balanced|sequential`` (torch only, :mod:`attnscope.core.loading.device_map`): layers
        across GPUs, then CPU, then disk, through accelerate.

        The backend comes from :mod:`attnscope.core.backend_registry` (``backend`` is its name);
        options it does not take are not passed (MLX picks its own device).

        Raises:
            ModelLoadError: the model reference is unusable (message says why).
            SessionError: unknown backend, or an option the backend refuses (``device_map`` on MLX).
        """
        import gc
        import threading

        from attnscope.core.backend_registry import get
        from attnscope.core.loading.lean_import import prepare
        from attnscope.core.loading.quiet import quiet_imports

        quiet_imports()  # before any backend imports transformers (and with it torchao)
        prepare()  # transformers' import without a second model-zoo scan, torchao, accelerate
        spec = get(backend)  # SessionError: unknown backend
        if progress is not None:  # its imports (torch, transformers) take most of a start: said, bar still
            progress(f"Loading the {backend} backend…", 0.0)
        # the imports and the load allocate millions of long-lived objects: the collector's passes
        # over them would only find them alive (docs/benchmarks.md, start-up). Only the main thread
        # pauses it: a load on another thread (the window's engine) leaves the collector as the
        # window set it (attnscope.app.engine collects on the GUI thread only, so Qt objects are never
        # freed on another thread), and a load there must not switch it back on when it ends.
        collecting = gc.isenabled() and threading.current_thread() is threading.main_thread()
        if collecting:
            gc.disable()
        try:
            return cls(
                spec.load(
                    model,
                    device=device,
                    dtype=dtype,
                    progress=progress,
                    quantize=quantize,
                    device_map=device_map,
                )
            )
        finally:
            if collecting:
                gc.enable()

    # -- running -----------------------------------------------------------------------------
    def encode(self, prompt: str, chat_template: bool = True) -> list[int]:
        """Token ids of ``prompt``, wrapped in the model's chat template when asked and available."""
        if chat_template and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=True)]

    def prefill(
        self,
        prompt: str | list[int],
        chat_template: bool = True,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        all_logits: bool = False,
    ) -> list[Token]:
        """Start a new sequence: tokenize ``prompt`` and run it through the model. ``prompt`` may also be
        a list of token ids, fed as they are (no chat template; :attr:`prompt` becomes their decoded text).

        With ``all_logits`` every prompt position's logits are kept too (``n_prompt × vocab``
        float32, for :meth:`position_logits`; Compare needs them).

        Raises:
            SessionError: empty prompt, or longer than the model's context.
            WrongType: a prompt that is not a string, ``chat_template``/``all_logits`` not a bool.
            Cancelled: ``cancelled()`` became true; the previous sequence is gone, the session empty.
        """
        flag("chat_template", chat_template)  # WrongType: "no" would read as True
        flag("all_logits", all_logits)
        nested = isinstance(prompt, list | tuple | np.ndarray) and any(
            isinstance(x, str | list | tuple | np.ndarray) for x in prompt
        )
        if isinstance(prompt, list | tuple | np.ndarray) and not nested:
            try:  # token ids, fed as they are (no chat template), as TransformerLens users pass tokens
                ids = as_token_ids(prompt, self.info.vocab_size)
            except ValueError as e:
                raise BadArgument(str(e)) from None
            if not ids:
                raise SessionError("the prompt is empty: give at least one token id")
            text, chat_template = str(self.tokenizer.decode(ids)), False
            self.notice = None
        elif not isinstance(prompt, str):  # a list of prompts is a batch
            raise SessionError(
                f"prefill takes one prompt (a string or token ids), got {type(prompt).__name__}: {_BATCH}"
            )
        else:
            if not prompt or not prompt.strip():
                raise SessionError("the prompt is empty: type some text first")
            ids = self.encode(prompt, chat_template)
            if not ids:
                raise SessionError(NO_TOKENS)
            text = prompt
            self.notice = roundtrip_notice(
                self.tokenizer, prompt
            )  # None, or how the tokenizer changed the text
        if self.info.max_context and len(ids) > self.info.max_context:
            raise SessionError(
                f"the prompt has {len(ids)} tokens, more than the model's context of {self.info.max_context}"
            )
        self.clear()  # a cancelled or failed forward leaves the session empty, never half old, half new
        logits = self.backend.forward(ids, progress=progress, cancelled=cancelled, all_logits=all_logits)
        self.prompt, self.chat_template = text, chat_template
        self._prompt_logits = logits if all_logits else None
        logits = logits[-1] if all_logits else logits
        self._ids = list(ids)
        self._n_prompt = len(ids)
        self._logits = logits
        self._logits_history = [logits]
        return self.tokens

    def clear(self) -> None:
        """Forget the sequence: KV cache, Trace, tokens and prompt (``seq_len`` 0, ``n_prompt`` 0).
        The model and the sampling settings stay."""
        self.backend.reset()
        self._ids, self._logits, self._logits_history = [], None, []
        self._prompt_logits = None
        self._n_prompt = 0
        self.prompt, self.chat_template = None, False

    def step(
        self,
        n: int = 1,
        sampling: Sampling | None = None,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[Token]:
        """Decode ``n`` tokens: choose from the last logits, append, run it. Returns the new tokens.

        ``progress(done, n)`` after each token; ``cancelled()`` is checked before each one after the
        first (the tokens decoded so far stay), so a long ``step(n)`` can be stopped, and an engine
        serving it notices a client that went away (:mod:`attnscope.core.remote.server`).

        Raises:
            SessionError: no prompt yet. WrongType: ``n`` not a whole number, ``sampling`` not a
            :class:`Sampling`. BadArgument: ``n < 1``, or ``seq_len + n`` past the model's context
            (refused before any step runs). Cancelled: ``cancelled()`` became true.
        """
        from attnscope.core.errors import Cancelled

        if self._logits is None:
            raise SessionError("run a prompt before stepping: call prefill(prompt) first")
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise WrongType(f"steps must be a whole number, got {type(n).__name__} {n!r}")
        n = int(n)
        if n < 1:
            raise BadArgument(f"steps must be >= 1, got {n}")
        self._check_fits(n, f"steps={n}")
        if sampling is not None:
            self._check_sampling(sampling)
            self.sampling = sampling
        new = []
        for i in range(n):
            if i and cancelled is not None and cancelled():
                raise Cancelled(f"stopped after {i} of {n} steps")
            self._check_room()
            new.append(self._decode_one(choose(self._logits, self.sampling, position=len(self._ids))))
            if progress is not None:
                progress(i + 1, n)
        return new

    def _check_fits(self, n: int, what: str) -> None:
        """Refuse ``n`` more positions (``what``, e.g. ``"steps=9000"``) up front when they do not
        fit the model's context.

        Raises:
            BadArgument: ``seq_len + n > max_context`` (message: how many fit).
        """
        ctx = self.info.max_context
        if ctx and len(self._ids) + n > ctx:
            room = ctx - len(self._ids)
            raise BadArgument(
                f"{what} does not fit the model's context of {ctx} tokens: "
                f"{len(self._ids)} are used, room for {room} more"
            )

    def _check_sampling(self, sampling) -> None:
        if not isinstance(sampling, Sampling):
            raise WrongType(f"sampling must be an attnscope.Sampling, got {type(sampling).__name__}")

    def _check_room(self) -> None:
        if self.info.max_context and len(self._ids) >= self.info.max_context:
            raise SessionError(f"the model's context of {self.info.max_context} tokens is full")

    def _decode_one(self, tid: int) -> Token:
        """Run token ``tid`` as the next decode step (one forward), keep its logits; its Token."""
        self._logits = self.backend.forward([tid])
        self._ids.append(tid)
        self._logits_history.append(self._logits)
        return self._token(len(self._ids) - 1)

    def feed(
        self,
        token_ids: list[int],
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[Token]:
        """Append given tokens as decode steps, one forward per token (replay, no sampling).

        Used to reopen a saved session: feeding the recorded ids one at a time repeats exactly the
        forwards :meth:`step` ran, so the KV cache, the Trace and every weight come out identical.
        ``progress(done, total)`` after each token; ``cancelled()`` is checked before each one (the
        tokens fed so far stay). No sampling here; draws are counter-based (seed, position), so a
        later :meth:`step` samples what the original run would have sampled next.

        Raises:
            SessionError: no prompt yet.
            BadArgument: an id outside the vocabulary, a batch, or more tokens than the model's
                context has room for (refused before any is fed).
            Cancelled: ``cancelled()`` became true.
        """
        from attnscope.core.errors import Cancelled

        if self._logits is None:
            raise SessionError("run a prompt before feeding tokens: call prefill(prompt) first")
        try:
            ids = as_token_ids(token_ids, self.info.vocab_size)  # one flat list: no batches
        except ValueError as e:
            raise BadArgument(str(e)) from None
        self._check_fits(len(ids), f"{len(ids)} token ids")
        new = []
        for i, tid in enumerate(ids):
            if cancelled is not None and cancelled():
                raise Cancelled(f"stopped after {i} of {len(ids)} tokens")
            self._check_room()
            new.append(self._decode_one(tid))
            if progress is not None:
                progress(i + 1, len(ids))
        return new

    def step_back(self, n: int = 1) -> None:
        """Undo ``n`` decode steps: the KV cache and Trace are truncated, nothing recomputed.

        Raises:
            WrongType: ``n`` not a whole number. OutOfRange: ``n`` outside ``1 .. n_generated``.
        """
        n = whole("n", n)
        if not self.n_generated:
            raise OutOfRange(f"cannot step back n={n}: no generated tokens yet (prefill keeps the prompt)")
        if n < 1 or n > self.n_generated:
            raise OutOfRange(
                f"cannot step back n={n}: {self.n_generated} generated token(s), so n must be in 1..{self.n_generated}"
            )
        keep = len(self._ids) - n
        self.backend.truncate(keep)
        self._ids = self._ids[:keep]
        self._logits_history = self._logits_history[: len(self._logits_history) - n]
        self._logits = self._logits_history[-1]

    # -- reading ---------------------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        """Positions processed (prompt + generated), = rows and columns of a full map."""
        return len(self._ids)

    @property
    def notices(self) -> list:
        """What the engine did by itself to keep the maps exact, oldest first, for the GUI to show:
        e.g. :class:`attnscope.core.attention.rope_length.RopeRecompute` (the KV cache re-run because LongRoPE / dynamic
        RoPE frequencies changed with the length; ``str(notice)`` is one line), after :attr:`notice`
        (how the tokenizer changed the prompt's text, if it did). Cleared by prefill."""
        return ([self.notice] if self.notice else []) + list(getattr(self.backend, "notices", ()))

    @property
    def n_prompt(self) -> int:
        return self._n_prompt

    @property
    def n_generated(self) -> int:
        return len(self._ids) - self._n_prompt

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    def _token(self, pos: int) -> Token:
        tid = self._ids[pos]
        raw, text = token_text(self.tokenizer, tid)
        return Token(position=pos, id=tid, raw=raw, text=text, generated=pos >= self._n_prompt)

    @property
    def tokens(self) -> list[Token]:
        return [self._token(i) for i in range(len(self._ids))]

    def text(self, generated_only: bool = True) -> str:
        ids = self._ids[self._n_prompt :] if generated_only else self._ids
        return decode_text(self.tokenizer, ids)  # an id the tokenizer does not know reads <id N>

    def weights(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Exact weights of one head, ``(n_query, n_key)`` float32 (rows = queries, cols = keys).

        ``rows``/``cols``: None (all ``seq_len``) or a slice of ints with step 1 or None, bounds
        within ``-seq_len .. seq_len`` (negative ones count from the end, as in Python).

        Raises:
            SessionError: nothing run yet. WrongType (a TypeError): layer/head not an int (bools
            refused), rows/cols not a slice. OutOfRange (an IndexError): layer/head, or a slice
            bound, out of range. BadArgument (a ValueError): a slice step other than 1.
            NoAttentionMap (a BadArgument): a hybrid model's layer with no softmax attention
            (``layer 2: linear attention, no map``).
        """
        self._require_run()
        index("layer", layer, self.info.n_layers)
        self.info.arch.check_map(layer)
        index("head", head, self.info.n_heads)
        T = self.seq_len
        return self.trace.weights(int(layer), int(head), span("rows", rows, T), span("cols", cols, T))

    def sink_scores(self, key: int = 0) -> np.ndarray:
        """``(n_layers, n_heads)`` mean weight on key ``key`` over the rows after it.

        Raises:
            SessionError: nothing run yet. WrongType / OutOfRange: ``key`` not in ``0 .. seq_len - 1``.
        """
        self._require_run()
        return self.trace.sink_scores(index("key", key, self.seq_len))

    def kv_cache_bytes(self, seq_len: int | None = None, dtype: str | None = None) -> int:
        """KV-cache bytes: 2 × n_layers × n_kv_heads × head_dim × seq_len × bytes per element (a hybrid
        model: its attention layers only; their recurrent/conv states are ``backend.state_layer_bytes()``).

        ``seq_len`` defaults to the current sequence; ``dtype`` to the model's dtype.

        Raises:
            WrongType / OutOfRange: ``seq_len`` not a whole number >= 0.
        """
        if seq_len is not None and whole("seq_len", seq_len) < 0:
            raise OutOfRange(f"seq_len={seq_len} out of range: it must be >= 0")
        return kv_formula(
            len(self.info.arch.attention_layers),  # a hybrid model's other layers keep no KV cache
            self.info.n_kv_heads,
            self.info.head_dim,
            self.seq_len if seq_len is None else seq_len,
            dtype or self.info.dtype,
        )

    def set_sampling(self, sampling: Sampling) -> None:
        """Use ``sampling`` for the next steps. A sampled token depends only on the logits, the settings
        and its position (:func:`attnscope.core.sampling.step_rng`), so stepping back and forward again with the
        same settings gives the same token, and a reopened session continues as the original would."""
        self._check_sampling(sampling)  # WrongType (a TypeError)
        self.sampling = sampling

    def logits_at(self, step: int | None = None) -> np.ndarray:
        """Logits the token after ``n_prompt + step`` positions was chosen from, ``(vocab,)`` float32.

        ``step`` is a decode step ``0 .. n_generated`` (None = now, ``n_generated``): step 0 is
        what prefill predicted. Kept for every step, so step back needs no recompute.

        Raises:
            SessionError: nothing run yet. OutOfRange (an IndexError): step out of range.
            WrongType: not a whole number.
        """
        now = self._require_run()
        if step is None:
            return now
        step = in_range("step", step, 0, self.n_generated)
        return self._logits_history[step]

    def position_logits(self) -> np.ndarray:
        """Logits after every position, ``(seq_len, vocab)`` float32: row ``i`` predicts token ``i + 1``.

        Raises:
            SessionError: nothing run yet, or the prompt was not prefilled with ``all_logits=True``.
        """
        self._require_run()
        prompt = getattr(self, "_prompt_logits", None)
        if prompt is None or len(prompt) != self._n_prompt:
            raise SessionError("the prompt's per-position logits were not kept: prefill with all_logits=True")
        return np.concatenate([prompt, np.stack(self._logits_history[1:])]) if self.n_generated else prompt

    def next_token_probs(self, k: int = 10) -> list[TopToken]:
        """Top-``k`` of the model's next-token distribution at the current step (temperature 1).

        Raises:
            SessionError: nothing run yet. WrongType / OutOfRange: ``k`` not in ``1 .. vocab``.
        """
        logits = self._require_run()
        k = in_range("k", k, 1, logits.shape[-1])
        p = softmax(logits)
        top = np.argsort(-p)[:k]
        return [TopToken(int(i), token_text(self.tokenizer, int(i))[1], float(p[i])) for i in top]

    @property
    def logits(self) -> np.ndarray:
        return self._require_run()

    def snapshot(self) -> Snapshot:
        """A frozen copy of what the GUI shows (tokens, KV bytes, the layers' sliding windows); the
        next-token table is :func:`attnscope.core.analysis.timeline.next_tokens`, per step."""
        from attnscope.core.trace import softmax_variant

        return Snapshot(
            info=self.info,
            backend=self.backend.name,
            device=str(self.backend.device),
            tokens=tuple(self.tokens),
            n_prompt=self._n_prompt,
            prompt=self.prompt,
            chat_template=self.chat_template,
            kv_cache_bytes=self.kv_cache_bytes(),
            notices=tuple(str(n) for n in self.notices),
            layer_windows=tuple(self.backend.layer_windows()),
            softcap=softmax_variant.model_softcap(self.trace),
            learned_sinks=softmax_variant.has_learned_sinks(self.trace),
        )

    def _require_run(self) -> np.ndarray:
        """The current logits ``(vocab,)``; raises SessionError when nothing has run yet."""
        if self._logits is None:
            raise SessionError("nothing has run yet: run a prompt first (call prefill(prompt))")
        return self._logits
