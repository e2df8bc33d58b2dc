"""``--quantize int8|int4`` (torchao weight-only) keeps the capture exact for the model that ran.

The reference is transformers' eager attention of the *same quantised* model: the tiny folder is
loaded twice (AttnScope's attention, eager), both quantised by :func:`attnscope.core.loading.quantize.quantize_model`
(deterministic), and every head's captured weights must equal eager's ``output_attentions``.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("torchao")

from attnscope.core.errors import ModelLoadError, UnsupportedModelError  # noqa: E402
from attnscope.core.loading.quantize import INT4_GROUP, quantize_model, weight_bytes  # noqa: E402
from tiny_models import COMMON, tiny_tokenizer  # noqa: E402

IDS = [1, 40, 41, 42, 7, 8, 9, 100, 101, 102, 103, 60, 61, 62, 63, 64, 65, 66, 67, 68]
# hidden 256 and MLP 512: every projection's input is a multiple of the int4 group (128)
QCFG = dict(COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def qfolder(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("q") / "llama-256"
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **QCFG)).eval()
    m.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _eager(folder, dtype, mode):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
    quantize_model(m, mode)
    with torch.inference_mode():
        out = m(torch.tensor([IDS]), output_attentions=True)
    return m, out.logits[0].float().numpy(), [a[0].float().numpy() for a in out.attentions]


@pytest.mark.parametrize("mode, dtype", [("int8", "float32"), ("int8", "bfloat16"), ("int4", "bfloat16")])
def test_capture_equals_eager_of_the_same_quantised_model(qfolder, mode, dtype):
    from attnscope.core.session import Session

    s = Session.load(str(qfolder), dtype=dtype, quantize=mode)
    assert s.info.dtype == dtype
    assert s.info.quantization_runtime.startswith(f"{mode} weight-only (torchao ")
    assert s.info.quantization_runtime.endswith(", 14 linear layers")  # 2 layers × (q k v o gate up down)
    lin = s.backend.model.model.layers[0].self_attn.q_proj.weight
    assert type(lin).__name__ == ("Int8Tensor" if mode == "int8" else "Int4OpaqueTensor")
    assert not hasattr(s.backend.model.lm_head.weight, "qdata")  # lm_head kept at the load dtype
    s.backend.forward(IDS[:7])  # prefill in two pieces: cached decode path too
    s.backend.forward(IDS[7:])
    eager, logits, ref = _eager(qfolder, getattr(torch, dtype), mode)
    # bf16 eager rounds its softmax to bf16 (2^-8); float32 eager agrees with us to float32 roundoff
    tol = 1e-5 if dtype == "float32" else 8e-3
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(s.trace.weights(layer, head), ref[layer][head], atol=tol, rtol=0)


def test_int8_weights_close_to_float_and_smaller(qfolder):
    from transformers import AutoModelForCausalLM

    f = AutoModelForCausalLM.from_pretrained(qfolder, dtype=torch.float32).eval()
    q = AutoModelForCausalLM.from_pretrained(qfolder, dtype=torch.float32).eval()
    before = weight_bytes(q)
    quantize_model(q, "int8")
    after = weight_bytes(q)
    lin = [n for n, m in f.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    lin_bytes = sum(dict(f.named_modules())[n].weight.numel() for n in lin) * 4
    # every linear weight goes from 4 bytes to 1 byte (+ a few bytes of scale per output row)
    rows = sum(dict(f.named_modules())[n].weight.shape[0] for n in lin)
    assert lin_bytes // 4 < after - (before - lin_bytes) <= lin_bytes // 4 + rows * 8
    with torch.inference_mode():
        a = f(torch.tensor([IDS])).logits
        b = q(torch.tensor([IDS])).logits
    assert float((a - b).abs().max() / a.abs().max()) < 0.05


def test_int4_packs_half_a_byte_per_weight(qfolder):
    from transformers import AutoModelForCausalLM

    q = AutoModelForCausalLM.from_pretrained(qfolder, dtype=torch.bfloat16).eval()
    w = q.model.layers[0].mlp.down_proj.weight  # (256, 512)
    before = weight_bytes(q)
    quantize_model(q, "int4")
    from attnscope.core.loading.quantize import tensor_bytes

    packed = tensor_bytes(q.model.layers[0].mlp.down_proj.weight)
    n = w.numel()
    assert n // 2 <= packed <= n // 2 + (n // INT4_GROUP) * 2 * 4  # 4 bits + (scale, zero) per group
    assert weight_bytes(q) < before


def test_int4_loads_at_bfloat16(qfolder):
    from attnscope.core.session import Session

    s = Session.load(str(qfolder), dtype="float32", quantize="int4")
    assert s.info.dtype == "bfloat16"


def test_unknown_mode_is_one_line():
    from attnscope.core.session import Session

    with pytest.raises(
        ModelLoadError, match=r"^unknown quantisation 'int3': choose one of none, int8, int4$"
    ):
        Session.load("default", quantize="int3")


def test_quantize_none_changes_nothing(qfolder):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(qfolder, dtype=torch.float32).eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    assert quantize_model(m, "none") == ""
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


# -- pre-quantised Hugging Face checkpoints: one line per method and device ----------------------------
@pytest.mark.parametrize(
    "qcfg, cuda, pattern",
    [
        (
            {"quant_method": "awq", "bits": 4},
            False,
            r"^llama checkpoint quantised with awq 4-bit: its kernels \(gptqmodel\) run on a CUDA GPU, which this machine does not have",
        ),
        (
            {"quant_method": "gptq", "bits": 4},
            False,
            r"quantised with gptq 4-bit: its kernels \(optimum gptqmodel\) run on a CUDA GPU",
        ),
        (
            {"quant_method": "bitsandbytes", "load_in_4bit": True},
            False,
            r"quantised with bitsandbytes 4-bit: its kernels \(bitsandbytes\) run on a CUDA GPU",
        ),
        (
            {"quant_method": "awq", "bits": 4},
            True,
            r"quantised with awq 4-bit: loading it needs gptqmodel \(pip install gptqmodel\)$",
        ),
        (
            {"quant_method": "compressed-tensors"},
            False,
            r"quantised with compressed-tensors: loading it needs compressed-tensors \(pip install compressed-tensors\)$",
        ),
        (
            {"quant_method": "fp8"},
            True,
            r"quantised with fp8: AttnScope loads float checkpoints, GGUF, and quantised ones of: awq, gptq",
        ),
    ],
)
def test_prequantised_refusals_name_method_and_what_runs_it(qcfg, cuda, pattern):
    from attnscope.core.loading.quantize import prequantised_problem

    msg = prequantised_problem("llama", qcfg, cuda=cuda)
    assert msg is not None and "\n" not in msg
    assert __import__("re").search(pattern, msg), msg


def test_torchao_checkpoint_is_not_refused():
    from attnscope.core.loading.quantize import prequantised_problem

    assert prequantised_problem("llama", {"quant_method": "torchao"}, cuda=False) is None


def test_mlx_folder_refused_on_torch_names_mlx_backend(qfolder, tmp_path):
    import shutil

    from attnscope.core.session import Session

    folder = tmp_path / "mlx-4bit"
    shutil.copytree(qfolder, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization"] = {"group_size": 64, "bits": 4}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        UnsupportedModelError, match=r"MLX-quantised weights \(4-bit\).*open it with --backend mlx$"
    ):
        Session.load(str(folder))


# -- provenance: sidecars and sessions record precision and quantisation; reopening restores them ------
@pytest.mark.slow
def test_session_round_trip_restores_quantisation(qfolder, tmp_path):
    from attnscope.core.io import sessionfile as SF
    from attnscope.core.io.provenance import head_metadata
    from attnscope.core.session import Session

    s = Session.load(str(qfolder), dtype="bfloat16", quantize="int8")
    s.prefill("the cat sat on the mat", chat_template=False)
    meta = head_metadata(s, 1, 2)
    assert meta["dtype"] == "bfloat16"
    assert meta["quantization"] == {"file": "", "runtime": s.info.quantization_runtime, "mode": "int8"}
    path = SF.save(SF.SessionFile.from_session(s), tmp_path / "q")
    raw = json.loads(path.read_text())
    assert raw["dtype"] == "bfloat16" and raw["quantization"]["mode"] == "int8"
    sf = SF.load(path)
    assert sf.quantize == "int8" and SF.same_model(s, sf)
    again, warnings = SF.replay(sf)  # a fresh load: same dtype, same quantisation, same numbers
    assert again is not s and again.info.dtype == "bfloat16"
    assert again.info.quantization_runtime == s.info.quantization_runtime
    np.testing.assert_array_equal(again.weights(1, 2), s.weights(1, 2))
    plain = Session.load(str(qfolder), dtype="bfloat16")
    assert not SF.same_model(plain, sf)  # an unquantised session is not the saved one


def test_old_session_files_mean_unquantised():
    from attnscope.core.io import sessionfile as SF

    d = {
        "format": "attnscope.session",
        "version": 1,
        "model": {"ref": "default"},
        "backend": "torch",
        "dtype": "float32",
        "device": "cpu",
        "prompt": "hi",
        "chat_template": False,
        "n_prompt": 1,
        "token_ids": [1],
    }
    assert SF.SessionFile.from_dict(d).quantize == "none"
    line = 'bad session file: quantization is ["int8"], expected an object (file, runtime, mode)'
    with pytest.raises(SF.SessionFileError, match=f"^{re.escape(line)}$"):
        SF.SessionFile.from_dict(dict(d, quantization=["int8"]))


def test_gguf_file_quantisation_is_recorded(smol_session):
    assert smol_session.info.quantization_file == "Q4_1"
    assert smol_session.info.quantization_runtime == ""


def test_cli_json_records_dtype_and_quantisation(qfolder, tmp_path):
    from attnscope.core.cli.main import main

    out = tmp_path / "sinks.json"
    assert (
        main(
            [
                "sinks",
                "--model",
                str(qfolder),
                "--prompt",
                "the cat sat",
                "--no-chat-template",
                "--json",
                str(out),
                "--dtype",
                "bfloat16",
                "--quantize",
                "int4",
            ]
        )
        == 0
    )
    d = json.loads(out.read_text())
    assert d["dtype"] == "bfloat16" and d["quantization"]["mode"] == "int4"
    assert d["quantization"]["runtime"].startswith("int4 weight-only (torchao ")
