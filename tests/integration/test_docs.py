"""The user documentation: README's links resolve, and the mkdocs site builds in strict mode (a broken
link or a missing anchor fails) with a CLI reference that lists every command and option of the real
parser (``packaging/docs_hooks.py`` generates it from :func:`attnscope.core.cli.main.build_parser`)."""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _relative_links(text: str) -> list[str]:
    """Markdown link and image targets that are paths in the repository (no scheme, no bare anchor)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_relative_links_exist():
    links = _relative_links(README.read_text(encoding="utf-8"))
    assert len(links) >= 20, links  # the pictures and the pages of the docs
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_readme_pictures_are_made_by_the_screenshot_script():
    """Every picture the README shows is one packaging/screenshots.py regenerates, and none is large."""
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "packaging" / "screenshots.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shown = re.findall(r"!\[[^\]]*\]\(docs/images/([^)]+)\)", README.read_text(encoding="utf-8"))
    assert "window.png" in shown and "decode.gif" in shown
    assert not set(shown) - set(mod.PICTURES), set(shown) - set(mod.PICTURES)
    for name in shown:
        size = (ROOT / "docs" / "images" / name).stat().st_size
        assert size < 1_000_000, f"{name} is {size} bytes"


def test_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    for stale in ("/tmp/", "notes/shots", "load average", "/work/", " UTC", "engineers"):
        assert stale not in text, stale
    assert not re.search(r"\b\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b", text)
    # the two set-up commands, as .ci/run and the tests use them
    assert "bash .ci/setup && .venv/bin/attnscope" in text
    test_command = re.search(
        r"bash \.ci/setup --test && QT_QPA_PLATFORM=offscreen \.venv/bin/python -m pytest (.*)", text
    )
    assert test_command, "the README's test command"
    # .ci/run runs the README's test command: the same pytest options (it adds only -p no:cacheprovider)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_pytest = re.search(r"^\.venv/bin/python -m pytest (.*)$", ci, re.M)
    assert (
        ci_pytest and ci_pytest.group(1).replace(" -p no:cacheprovider", "") == test_command.group(1).strip()
    )


def test_benchmarks_page_speaks_to_users():
    """docs/benchmarks.md gives figures and what they mean: no load averages, dates or "measured by"
    notes (a busy machine is said in words where it explains a figure)."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for stale in ("load average", "measured by", "/work/", " UTC", "engineers"):
        assert stale.lower() not in text.lower(), stale
    # "load ~5", "at load 12", "(load ≈ 1)", "load 2–5.6)": a load average; "load 87 s" is a model's load time
    found = re.findall(r"load\s*[~≈]\s*\d|at load \d|load \d[\d.]*(?:\s*[–-]\s*\d[\d.]*)?\)", text)
    assert not found, found
    assert not re.search(r"\b\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b", text)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)


def test_cli_reference_markdown_lists_the_parser():
    """The generator itself (no mkdocs needed): a section per command with each option of its parser."""
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    from attnscope.core.cli.main import build_parser

    md = docs_hooks.cli_reference()
    parser = build_parser()
    assert "## `attnscope` {#attnscope}" in md
    for name, sub in parser.command_parsers.items():
        head = f"## `attnscope {name}` {{#attnscope-{name}}}"
        assert head in md, head
        section = md.split(head, 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"`{opt}" in section, (name, opt)


@pytest.mark.slow  # the strict site build: about 20 s
def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    from attnscope.core.cli.main import build_parser

    page = html.unescape((site / "reference" / "cli" / "index.html").read_text(encoding="utf-8"))
    parser = build_parser()
    for name, sub in parser.command_parsers.items():
        assert f'id="attnscope-{name}"' in page, name
        for action in sub._actions:
            for opt in action.option_strings:
                assert opt in page, (name, opt)
    for action in parser._actions:
        for opt in action.option_strings:
            assert opt in page, opt
    # the API reference holds every public name, rendered from its docstring
    import attnscope

    api = html.unescape((site / "reference" / "api" / "index.html").read_text(encoding="utf-8"))
    for name in attnscope._PUBLIC:  # type: ignore[attr-defined]
        assert f'id="{name}"' in api, name
    assert "Start a new sequence" in api  # Session.prefill's docstring
    # the home page is the README, its docs/ links made relative to the site
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'src="images/window.png"' in home and 'href="docs/' not in home
    # the benchmarks page carries the committed run's table
    bench = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "attnscope bench:" in bench and "<!-- bench-table -->" not in bench


def test_file_formats_page_names_every_session_field():
    """docs/file-formats.md's session-file table lists every top-level key a saved session holds."""
    from attnscope.core.io.sessionfile import SessionFile
    from attnscope.core.sampling import Sampling

    sf = SessionFile(
        model="default",
        model_name="m",
        model_sha256=None,
        backend="torch",
        dtype="float32",
        device="cpu",
        prompt="hi",
        chat_template=False,
        sampling=Sampling(),
        token_ids=(1, 2),
        n_prompt=1,
        engine={"address": "127.0.0.1:8765", "host": "h"},
        device_map={"strategy": "auto", "placement": {}},
    )
    page = (ROOT / "docs" / "file-formats.md").read_text(encoding="utf-8")
    section = page.split("## The session file", 1)[1].split("\n## ", 1)[0]
    for key in sf.to_dict():
        assert f"`{key}" in section, key


@pytest.mark.slow  # a tiny model's load, prefill and export: a few seconds, more on a busy machine
def test_file_formats_page_names_every_sidecar_field(tmp_path):
    """docs/file-formats.md's sidecar table lists every top-level key of a real export's sidecar."""
    import json

    from attnscope import Session, export_head
    from tiny_models import save_tiny

    save_tiny("llama", tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.prefill([1, 2, 3])
    s.step(1)
    export_head(s, 0, 1, tmp_path / "h.npy")
    meta = json.loads((tmp_path / "h.npy.json").read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "file-formats.md").read_text(encoding="utf-8")
    section = page.split("## The sidecar JSON", 1)[1].split("\n## ", 1)[0]
    table = section.split("| field | meaning |", 1)[1]
    for key in meta:
        assert f"`{key}`" in table, key
