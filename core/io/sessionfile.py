"""Saved sessions (``.attnscope``): one JSON file that reopens exactly the same view and numbers.

The file records *what to recompute*, not the numbers: the model reference (path, or ``"default"``
for the embedded model) with the SHA-256 of its weights, backend, dtype, device, the prompt and
chat-template flag, the sampling settings, every token id (prompt + generated), and the view
(layer, head, tab, colour map, scale, query row, ...: a free-form dict the GUI fills).

Reopening (:func:`replay`): load the model (a different hash is a warning, not an error: the
colleague may hold a re-download of the same model), prefill the prompt, check that it tokenizes to
the recorded prompt ids, then *feed* the recorded generated ids (:meth:`attnscope.core.session.Session.feed`)
instead of sampling again, so a sampled continuation comes back token for token. The forwards are
the same ones the original run made (prefill in the same chunks, then one forward per token), so on
the same backend, dtype and device the weights are bit-identical.

    sf = SessionFile.from_session(s, view={"layer": 3, "head": 4})
    save(sf, "fox.attnscope")
    s2, warnings = replay(load("fox.attnscope"))
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope.core import __version__
from attnscope.core import backend_registry as registry
from attnscope.core.errors import AttnScopeError, SessionError
from attnscope.core.loading.device_map import DEVICE_MAPS
from attnscope.core.loading.device_map import record as dm_record
from attnscope.core.loading.quantize import record as quant_record
from attnscope.core.sampling import Sampling

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

FORMAT = "attnscope.session"
VERSION = 1
SUFFIX = ".attnscope"


class SessionFileError(AttnScopeError):
    """A session file cannot be read (not JSON, wrong format, missing or bad fields)."""


@dataclass(frozen=True)
class SessionFile:
    """The contents of a ``.attnscope`` file.

    Attributes:
        model: ``"default"`` (the embedded model) or a path to a GGUF file / HF folder.
        model_name: display name when saved.
        model_sha256: SHA-256 of the weights (:func:`attnscope.core.loading.model_hash.model_sha256`), None if unknown.
        backend, dtype, device: as when saved ("torch", "float32", "cpu"...).
        prompt, chat_template: the prompt as typed and whether the chat template wrapped it.
        sampling: the settings in force when saved (:class:`attnscope.core.sampling.Sampling`).
        token_ids: every position's id, prompt first (``n_prompt`` of them), then generated ones.
        n_prompt: number of prompt ids.
        view: view settings, e.g. ``{"layer": 3, "head": 4, "tab": "heatmap", "cmap": "viridis"}``.
        created, attnscope_version: provenance.
        quantization: how the weights were stored and ran (:func:`attnscope.core.loading.quantize.record`); its
            ``"mode"`` is the ``--quantize`` a reopened session loads with ({} in older files: none).
        device_map: where the layers ran (:func:`attnscope.core.loading.device_map.record`:
            ``{"strategy": "auto", "placement": {"cpu": bytes, "disk": bytes}}``); its strategy is the
            ``--device-map`` a reopened session loads with ({} in older files and on one device).
    """

    model: str
    model_name: str
    model_sha256: str | None
    backend: str
    dtype: str
    device: str
    prompt: str
    chat_template: bool
    sampling: Sampling
    token_ids: tuple[int, ...]
    n_prompt: int
    view: dict = field(default_factory=dict)
    created: str = ""
    attnscope_version: str = __version__
    # {"file": "Q4_K_M", "runtime": "int8 weight-only (torchao …)", "mode": "int8"} (attnscope.core.loading.quantize.record)
    quantization: dict = field(default_factory=dict)
    # {"address": "HOST:PORT", "host": name} when the model ran in an `attnscope serve` engine, else {}
    engine: dict = field(default_factory=dict)
    device_map: dict = field(default_factory=dict)  # attnscope.core.loading.device_map.record

    @property
    def generated_ids(self) -> tuple[int, ...]:
        return self.token_ids[self.n_prompt :]

    @property
    def n_generated(self) -> int:
        return len(self.token_ids) - self.n_prompt

    @classmethod
    def from_session(cls, session: Session | RemoteSession, view: dict | None = None) -> SessionFile:
        """Capture ``session`` (after a prompt) and ``view``.

        Raises:
            SessionError: nothing has run yet.
        """
        from attnscope.core.io.provenance import engine_record
        from attnscope.core.loading.model_hash import model_sha256

        if session.prompt is None or session.seq_len == 0:
            raise SessionError("nothing to save: run a prompt first")
        return cls(
            # a remote session: the reference and hash as the engine's machine sees them
            model=getattr(session, "model_ref", None) or model_reference(session.info.source),
            model_name=session.info.name,
            model_sha256=getattr(session, "model_sha256", None) or model_sha256(session.info.source),
            engine=engine_record(session).get("engine", {}),
            backend=getattr(session.backend, "name", registry.DEFAULT),
            dtype=session.info.dtype,
            device=str(getattr(session.backend, "device", "cpu")),
            prompt=session.prompt,
            chat_template=bool(session.chat_template),
            sampling=session.sampling,
            token_ids=tuple(session.ids),
            n_prompt=session.n_prompt,
            view=dict(view or {}),
            created=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            quantization=quant_record(session.info),
            device_map=dm_record(session.info),
        )

    @property
    def device_map_strategy(self) -> str | None:
        """The ``--device-map`` this session ran with (None: one device, or an explicit map that
        cannot be asked for again by name)."""
        s = self.device_map.get("strategy")
        return s if s in DEVICE_MAPS else None

    @property
    def quantize(self) -> str:
        """The ``--quantize`` mode this session ran with (``"none"`` when not recorded)."""
        mode = str(self.quantization.get("mode", "none"))
        return mode if mode in ("none", "int8", "int4") else "none"

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "attnscope_version": self.attnscope_version,
            "created": self.created,
            "model": {"ref": self.model, "name": self.model_name, "sha256": self.model_sha256},
            "backend": self.backend,
            "dtype": self.dtype,
            "device": self.device,
            "prompt": self.prompt,
            "chat_template": self.chat_template,
            "sampling": asdict(self.sampling),
            "n_prompt": self.n_prompt,
            "token_ids": list(self.token_ids),
            "view": self.view,
            "quantization": self.quantization,
            **({"engine": self.engine} if self.engine else {}),
            **({"device_map": self.device_map} if self.device_map else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> SessionFile:
        """Validate and build: every field's type and allowed values (:mod:`attnscope.core.io.session_fields`).

        Raises:
            SessionFileError: the first bad or missing field, one line naming the field, the value
                and what is allowed (``bad session file: view.layer is "3", expected a non-negative
                integer``).
        """
        from attnscope.core.io import session_fields

        try:
            fields = session_fields.parse(d, VERSION)
            return cls(**{**fields, "sampling": Sampling(**fields["sampling"])})
        except session_fields.FieldError as e:
            raise SessionFileError(str(e)) from None


def model_reference(source: str) -> str:
    """``"default"`` when ``source`` is the embedded model (its GGUF, or the pre-converted folder a
    packaged app names), else the absolute path (:func:`attnscope.core.loading.resolve.model_source` decides both)."""
    from attnscope.core.loading.resolve import is_default_source, model_source

    return "default" if is_default_source(source) else model_source(source)


def save(sf: SessionFile, path: str | os.PathLike) -> Path:
    """Write ``sf`` as JSON (UTF-8). Adds the ``.attnscope`` suffix when the name has none.

    Raises:
        FileNotFoundError: the folder does not exist. OSError: cannot write.
    """
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(SUFFIX)
    if not path.parent.exists():
        raise FileNotFoundError(f"folder {path.parent} does not exist")
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(sf.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # never a stray .tmp beside the session (a full disk, a folder there)
        raise
    return path


def load(path: str | os.PathLike) -> SessionFile:
    """Read and validate a session file.

    Raises:
        FileNotFoundError: no such file. SessionFileError: not a valid session file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such session file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SessionFileError(f"{path.name} is not a session file (not JSON: {e})") from None
    return SessionFile.from_dict(data)


