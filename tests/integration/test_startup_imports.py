"""Start-up (docs/benchmarks.md, "Start-up"): the window's path imports neither the remote
stack nor torchao nor accelerate nor torch's compiler, a load parses the GGUF header once, and what
transformers' import defers (core/loading/lean_import.py) is still there when used."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from attnscope.core.loading import gguf_meta
from attnscope.core.loading.lean_import import deferrable_block, registering_block

#: imported only when used: the quantiser library, the device-map library, the remote stack, sympy
NOT_AT_START = ("torchao", "accelerate", "ray", "sympy")
#: torch's compiler (dynamo and inductor): imported only when something compiles
COMPILER = ("torch._dynamo", "torch._inductor")
#: torch's distributed tensors, FSDP and symbolic shapes: imported only when used
TORCH_LATER = (
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed._composable.fsdp",
    "torch.fx.experimental.symbolic_shapes",
)
REMOTE = (
    "attnscope.core.remote.client",
    "attnscope.core.remote.server",
    "attnscope.core.remote.ray_engine",
    "attnscope.core.remote.wire",
)

WINDOW = """
import atexit, json, os, sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
os.environ["ATTNSCOPE_STARTUP_PROBE"] = "1"  # quit once the model is loaded (app/launch.py)
from attnscope.core.loading import gguf_meta
parses = []
parse = gguf_meta._parse_gguf_header
def counted(path, size):
    parses.append(str(path))
    return parse(path, size)
gguf_meta._parse_gguf_header = counted
def report():
    print("REPORT " + json.dumps({"modules": sorted(sys.modules), "parses": parses}), flush=True)
atexit.register(report)
from attnscope.app.cli import main
rc = main([])
"""


def _run(
    script: str, timeout: float = 300, args: list[str] | None = None, **env_vars: str
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **env_vars)
    out = subprocess.run(
        [sys.executable, "-c", script, *(args or [])],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_window_start_up_loads_the_model_without_the_heavy_stack(tmp_path):
    """The whole start-up of ``attnscope`` (window, then the embedded model, then Run enabled)."""
    out = _run(WINDOW, XDG_CONFIG_HOME=str(tmp_path))  # its settings file in tmp_path
    assert '"error": null' in out.stdout, out.stdout[-2000:]  # the probe saw the model ready
    report = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("REPORT "))[7:])
    modules = set(report["modules"])
    assert "transformers" in modules and "attnscope.core.session" in modules  # it did load
    loaded = sorted(m for m in modules if m.split(".")[0] in NOT_AT_START or m in REMOTE)
    assert loaded == []
    assert sorted(m for m in modules if m.startswith(COMPILER)) == []
    assert sorted(m for m in modules if m.startswith(TORCH_LATER)) == []
    # the embedded model is a GGUF: its checks, precision and quantisation share one parse
    assert len(report["parses"]) == 1, report["parses"]
    assert report["parses"][0].endswith(".gguf")


DEFERRED = """
import sys
from attnscope.core.loading.lean_import import Deferred, prepare
assert prepare()
import transformers.modeling_utils as mu
from transformers.quantizers import quantizer_torchao as qt
from transformers.integrations import accelerate as ia
from transformers.utils import is_accelerate_available, is_torchao_available
assert "torchao" not in sys.modules and "accelerate" not in sys.modules, "imported at start"
assert isinstance(qt.flatten_tensor_state_dict, Deferred)
assert isinstance(mu.add_hook_to_module, Deferred) and isinstance(ia.dispatch_model, Deferred)
assert ia.accelerate_max_memory.where == ("accelerate.utils", "get_max_memory")  # an "as" name
def inside():  # a check inside a function answers as it always did
    return is_torchao_available() and is_accelerate_available()
