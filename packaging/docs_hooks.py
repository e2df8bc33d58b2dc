"""mkdocs hooks (``mkdocs.yml``'s ``hooks:``): the docs pages that are generated from the code.

A page holds a marker comment on a line of its own, replaced when the site is built:

* ``<!-- cli-reference -->``: every option of ``attnscope`` and of each subcommand, read from the
  parser the command itself builds (:func:`attnscope.core.cli.main.build_parser`), so the page cannot
  drift from the command;
* ``<!-- api-reference -->``: one mkdocstrings block (``::: module.name``) per public name of the
  ``attnscope`` package (its ``_PUBLIC`` table, ``packaging/namespace/__init__.py``), rendered from
  the docstrings;
* ``<!-- bench-table -->``: the tables of the committed ``attnscope bench --json`` result
  (``docs/benchmarks/bench.json``).

The site's home page is the README itself (:func:`on_files`), its links into ``docs/`` made
relative to the site.

``tests/integration/test_docs.py`` builds the site in strict mode and checks the CLI page against the parser.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_JSON = ROOT / "docs" / "benchmarks" / "bench.json"


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell (no pipes, no line breaks, no raw HTML)."""
    s = " ".join(str(text).split())
    return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """An inline code span (a table cell may hold a pipe: escaped as the cell needs it)."""
    return "`" + text.replace("|", "\\|") + "`"


def _option_row(p: argparse.ArgumentParser, a: argparse.Action) -> str | None:
    """One table row: the option as ``--help`` writes it (``--backend {torch,mlx}``) and its help."""
    if isinstance(a, argparse._HelpAction | argparse._SubParsersAction):
        return None
    fmt = p._get_formatter()
    names = ", ".join(_code(x.strip()) for x in fmt._format_action_invocation(a).split(", "))
    help_text = fmt._expand_help(a).strip() if a.help else ""
    if a.required and a.option_strings:  # a positional's nargs='*' reads as required to argparse
        help_text = (help_text.rstrip(".") + ". " if help_text else "") + "Required."
    return f"| {names} | {_cell(help_text)} |"


def parser_markdown(name: str, p: argparse.ArgumentParser, level: int = 2) -> str:
    """One parser as Markdown: a heading ``attnscope NAME``, its description, usage and options table."""
    slug = name.replace(" ", "-")
    usage = " ".join(p.format_usage().replace("usage: ", "", 1).split())
    lines = [f"{'#' * level} `{name}` {{#{slug}}}", ""]
    if p.description:
        text = p.description.strip().rstrip(".")
        lines += [text[0].upper() + text[1:] + ".", ""]
    lines += ["```text", usage, "```", "", "| option | what it does |", "|---|---|"]
    lines += [row for a in p._actions if (row := _option_row(p, a))]
    return "\n".join(lines) + "\n"


def cli_reference() -> str:
    """Markdown for every parser of ``attnscope``: the top level (the window's options), then each subcommand."""
    from attnscope.core.cli.main import build_parser

    top = build_parser()
    parts = [parser_markdown("attnscope", top)]
    for name, sp in sorted(top.command_parsers.items()):
        parts.append(parser_markdown(f"attnscope {name}", sp))
    return "\n".join(parts)


def api_reference() -> str:
    """A mkdocstrings block per public name of ``attnscope``, grouped by the module it lives in."""
    import attnscope

    table: dict[str, str] = attnscope._PUBLIC  # type: ignore[attr-defined]
    lines: list[str] = []
    for name, module in table.items():
        lines += [f"## `attnscope.{name}` {{#{name}}}", "", f"::: {module}.{name}"]
        # Session's own methods come from its bases (the core Session, the analyses' mixin)
        lines += ["    options:", "      inherited_members: true", ""]
    return "\n".join(lines)


def _fmt_s(x: Any) -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _fmt_bytes(x: Any) -> str:
    if x is None:
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x} B"


def bench_markdown(path: Path = BENCH_JSON) -> str:
    """The committed bench result as tables: the machine, then one row per prompt length."""
    r = json.loads(path.read_text(encoding="utf-8"))
    return _bench_tables(r)


def _bench_tables(r: dict) -> str:
    from attnscope.core.bench.overhead_report import format_table

    return "```text\n" + format_table(r).rstrip() + "\n```\n"


def readme_as_index() -> str:
    """README.md with its ``docs/…`` links relative to the docs folder (the site's home page)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", text)


def on_files(files, config):
    """Add the home page, ``index.md``, made from the README (a page of that name in ``docs/`` would win)."""
    from mkdocs.structure.files import File

    if files.get_file_from_path("index.md") is None:
        files.append(File.generated(config, "index.md", content=readme_as_index()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace the markers (module docstring) with the generated Markdown."""
    generators = {
        "cli-reference": cli_reference,
        "api-reference": api_reference,
        "bench-table": bench_markdown,
    }
    for key, make in generators.items():
        marker = f"<!-- {key} -->"
        if re.search(rf"^{re.escape(marker)}$", markdown, flags=re.M):
            markdown = markdown.replace(marker, make())
    return markdown