def same_model(session: Session | RemoteSession, sf: SessionFile) -> bool:
    """True when ``session`` already runs the model reference ``sf`` names, on its backend and dtype.

    The weights' hash is not compared here: reloading the same reference would give the same file;
    :func:`replay` warns when the hash differs.
    """
    if (
        session is None
        or session.info.dtype != sf.dtype
        or getattr(session.backend, "name", "") != sf.backend
    ):
        return False
    if quant_record(session.info)["mode"] != sf.quantize:
        return False
    if (dm_record(session.info).get("strategy") or None) != sf.device_map_strategy:
        return False
    return (getattr(session, "model_ref", None) or model_reference(session.info.source)) == sf.model


#: :func:`replay`'s ``dtype_reason`` for a dtype that comes from the session file (``{dtype}``: it)
SAVED_DTYPE_REASON = "{dtype}: the dtype the session was saved at"


def check_view(view: Any, info: Any) -> None:
    """Check a session's ``view`` dict against the model that loads: ``view.layer`` within
    ``0..info.n_layers - 1`` and ``view.head`` within ``0..info.n_heads - 1`` (absent or null: not
    checked). The one check the window's File → Open session and ``attnscope export --session``
    share, made by :func:`replay` before the prefill.

    Raises:
        SessionFileError: one line naming the field, its value and the model's range.
    """
    if not isinstance(view, dict):
        return
    for key, n, what in (("layer", info.n_layers, "layers"), ("head", info.n_heads, "query heads")):
        v = view.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v < n:
            raise SessionFileError(
                f"bad session file: view.{key} is {v}, but {getattr(info, 'name', 'the model')} has "
                f"{what} 0..{n - 1}"
            )