assert inside()
from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict
import accelerate.hooks, accelerate.utils
assert qt.flatten_tensor_state_dict.resolve() is flatten_tensor_state_dict
assert mu.add_hook_to_module.resolve() is accelerate.hooks.add_hook_to_module
assert ia.accelerate_max_memory.resolve() is accelerate.utils.get_max_memory
# called through the stand-in: accelerate's own answer
assert ia.accelerate_max_memory({"cpu": 1000}) == accelerate.utils.get_max_memory({"cpu": 1000})
print("deferred ok")
"""


def test_deferred_names_resolve_to_the_libraries_when_used():
    pytest.importorskip("torchao")
    pytest.importorskip("accelerate")
    out = _run(DEFERRED)
    assert "deferred ok" in out.stdout


TORCHAO_CHECKPOINT = """
import sys, tempfile
from attnscope.core.loading.lean_import import prepare
assert prepare()
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, TorchAoConfig
assert "torchao" not in sys.modules
cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
with tempfile.TemporaryDirectory() as d:
    LlamaForCausalLM(cfg).save_pretrained(d)
    from torchao.quantization import Int8WeightOnlyConfig
    m = AutoModelForCausalLM.from_pretrained(
        d, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()), dtype=torch.float32)
    w = m.model.layers[0].mlp.up_proj.weight
    print("quantised", type(w).__name__, m.hf_quantizer.__class__.__name__)
"""


@pytest.mark.slow
def test_a_torchao_quantised_load_still_runs_through_transformers():
    pytest.importorskip("torchao")
    out = _run(TORCHAO_CHECKPOINT)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("quantised "))
    kind, quantizer = line.split()[1:]
    assert quantizer == "TorchAoHfQuantizer"
    assert kind != "Parameter"  # torchao's tensor subclass, not a float weight


def _tree(src: str) -> ast.Module:
    return ast.parse(textwrap.dedent(src))


def test_deferrable_block_takes_only_import_only_ifs():
    src = """
        if is_x_available():
            from a.b import c as d, e
        if is_x_available():
            from f import g
        else:
            g = None
        if is_x_available():
            import h
        if is_y_available():
            from i import j
    """
    tree = _tree(src)
    block = deferrable_block(tree, 2, "is_x_available")
    assert block == ((0, "a.b", (("c", "d"), ("e", None))),)
    assert deferrable_block(tree, 4, "is_x_available") is None  # an else branch would run
    assert deferrable_block(tree, 8, "is_x_available") is None  # a module, not a name
    assert deferrable_block(tree, 10, "is_x_available") is None  # another check
    assert deferrable_block(tree, 3, "is_x_available") is None  # not the test's line


def test_registering_block_takes_only_one_registrys_register_calls():
    src = """
        if is_d_available():
            STYLES.register("a", Col(layout=Shard(-1)))
            STYLES.register("b", Row())
        if is_d_available():
            STYLES.register("c", Col())
            OTHER.register("d", Row())
        if is_d_available():
            STYLES.register("e", Col())
            x = 1
        if is_d_available():
            STYLES.register("f", Col())
        else:
            pass
    """
    tree = _tree(src)
    registry, source, line = registering_block(tree, 2, "is_d_available")
    assert (registry, line) == ("STYLES", 3)
    assert source.splitlines() == [
        "STYLES.register('a', Col(layout=Shard(-1)))",
        "STYLES.register('b', Row())",
    ]
    assert registering_block(tree, 5, "is_d_available") is None  # two registries
    assert registering_block(tree, 8, "is_d_available") is None  # something else too
    assert registering_block(tree, 11, "is_d_available") is None  # an else branch
    assert registering_block(tree, 2, "is_x_available") is None  # another check


BLOCKS = """
import json
from attnscope.core.loading import lean_import
parsed = []
table = lean_import.block_table
lean_import.block_table = lambda tree: parsed.append(1) or table(tree)
assert lean_import.prepare()
import transformers.modeling_utils as mu
print(json.dumps({"parsed": len(parsed), "deferred": repr(mu.add_hook_to_module)}))
"""


def test_deferrable_blocks_are_read_once_per_install(tmp_path):
    """The first start parses the transformers files whose module-level checks are deferred and keeps
    what it found; the next start reads that and defers the same names."""
    pytest.importorskip("accelerate")
    first = json.loads(_run(BLOCKS, ATTNSCOPE_CACHE_DIR=str(tmp_path)).stdout.splitlines()[-1])
    assert first["parsed"] >= 2 and (tmp_path / "transformers_deferrable_blocks.marshal").is_file()
    second = json.loads(_run(BLOCKS, ATTNSCOPE_CACHE_DIR=str(tmp_path)).stdout.splitlines()[-1])
    assert second["parsed"] == 0
    assert first["deferred"] == second["deferred"] == "<deferred accelerate.hooks.add_hook_to_module>"


def _write_gguf(path, value: int) -> None:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.value", value)
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_header_is_parsed_once_while_the_file_is_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    _write_gguf(path, 1)
    calls = []
    parse = gguf_meta._parse_gguf_header
    monkeypatch.setattr(gguf_meta, "_parse_gguf_header", lambda p, size: calls.append(p) or parse(p, size))
    first = gguf_meta.read_gguf_header(path)
    again = gguf_meta.read_gguf_header(str(path))
    assert len(calls) == 1 and again is first and first.metadata["test.value"] == 1
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    through = gguf_meta.read_gguf_header(link)  # the same file by another name: no parse, its own path
    assert len(calls) == 1 and through.path == link and through.tensors == first.tensors
    _write_gguf(path, 2)  # rewritten: parsed again
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert gguf_meta.read_gguf_header(path).metadata["test.value"] == 2
    assert len(calls) == 2


SCAN = """
import json, sys
from attnscope.core.loading import lean_import
assert lean_import.prepare()
import transformers, transformers.models
cache = lean_import._scan_cache[0]
from transformers.utils import import_utils
scan = import_utils.create_import_structure_from_path.scan  # transformers' own, uncached
llama = cache.models + "/llama"
print(json.dumps({"loaded": cache.loaded, "n": len(cache.memo),
                  "llama_same": cache(llama) == scan(llama),  # by value: a set's repr order varies by process
                  "config": transformers.LlamaConfig.__name__}))
