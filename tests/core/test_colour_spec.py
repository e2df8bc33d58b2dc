"""ColourSpec: one frozen value for how a map is coloured."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attnscope.core.io.colormaps import (
    COLOUR_BY_LENGTH,
    DEFAULT_COLOUR,
    ColourSpec,
    lut,
    normalize,
    to_rgb,
)
from attnscope.core.io.colour_scale import colour_for_length


def test_defaults_and_frozen():
    assert DEFAULT_COLOUR == ColourSpec("viridis", "linear", 0.5, "fixed", 0.0, 1.0)
    assert COLOUR_BY_LENGTH.scale is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_COLOUR.cmap = "magma"  # type: ignore[misc]
    assert hash(ColourSpec(cmap="magma")) == hash(ColourSpec(cmap="magma"))  # usable as a cache key


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cmap": "jet"}, "unknown colour map 'jet'"),
        ({"scale": "sqrt"}, "unknown scale 'sqrt'"),
        ({"gamma": 0.0}, "gamma must be > 0"),
        ({"range_mode": "widest"}, "unknown colour range 'widest'"),
    ],
)
def test_bad_values_are_one_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        ColourSpec(**kw)


def test_colours_equal_the_loose_functions():
    w = np.random.default_rng(0).random((7, 9)).astype(np.float32) * 0.6
    spec = ColourSpec(cmap="plasma", scale="power", gamma=0.25).with_range(0.0, 0.6)
    assert (spec.vmin, spec.vmax) == (0.0, 0.6)
    np.testing.assert_array_equal(spec.to_rgb(w), to_rgb(w, "plasma", 0.0, 0.6, "power", 0.25))
    np.testing.assert_array_equal(spec.normalize(w), normalize(w, 0.0, 0.6, "power", 0.25))
    np.testing.assert_array_equal(spec.lut(), lut("plasma"))
    # a cell at the range's top takes the map's last colour, one at 0 its first
    np.testing.assert_array_equal(spec.to_rgb(np.array([[0.6, 0.0]]))[0], lut("plasma")[[255, 0]])


def test_scale_by_length():
    assert colour_for_length(COLOUR_BY_LENGTH, 2047).scale == "linear"
    assert colour_for_length(COLOUR_BY_LENGTH, 2048).scale == "log"
    assert colour_for_length(ColourSpec(scale="power"), 10_000).scale == "power"  # the user's choice stays
    with pytest.raises(ValueError, match="chosen by length"):
        COLOUR_BY_LENGTH.to_rgb(np.zeros((2, 2)))


def test_metadata_is_what_exports_record():
    spec = ColourSpec(cmap="magma", scale="log", gamma=0.3, range_mode="shared").with_range(0.0, 0.25)
    assert spec.metadata() == {
        "cmap": "magma",
        "scale": "log",
        "gamma": None,  # only the power scale has one
        "range": "shared",
        "vmin": 0.0,
        "vmax": 0.25,
    }
    assert ColourSpec(scale="power", gamma=0.3).metadata()["gamma"] == 0.3
