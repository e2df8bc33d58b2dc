"""``--quantize int8|int4`` loads tensor by tensor (core/loading/stream_load.py).

The streamed model must be the very model ``from_pretrained`` + ``quantize_model`` gives: every
parameter and buffer equal bit for bit (quantised weights: their int data, scales and zeros), the
same runtime line, the same logits. And no float copy of the whole checkpoint: peak RSS of the
streamed load of a 64 MB checkpoint stays far below the ordinary path's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchao")

from attnscope.core.backends.torch_backend import ATTN_NAME, register_attention  # noqa: E402
from attnscope.core.loading.quantize import is_quantised, quantize_model  # noqa: E402
from attnscope.core.loading.safetensors_header import read_header
from attnscope.core.loading.stream_load import load_quantised, safetensors_files  # noqa: E402
from tiny_models import COMMON, save_tiny, tiny_tokenizer  # noqa: E402

IDS = [1, 40, 41, 42, 7, 8, 9, 100, 101, 102]
QCFG = dict(COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def _plain(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as plain tensors; a quantised weight as its inner tensors."""
    out = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        if is_quantised(t):
            names, _ = t.__tensor_flatten__()
            for n in names:
                out[f"{name}.{n}"] = getattr(t, n)
        else:
            out[name] = t.data
    return out


def _ordinary(folder, dtype, mode):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), attn_implementation=ATTN_NAME
    )
    m.eval()
    return m, quantize_model(m, mode)


def _assert_same(a, b):
    pa, pb = _plain(a), _plain(b)
    assert sorted(pa) == sorted(pb)
    for k in pa:
        assert pa[k].dtype == pb[k].dtype, k
        assert torch.equal(pa[k], pb[k]), k
    with torch.inference_mode():
        la, lb = a(torch.tensor([IDS])).logits, b(torch.tensor([IDS])).logits
        l1a = a(torch.tensor([IDS]), logits_to_keep=1).logits
        l1b = b(torch.tensor([IDS]), logits_to_keep=1).logits
    assert torch.equal(la, lb) and torch.equal(l1a, l1b)


@pytest.fixture(scope="module")
def q256(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("s") / "llama-256"
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **QCFG)).eval()
    m.save_pretrained(folder, max_shard_size="300KB")  # several shards, a layer split across two
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("mode, dtype", [("int8", "float32"), ("int8", "bfloat16"), ("int4", "bfloat16")])
def test_streamed_equals_from_pretrained_then_quantised(q256, mode, dtype):
    register_attention()
    assert len(safetensors_files(q256)) > 2
    got = load_quantised(q256, mode, dtype, "cpu", ATTN_NAME)
    assert got is not None
    m, line = got
    ref, ref_line = _ordinary(q256, dtype, mode)
    assert line == ref_line and line.endswith(", 14 linear layers")
    assert not m.training
    _assert_same(m, ref)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3_text"])
def test_streamed_families_and_tied_embeddings(tmp_path, family):
    """qwen2's q/k/v biases, gemma3's extra norms and a tied lm_head (gemma3 ties by default)."""
    register_attention()
    folder = tmp_path / family
    save_tiny(family, folder)
    m, line = load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME)
    ref, ref_line = _ordinary(folder, "float32", "int8")
    assert line == ref_line
    _assert_same(m, ref)
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("tie_word_embeddings"):
        assert m.lm_head.weight is m.get_input_embeddings().weight


def test_names_that_do_not_match_are_not_streamed(q256, tmp_path):
    """A checkpoint whose names transformers would have to rename: None (the caller loads it the
    ordinary way), and nothing is read."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "renamed"
    shutil.copytree(q256, folder)
    for f in safetensors_files(folder):
        sd = load_file(f)
        save_file(
            {k.replace("model.", "transformer.", 1): v for k, v in sd.items()}, f, metadata={"format": "pt"}
        )
    index = folder / "model.safetensors.index.json"
    idx = json.loads(index.read_text())
    idx["weight_map"] = {k.replace("model.", "transformer.", 1): v for k, v in idx["weight_map"].items()}
    index.write_text(json.dumps(idx))
    assert load_quantised(folder, "int8", "float32", "cpu", ATTN_NAME) is None
    assert load_quantised(tmp_path, "int8", "float32", "cpu", ATTN_NAME) is None  # no safetensors at all


@pytest.mark.parametrize("n_rows", [1, 7])
def test_blocked_lm_head_gives_the_same_logits(n_rows):
    from attnscope.core.loading.stream_load import block_output_projection

    torch.manual_seed(0)
    head = torch.nn.Linear(64, 1000, bias=False).to(torch.bfloat16)
    x = torch.randn(1, n_rows, 64).to(torch.bfloat16)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = head

        def get_output_embeddings(self):
            return self.lm_head

    m = M()
    with torch.inference_mode():
        ref = head(x)
        block_output_projection(m, rows=128)
        got = m.lm_head(x)
        got_last = m.lm_head(x[:, -1:])
    assert got.shape == (1, n_rows, 1000) and torch.equal(got, ref)
    assert torch.equal(got_last, ref[:, -1:])


def test_header_reader_matches_safetensors(q256):
    from attnscope.core.loading.safetensors_header import read_tensor
    from safetensors import safe_open

    f0 = safetensors_files(q256)[0]
    start, header = read_header(f0)
    with safe_open(f0, "pt") as st, open(f0, "rb") as fh:
        assert sorted(st.keys()) == sorted(header)
        for k in header:
            assert torch.equal(read_tensor(fh, start, header[k]), st.get_tensor(k))


def test_session_uses_the_streamed_load(q256):
    from attnscope.core.session import Session

    s = Session.load(str(q256), dtype="bfloat16", quantize="int8")
    assert s.info.quantization_runtime.endswith(", 14 linear layers")
    assert s.info.n_params == sum(p.numel() for p in _ordinary(q256, "bfloat16", "none")[0].parameters())
    assert is_quantised(s.backend.model.model.layers[1].mlp.down_proj.weight)


_PEAK = """
import resource, sys, torch
from attnscope.core.backends.torch_load import load_torch
load_torch(sys.argv[1], dtype="bfloat16", quantize="int8")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_streamed_peak_stays_below_the_float_checkpoint(tmp_path):
    """A 253 MB bf16 checkpoint (8 layers, hidden 1024) against the same with 1 layer: the streamed
    int8 load's peak RSS grows by much less than the 7 extra layers' bf16 bytes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(QCFG, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, vocab_size=272)
    big, small = tmp_path / "big", tmp_path / "small"
    for folder, c in ((big, cfg), (small, dict(cfg, num_hidden_layers=1))):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **c), dtype=torch.bfloat16)
        m.save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
    extra = sum(f.stat().st_size for f in safetensors_files(big)) - sum(
        f.stat().st_size for f in safetensors_files(small)
    )
    peaks = [
        int(
            subprocess.run(
                [sys.executable, "-c", _PEAK, str(f)], capture_output=True, text=True, check=True
            ).stdout
        )
        for f in (small, big)
    ]
    # 7 more layers: 210 MB at bf16, 105 MB at int8 (measured: +117 MB of peak). Holding the bf16
    # layers (the ordinary path) or the heap's freed temporaries (no malloc_trim: +430 MB) fails this.
    assert peaks[1] - peaks[0] < 0.75 * extra