"""


def test_model_zoo_scan_is_kept_for_the_next_start(tmp_path):
    """The first start scans and writes the cache file; the next reads it, with the same table."""
    first = json.loads(_run(SCAN, ATTNSCOPE_CACHE_DIR=str(tmp_path)).stdout.splitlines()[-1])
    assert first["loaded"] is False and first["n"] > 100 and first["llama_same"]
    assert (tmp_path / "transformers_import_structure.marshal").is_file()
    second = json.loads(_run(SCAN, ATTNSCOPE_CACHE_DIR=str(tmp_path)).stdout.splitlines()[-1])
    assert second["loaded"] is True and second["n"] == first["n"] and second["llama_same"]
    assert second["config"] == "LlamaConfig"
    (tmp_path / "transformers_import_structure.marshal").write_bytes(b"not marshal")  # damaged: scanned
    third = json.loads(_run(SCAN, ATTNSCOPE_CACHE_DIR=str(tmp_path)).stdout.splitlines()[-1])
    assert third["loaded"] is False and third["llama_same"]


TINY_LLAMA = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])  # (saving imports dynamo: its own process)
"""

COMPILER_LATER = """
import sys
from attnscope.core.loading.lean_import import build_deferred, compiler_deferred, prepare
assert prepare()
import torch
from transformers import AutoModelForCausalLM
from transformers import masking_utils
from transformers.integrations import deepgemm, finegrained_fp8
from transformers.generation.continuous_batching import cache as cb_cache
if True:
    d = sys.argv[1]
    assert "torch._dynamo" not in sys.modules, "imported by transformers' import"
    with build_deferred():  # as load_torch builds the model (on the meta device)
        lean = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert "torch._dynamo" not in sys.modules, "imported by the meta-device build"
    assert "sympy" not in sys.modules, "imported by the meta-device build"
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        lean_logits = lean(ids).logits
    assert "torch._dynamo" not in sys.modules, "imported by a forward"
    assert "sympy" not in sys.modules and "torch.distributed.tensor" not in sys.modules
    assert deepgemm.is_sm100._dynamo_marked_constant  # assume_constant_result, as torch sets it
    with compiler_deferred():  # a disable asked for before dynamo is imported
        def double(x):
            return x * 2
        disabled = torch.compiler.disable(double)
    assert disabled(torch.ones(2)).tolist() == [2.0, 2.0] and "torch._dynamo" not in sys.modules
    # the vmap'd mask uses TransformGetItemToIndex: dynamo's, imported now
    mask = masking_utils.sdpa_mask(batch_size=1, q_length=4, kv_length=4, allow_is_causal_skip=False,
                                   use_vmap=True)
    assert mask[0, 0].tolist() == torch.ones(4, 4, dtype=torch.bool).tril().tolist()
    assert "torch._dynamo" in sys.modules
    import torch._dynamo
    from torch._dynamo import trace_rules
    # allow_in_graph registered once dynamo came: deepgemm's, the fp8 one, modeling_utils' property
    from transformers.modeling_utils import PreTrainedModel
    for fn in (deepgemm._load_deepgemm_kernel, finegrained_fp8._load_finegrained_fp8_kernel,
               PreTrainedModel.can_record_outputs.fget):
        assert id(fn) in trace_rules._allowed_callable_ids, fn
    assert type(torch._dynamo) is type(sys) and torch._dynamo is sys.modules["torch._dynamo"]
    real = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()  # built with dynamo
    with torch.no_grad():
        real_logits = real(ids).logits
    lean_sd, real_sd = lean.state_dict(), real.state_dict()
    assert lean_sd.keys() == real_sd.keys()
    assert all(torch.equal(lean_sd[k], real_sd[k]) for k in lean_sd)
    assert torch.equal(lean_logits, real_logits)
    assert cb_cache.PagedAttentionCache.update.__wrapped__.__name__ == "update"
    # the disable taken before dynamo came is dynamo's now: a full graph cannot go through it
    assert torch.compile(lambda x: disabled(x) + 1, backend="eager")(torch.ones(2)).tolist() == [3.0, 3.0]
    try:
        torch.compile(lambda x: disabled(x) + 1, backend="eager", fullgraph=True)(torch.ones(2))
        print("fullgraph went through a disabled function")
    except Exception as e:
        print("fullgraph refused:", type(e).__name__)
print("compiler later ok")
"""


