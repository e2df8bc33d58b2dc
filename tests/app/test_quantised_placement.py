"""A model loaded with ``--quantize int8 --device-map auto`` (new-user trial): the status bar's
placement counts the bytes the quantised weights really hold (not the float size a torchao tensor
subclass reports), and Help → About names the dtype, the quantisation and the device map."""

from __future__ import annotations

import pytest
from tiny_models import save_tiny

pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def int8_mapped(tmp_path_factory):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("q8dm") / "llama"
    save_tiny("llama", folder)
    return Session.load(str(folder), device="cpu", quantize="int8", device_map="auto")


def _real_bytes(t) -> int:
    """Bytes held, counted here from the torchao subclass's own inner tensors (int8 data + scales)."""
    if hasattr(t, "qdata"):
        names, _ = t.__tensor_flatten__()
        return sum(getattr(t, n).numel() * getattr(t, n).element_size() for n in names)
    return t.numel() * t.element_size()


def test_placement_counts_the_quantised_bytes(int8_mapped, tmp_path, monkeypatch):
    from attnscope.core.loading.device_map import describe_info, placement
    from attnscope.core.units import format_bytes

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    s = int8_mapped
    model = s.backend.model
    params = list(model.parameters())
    assert any(hasattr(p, "qdata") for p in params)  # int8 weights are torchao subclasses
    real = sum(_real_bytes(p) for p in params)
    logical = sum(p.numel() * p.element_size() for p in params)  # what the status bar counted
    assert real < 0.6 * logical
    assert placement(model) == {"cpu": real}
    assert format_bytes(real) == "219 kB"  # 219,392 B of int8 data, scales and float embeddings/norms
    assert s.info.device_map == "auto" and dict(s.info.device_placement) == {"cpu": real}
    assert describe_info(s.info) == f"device map auto: cpu ({format_bytes(real)})"
    # a map that offloads layers: each placement counts real bytes too
    model.hf_device_map = {
        "model.embed_tokens": "cpu",
        "model.layers": "disk",
        "model.norm": "cpu",
        "lm_head": 0,
    }
    try:
        mods = dict(model.named_modules())
        want = {
            "cpu": sum(
                _real_bytes(p) for n in ("model.embed_tokens", "model.norm") for p in mods[n].parameters()
            ),
            "disk": sum(_real_bytes(p) for p in mods["model.layers"].parameters()),
            "cuda:0": sum(_real_bytes(p) for p in mods["lm_head"].parameters()),
        }
        assert placement(model) == want
        assert want["disk"] < 0.6 * sum(
            p.numel() * p.element_size() for p in mods["model.layers"].parameters()
        )
    finally:
        del model.hf_device_map


def test_about_names_dtype_quantisation_and_device_map(int8_mapped):
    from attnscope.app.menus import about_text
    from attnscope.core.units import format_bytes

    s = int8_mapped
    text = about_text(s.snapshot())
    real = dict(s.info.device_placement)["cpu"]
    assert f"Backend: torch on cpu, {s.info.dtype}" in text
    assert f"Quantisation: {s.info.quantization_runtime}" in text
    assert "Quantisation: int8 weight-only (torchao" in text
    assert f"Device map: auto: cpu ({format_bytes(real)})" in text


def test_about_on_one_device_unquantised(smol_ran):
    from attnscope.app.menus import about_text

    text = about_text(smol_ran.snapshot())
    q = smol_ran.info.quantization_file  # the embedded GGUF's own quantisation ("Q4_1"), no runtime one
    assert f"Quantisation: file {q}\n" in text and q and not smol_ran.info.quantization_runtime
    assert "Device map: none (one device)" in text
    assert about_text(None).endswith("Model: none loaded yet")
