"""The engine tokens a client remembers: one file of its own, mode 0600, never the settings file.

The window's File → Connect to engine… remembers the token of an engine it connected to (only after
the connection succeeded) so the next dialog is prefilled. The tokens live in
``config_dir()/engine-tokens.json`` (:func:`attnscope.core.loading.catalog.config_dir`;
``ATTNSCOPE_CONFIG_DIR`` overrides it), a JSON object ``{"HOST:PORT": "token", ...}`` that is created
with mode 0600 (owner read/write only), as ``attnscope serve --token-file`` writes its own. Writes go to
a 0600 temporary file in the same folder, then replace the old one, so a reader never sees half a file
and the mode never widens. A file that is not a JSON object of strings reads as empty.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

FILE_NAME = "engine-tokens.json"


def token_file() -> Path:
    """Where the remembered tokens live (the file may not exist)."""
    from attnscope.core.loading.catalog import config_dir

    return config_dir() / FILE_NAME


def _read() -> dict[str, str]:
    try:
        data = json.loads(token_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str) and v}


def _write(tokens: dict[str, str]) -> None:
    path = token_file()
    if not tokens:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".engine-tokens-", dir=path.parent)  # mkstemp: mode 0600
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(tokens, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def saved_token(address: str) -> str | None:
    """The token remembered for the engine at ``address`` (``HOST:PORT`` as typed), else None."""
    return _read().get(address.strip()) or None


def save_token(address: str, token: str | None) -> None:
    """Remember ``token`` for ``address`` (an empty or None token forgets it).

    Raises:
        OSError: the config folder cannot be written.
    """
    tokens = _read()
    if token:
        tokens[address.strip()] = token
    else:
        tokens.pop(address.strip(), None)
    _write(tokens)


def forget_token(address: str) -> None:
    """Forget the token remembered for ``address`` (nothing when none is)."""
    if address.strip() in _read():
        save_token(address, None)