@pytest.mark.slow
def test_torchs_compiler_is_imported_only_when_used_and_the_model_is_the_same(tmp_path):
    """transformers' module-level compiler marks and the meta-device build do not import dynamo;
    dynamo imported later gets the registrations, and the model built before equals one built after
    (weights and logits), as the vmap'd mask does (its ``TransformGetItemToIndex`` imported then)."""
    _run(TINY_LLAMA, args=[str(tmp_path)])
    out = _run(COMPILER_LATER, args=[str(tmp_path)])
    assert "compiler later ok" in out.stdout, out.stdout[-2000:]
    assert "fullgraph refused" in out.stdout, out.stdout[-2000:]


DYNAMO_WITHIN = """
import sys
from attnscope.core.loading.lean_import import Deferred, compiler_deferred, prepare
assert prepare()
import torch
import transformers.masking_utils as mu
assert isinstance(mu.TransformGetItemToIndex, Deferred) and "torch._dynamo" not in sys.modules
with compiler_deferred():  # a module of dynamo imported within: the real dynamo, its own modules
    import torch._dynamo.config as config
    assert hasattr(config, "cache_size_limit")
    assert type(sys.modules["torch._dynamo"]) is type(sys) and torch._dynamo is sys.modules["torch._dynamo"]
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    assert isinstance(TransformGetItemToIndex, type)
with compiler_deferred():  # dynamo already imported: nothing stands in
    from torch._dynamo import config as again
    assert again is config
assert mu.TransformGetItemToIndex.resolve() is TransformGetItemToIndex
print("within ok")
"""


def test_a_module_of_dynamo_imported_within_the_stand_ins_is_the_real_one():
    assert "within ok" in _run(DYNAMO_WITHIN).stdout


