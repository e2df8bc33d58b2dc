"""The figure renderers are passed explicitly: no module-level renderer installed into core;
``attnscope.core.cli.main.main(renderers=...)`` hands a loader to ``attnscope export``, called only
when a labelled figure is drawn."""

from __future__ import annotations

from pathlib import Path

import attnscope.core.cli.commands.export as export_command
import pytest
from attnscope.core.cli.main import main
from attnscope.core.io.colormaps import ColourSpec
from attnscope.core.io.render import PILLOW, Renderers

PROMPT = ["export", "--prompt", "The cat sat.", "--no-chat-template", "--layer", "1", "--head", "2"]


def test_no_renderer_is_module_state():
    assert not hasattr(export_command, "FIGURE_RENDERER") and not hasattr(export_command, "FRAME_RENDERER")
    assert PILLOW == Renderers() and PILLOW.figure is None and PILLOW.frame is None


def test_figures_without_a_renderer_are_one_line(tmp_path, capsys):
    code = main([*PROMPT, "--out", str(tmp_path / "f.svg")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [
        "attnscope: error: SVG/PDF and labelled figures need the app package: run them through `attnscope export`"
    ]
    assert not (tmp_path / "f.svg").exists()


@pytest.mark.slow
def test_the_loader_is_called_only_for_figures_and_gets_the_colours(tmp_path):
    loads, calls = [], []

    def figure(w, path, **kw):
        calls.append((w.shape, kw["colour"], kw["title"]))
        Path(path).write_text("<svg/>")
        return Path(path)

    def loader():
        loads.append(1)
        return Renderers(figure=figure)

    assert main([*PROMPT, "--out", str(tmp_path / "m.npy")], renderers=loader) == 0
    assert loads == []  # a data export never loads the (Qt) renderers
    flags = ["--cmap", "magma", "--scale", "power", "--gamma", "0.3", "--range", "auto"]
    assert main([*PROMPT, *flags, "--out", str(tmp_path / "f.svg")], renderers=loader) == 0
    assert loads == [1] and len(calls) == 1
    shape, colour, title = calls[0]
    assert shape[0] == shape[1] and "Layer 1" in title
    assert isinstance(colour, ColourSpec)
    assert (colour.cmap, colour.scale, colour.gamma, colour.range_mode, colour.vmin) == (
        "magma",
        "power",
        0.3,
        "auto",
        0.0,
    )
    assert 0.0 < colour.vmax <= 1.0  # auto: the map's robust max, resolved before drawing