def replay(
    sf: SessionFile,
    session: Session | RemoteSession | None = None,
    model: str | os.PathLike | None = None,
    device: str | None = None,
    progress: Callable[[str, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    check: Callable[[Any], None] | None = None,
    dtype_reason: str | None = None,
) -> tuple[Session | RemoteSession, list[str]]:
    """Rebuild the saved sequence. Returns ``(session, warnings)``.

    ``dtype_reason``: why the model loads at ``sf.dtype`` when it loads here (in this process), in
    place of the loader's "asked for (--dtype …)": the file's dtype was not the user's choice
    (:data:`SAVED_DTYPE_REASON`); None keeps the loader's reason (a dtype the user did choose).

    ``check(info)``: called with the model's ``ModelInfo`` once it is loaded, before the prefill
    (the CLI refuses an argument the model rules out before anything runs).

    ``session``: reuse it when it already runs the same model (:func:`same_model`), else a new one is
    loaded from ``model`` (overrides the file's reference, e.g. the colleague's own copy) or the file's
    reference. ``device`` defaults to the saved device. Warnings (one line each): a different weights
    hash, a different device than saved (numbers may differ in the last bits).

    Raises:
        ModelLoadError: the model cannot be loaded. SessionError: the prompt tokenizes differently
        (another tokenizer) or a token id is out of the vocabulary. Cancelled: ``cancelled()``.
    """
    from attnscope.core.loading.model_hash import model_sha256
    from attnscope.core.session import Session

    warnings: list[str] = []
    say = progress or (lambda *_: None)
    if (
        session is not None
        and hasattr(session, "load_model")
        and (model is not None or not same_model(session, sf))
    ):
        # a remote engine (attnscope.core.remote): load there, the reference is a path on its machine
        ref = model if model is not None else (None if sf.model == "default" else sf.model)
        session.load_model(
            ref,
            backend=sf.backend,
            dtype=sf.dtype,
            progress=progress,
            quantize=sf.quantize,
            device_map=sf.device_map_strategy,
        )
    elif session is None or model is not None or not same_model(session, sf):
        ref = model if model is not None else (None if sf.model == "default" else sf.model)
        session = Session.load(
            ref,
            backend=sf.backend,
            device=device or _usable_device(sf.device, warnings),
            dtype=sf.dtype,
            progress=progress,
            quantize=sf.quantize,
            device_map=sf.device_map_strategy,
        )
        if dtype_reason and sf.dtype != "auto" and session.info.dtype == sf.dtype:
            import dataclasses

            session.info = dataclasses.replace(session.info, dtype_reason=dtype_reason.format(dtype=sf.dtype))
    check_view(sf.view, session.info)  # before the prefill: a refused file runs nothing
    if check is not None:
        check(session.info)
    sha = getattr(session, "model_sha256", None) or model_sha256(session.info.source)
    if sf.model_sha256 and sha != sf.model_sha256:
        warnings.append(
            f"the model's weights differ from the saved session's (sha256 {str(sha)[:12]}… ≠ "
            f"{sf.model_sha256[:12]}…): numbers may differ"
        )
    if str(session.backend.device) != sf.device:
        warnings.append(
            f"running on {session.backend.device}, saved on {sf.device}: numbers may differ in the last bits"
        )
    if hasattr(session, "set_sampling"):
        session.set_sampling(sf.sampling)
    else:
        session.sampling = sf.sampling
    # the bar's stages say which part of the replay they are: the prompt's prefill is the whole bar
    # when nothing was generated, else its first half ("prefill 42/42" at half way read as done)
    n_gen = sf.n_generated
    share = 0.5 if n_gen else 1.0
    then = f", then {n_gen} generated token{'s' if n_gen != 1 else ''}" if n_gen else ""
    say(f"Replaying the run: prefill of the prompt{then}…", 0.0)
    session.prefill(
        sf.prompt,
        chat_template=sf.chat_template,
        progress=lambda d, t: say(
            f"Replaying the run: prefill {d}/{t} prompt tokens{then}", share * d / max(1, t)
        ),
        cancelled=cancelled,
    )
    if tuple(session.ids) != sf.token_ids[: sf.n_prompt]:
        raise SessionError(
            _prompt_mismatch(tuple(session.ids), sf.token_ids[: sf.n_prompt], session.info.vocab_size)
        )
    if sf.n_generated:
        session.feed(
            list(sf.generated_ids),
            cancelled=cancelled,
            progress=lambda d, t: say(
                f"Replaying the run: generated token {d}/{t} (prompt done)", 0.5 + 0.5 * d / max(1, t)
            ),
        )
    say("Session restored.", 1.0)
    return session, warnings


def _prompt_mismatch(here: tuple, saved: tuple, vocab_size: int | None) -> str:
    """One line saying how the prompt's token ids here differ from the saved ones: the counts, or
    the first position where they differ (and a saved id no vocabulary of this size holds)."""
    if len(here) != len(saved):
        return (
            f"the prompt tokenizes to {len(here)} ids here, not the saved {len(saved)}: "
            "another tokenizer or chat template"
        )
    i = next(i for i, (a, b) in enumerate(zip(here, saved, strict=True)) if a != b)
    if vocab_size and not 0 <= saved[i] < vocab_size:
        return (
            f"the saved prompt's token id at position {i} is {saved[i]}, outside this model's vocabulary "
            f"(0..{vocab_size - 1}; the prompt gives {here[i]} there): an edited or damaged session file"
        )
    return (
        f"the prompt's token ids differ from the saved ones from position {i} on ({here[i]} here, "
        f"{saved[i]} saved; {len(here)} ids each): another tokenizer or chat template, or an edited file"
    )


def _usable_device(saved: str, warnings: list[str]) -> str | None:
    """The saved device if this machine has it, else None (auto), with a warning."""
    if saved.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return saved
        warnings.append(f"saved on {saved}, which this machine lacks: using the CPU")
        return "cpu"
    return saved if saved in ("cpu", "mps") or saved.startswith("cpu") else None