LEAN_DEFAULT = """
import sys, torch
from attnscope.core.loading.lean_import import prepare
assert prepare()
from attnscope.core.backends.torch_load import load_torch
torch.manual_seed(0)  # the RNG state after the load is compared too (the plain load seeds alike)
m, tok, info = load_torch(None)
later = [n for n in ("sympy", "torch.distributed.tensor", "torch.fx.experimental.symbolic_shapes") if n in sys.modules]
ids = torch.tensor([tok("The capital of France is")["input_ids"]])
with torch.no_grad():
    logits = m(ids).logits
torch.save({"sd": m.state_dict(), "logits": logits, "ids": ids, "folder": m.config._name_or_path,
            "dtype": info.dtype, "rng": torch.get_rng_state(), "later": later}, sys.argv[1])
"""

PLAIN_DEFAULT = """
import sys, torch
from attnscope.core.backends.hf_attention import ATTN_NAME, register_attention
from transformers import AutoModelForCausalLM
lean = torch.load(sys.argv[1])
register_attention()
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(lean["folder"], dtype=getattr(torch, lean["dtype"]),
                                         attn_implementation=ATTN_NAME).eval()
assert "torch.distributed.tensor" in sys.modules  # transformers' own import: the plain path
with torch.no_grad():
    logits = m(lean["ids"]).logits
sd = m.state_dict()
assert sd.keys() == lean["sd"].keys()
different = [k for k in sd if sd[k].dtype != lean["sd"][k].dtype or not torch.equal(sd[k], lean["sd"][k])]
print("PLAIN", {"later": lean["later"], "different": different, "n": len(sd),
                "logits_equal": torch.equal(logits, lean["logits"]),
                "rng_equal": torch.equal(torch.get_rng_state(), lean["rng"])})
"""


@pytest.mark.slow
def test_default_model_loaded_lean_equals_a_plain_transformers_load(tmp_path):
    """The default model loaded as the window loads it (torch's distributed tensors, symbolic shapes,
    sympy, compiler and torchao not imported) has the weights, logits and RNG state of a plain
    transformers load of the same folder (one that imports them all), bit for bit."""
    out = tmp_path / "lean.pt"
    _run(LEAN_DEFAULT, args=[str(out)])
    line = next(
        ln for ln in _run(PLAIN_DEFAULT, args=[str(out)]).stdout.splitlines() if ln.startswith("PLAIN ")
    )
    report = ast.literal_eval(line[6:])
    assert report["later"] == []  # none of them imported by the lean load
    assert report["n"] > 0 and report["different"] == []
    assert report["logits_equal"] and report["rng_equal"]


DISTRIBUTED_LATER = """
import sys, torch
from attnscope.core.loading.lean_import import prepare
assert prepare()
import transformers.modeling_utils
from transformers.distributed import fsdp, sharding_utils, tensor_parallel
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
from transformers.distributed.utils import is_dtensor
assert "torch.distributed.tensor" not in sys.modules and "torch.distributed.fsdp" not in sys.modules
stand_in = sharding_utils.DTensor
assert repr(stand_in) == "<deferred torch.distributed.tensor.DTensor>"
assert tensor_parallel.DTensor is stand_in  # one stand-in per name
assert not isinstance(torch.zeros(2), stand_in) and not is_dtensor(torch.zeros(2))
assert "torch.distributed.tensor" not in sys.modules
import inspect
shard_signature = inspect.signature(fsdp.fully_shard)  # torch's own (imported for it)
from torch.distributed._composable.fsdp import fully_shard
assert shard_signature == inspect.signature(fully_shard) and fsdp.fully_shard is fully_shard
# the registry is used: the registrations run (with torch's placements, imported now)
styles = {k: type(ALL_PARALLEL_STYLES[k]).__name__ for k in ALL_PARALLEL_STYLES}
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.fsdp import MixedPrecisionPolicy
assert type(ALL_PARALLEL_STYLES["colwise"].output_layouts) is Shard
assert ALL_PARALLEL_STYLES["grouped_gemm"].placement == Shard(0)
# the stand-ins bound in transformers' modules are torch's own now
assert sharding_utils.DTensor is DTensor and tensor_parallel.Replicate is Replicate
assert fsdp.MixedPrecisionPolicy is MixedPrecisionPolicy
assert sharding_utils._local_shard_size_and_offset(8, 2, 1) == (4, 4)
# a real DTensor (one process): the checks that saw none before see it now
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
mesh = torch.distributed.device_mesh.DeviceMesh("cpu", [0])
dt = DTensor.from_local(torch.ones(4), mesh, [Replicate()])
assert is_dtensor(dt) and isinstance(dt, stand_in) and issubclass(type(dt), stand_in)
assert not is_dtensor(torch.ones(4))
dist.destroy_process_group()
print("STYLES", sorted(styles.items()))
"""

