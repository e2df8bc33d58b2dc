"""Saving what a view shows before it shows anything: one clear error, never an AttributeError
(paths the type checker found: each read a value that is None until a map or comparison exists)."""

from __future__ import annotations

import pytest


def test_save_data_without_held_weights_is_one_clear_error(make_window, tmp_path):
    """No map yet (and a long map, whose overview is never held whole): Save data says so."""
    win = make_window(autoload=False, show=False)
    said = []
    win.state.events.error.connect(said.append)
    assert win.maps.weights is None
    with pytest.raises(ValueError, match="no head's weights are held to save"):
        win.maps.save_data(tmp_path / "w.npy")
    assert said == ["no head's weights are held to save: use File → Export… for a long map"]
    assert not (tmp_path / "w.npy").exists()


def test_compare_exports_before_a_comparison_refuse(make_window, tmp_path):
    win = make_window(autoload=False, show=False)
    view = win.views["compare"]
    assert view.result is None and view.map_key is None
    with pytest.raises(ValueError, match="nothing to export yet: run B first"):
        view.export_table(tmp_path / "t.csv")
    with pytest.raises(ValueError, match="choose a .csv or .json file"):  # the suffix is checked first
        view.export_table(tmp_path / "t.txt")
    with pytest.raises(ValueError, match="run B and select a head first"):
        view.export_maps(tmp_path / "m.png")
    assert list(tmp_path.iterdir()) == []
