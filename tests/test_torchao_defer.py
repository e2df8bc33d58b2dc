"""torchao stays off the start-up path (core/loading/torchao_defer.py): transformers' quantiser
registry no longer imports it when a model loads, and a torchao-quantised checkpoint gets
transformers' torchao quantiser back with torchao's functions in it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from attnscope.core.loading import torchao_defer

CHECK = """
import json, sys
from attnscope.core.loading import torchao_defer
assert torchao_defer.defer()
import transformers.modeling_utils
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
q = sys.modules[torchao_defer.TARGET]
before = {"torchao": "torchao" in sys.modules, "flatten": hasattr(q, "flatten_tensor_state_dict")}
registered = AUTO_QUANTIZER_MAPPING["torchao"]  # the class transformers picks for such a checkpoint
try:
    object.__new__(registered).validate_environment(device_map=None)
    before["validate"] = "ok"
except ImportError as e:
    before["validate"] = str(e)
torchao_defer.restore()
object.__new__(registered).validate_environment(device_map=None)  # torchao is there now
after = {"torchao": "torchao" in sys.modules, "flatten": hasattr(q, "flatten_tensor_state_dict"),
         "same_class_registered": AUTO_QUANTIZER_MAPPING["torchao"] is registered}
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.slow  # a fresh Python importing transformers' model code (~5-20 s)
@pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None, reason="torchao (the quant extra) not installed"
)
def test_transformers_loads_without_torchao_until_a_torchao_checkpoint_asks():
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["before"] == {
        "torchao": False,
        "flatten": False,
        "validate": "Loading an torchao quantized model requires torchao library (`pip install torchao`)",
    }
    assert out["after"] == {"torchao": True, "flatten": True, "same_class_registered": True}


def test_which_configs_need_torchao():
    class Method:  # transformers' QuantizationMethod is a str enum: its .value is the name
        value = "torchao"

    class Cfg:
        def __init__(self, q):
            self.quantization_config = q

    assert torchao_defer.needs_torchao({"quantization_config": {"quant_method": "torchao"}})
    assert torchao_defer.needs_torchao(Cfg({"quant_method": "TorchAO"}))
    assert torchao_defer.needs_torchao(Cfg(type("Q", (), {"quant_method": Method()})()))
    assert not torchao_defer.needs_torchao({"quantization_config": {"quant_method": "awq"}})
    assert not torchao_defer.needs_torchao({"model_type": "llama"})
    assert not torchao_defer.needs_torchao(Cfg(None))