PLAIN_STYLES = """
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
import transformers.modeling_utils
print("STYLES", sorted((k, type(ALL_PARALLEL_STYLES[k]).__name__) for k in ALL_PARALLEL_STYLES))
"""


def test_torchs_distributed_tensors_are_imported_when_used():
    """transformers' module-level imports of torch's distributed tensors and FSDP are stand-ins that
    see no DTensor before torch's module is imported, become torch's own names when it is, and the
    parallel styles transformers registers are all there (with torch's placements) once the registry
    is used."""
    lean = _run(DISTRIBUTED_LATER).stdout.splitlines()
    plain = _run(PLAIN_STYLES).stdout.splitlines()
    lean_styles = next(ln for ln in lean if ln.startswith("STYLES "))
    plain_styles = next(ln for ln in plain if ln.startswith("STYLES "))
    assert lean_styles == plain_styles and "'colwise'" in lean_styles


SYMBOLIC = """
import builtins, sys, torch
from attnscope.core.loading import lean_import
python_import = builtins.__import__
with lean_import.build_deferred():
    as_torch = {"__name__": "torch._prims_common"}  # a caller that gets the stand-ins
    exec("import sympy; from torch.fx.experimental.symbolic_shapes import guard_or_false", as_torch)
    assert "sympy" not in sys.modules and as_torch["guard_or_false"] is lean_import.SYMBOLIC_SHAPES_NAMES["guard_or_false"]
    assert not isinstance(1, as_torch["sympy"].Basic) and "sympy" not in sys.modules
    import torch.utils._sympy.functions as fns  # any other module: sympy itself
    assert fns.sympy is sys.modules["sympy"] and type(fns.sympy) is type(sys)
    exec("import sympy as again", as_torch)  # imported now: sympy itself for everyone
    assert as_torch["again"] is sys.modules["sympy"]
    assert isinstance(fns.sympy.Integer(2), as_torch["sympy"].Basic)  # the stand-in asks sympy's own now
assert builtins.__import__ is python_import  # Python's own again
import torch.fx.experimental.symbolic_shapes as real
cases = {
    "expect_true": [(True,), (False,), (1,)],
    "guard_or_false": [(True,), (False,), (0,)],
    "guard_or_true": [(True,), (False,)],
    "statically_known_true": [(True,), (False,), (2,)],
    "is_nested_int": [(3,), (2.5,)],
    "sym_eq": [((1, 2), (1, 2)), ((1, 2), (1, 3)), ([1, 2], (1, 2, 3)), (torch.Size([2, 3]), (2, 3)), (1, 1), (1.0, 1.0)],
    "sym_and": [(True,), (True, False), (True, True, True)],
    "sym_or": [(False,), (False, True), (False, False)],
}
def answer(f, args):
    try:
        return f(*args)
    except Exception as e:
        return type(e).__name__
for name, calls in cases.items():
    for args in calls:
        mine, theirs = answer(lean_import.SYMBOLIC_SHAPES_NAMES[name], args), answer(getattr(real, name), args)
        assert mine == theirs and type(mine) is type(theirs), (name, args, mine, theirs)
print("symbolic ok")
"""


def test_symbolic_shape_stand_ins_answer_as_torch_does():
    """What building on the meta device asks torch's symbolic shapes, answered for plain values
    without importing them, is what torch's own functions answer (errors included); a module that
    imports sympy itself within the stand-ins gets sympy."""
    assert "symbolic ok" in _run(SYMBOLIC).stdout
