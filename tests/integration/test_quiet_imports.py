"""Loading a model prints nothing of the libraries' import-time noise (a new user saw torchao's
"Failed to load …_C_mxfp8…" and torch's _pytree deprecation lines on the MLX backend)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
from attnscope import Session
s = Session.load({args})
s.prefill("hi there", chat_template=False)
print("ran", s.seq_len)
"""


@pytest.mark.slow
@pytest.mark.parametrize("args", ["backend='mlx'", "quantize='int8'"], ids=["mlx", "torch-int8"])
def test_a_load_prints_no_import_noise(args):
    if "mlx" in args:
        pytest.importorskip("mlx.core")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(args=args)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ran 2" in out.stdout
    for noise in ("Failed to load", "_pytree", "register_constant"):
        assert noise not in out.stderr, out.stderr[-2000:]
