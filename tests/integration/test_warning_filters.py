"""Pyproject's filterwarnings: a warning raised in attnscope's own modules fails the test;
a library's warning is reported, not hidden and not an error."""

from __future__ import annotations

import warnings

import pytest


def _warn(category, module: str) -> None:
    warnings.warn_explicit("going away", category, f"/x/{module.replace('.', '/')}.py", 1, module=module)


@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning, UserWarning, RuntimeWarning])
@pytest.mark.parametrize("module", ["attnscope", "attnscope.core.io.head_export", "attnscope.app.figure"])
def test_a_warning_from_our_code_is_an_error(category, module):
    with pytest.raises(category, match="going away"):
        _warn(category, module)


@pytest.mark.parametrize("module", ["transformers.modeling_utils", "attnscopelike", "numpy"])
def test_a_library_warning_is_recorded_not_raised(module):
    with warnings.catch_warnings(record=True) as seen:  # keeps the configured filters (no simplefilter)
        _warn(DeprecationWarning, module)
    assert [str(w.message) for w in seen] == ["going away"]
