"""The fit estimate counts what a widening load holds (attnscope.core.loading.fit LOAD_COPY): a bfloat16
checkpoint loaded at float32 keeps the file's pages mapped beside the float32 copy until the load
ends, so its peak is the float32 weights plus the file (measured: 2.66 GB vs 1.91 GB after the load,
tests/make_synthetic.py Llama-3.2-1B --layers 2); at the checkpoint's own dtype nothing is added."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bf16_entry(tmp_path_factory):
    import torch
    from attnscope.core.loading.describe_model import describe_hf_folder
    from tiny_models import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("bf16") / "llama"
    tiny_model("llama").to(torch.bfloat16).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    e = describe_hf_folder(folder)
    assert e.supported and e.checkpoint_dtype == "bfloat16"
    return e


def test_float32_load_of_a_bf16_file_counts_the_file(bf16_entry):
    from attnscope.core.loading.fit import estimate_entry

    e = bf16_entry
    free = 10**10
    f32 = estimate_entry(e, 64, dtype="float32", free_bytes=free)
    assert f32.load_copy_bytes == 2 * e.n_params  # the bf16 file
    assert f32.weights_bytes == 4 * e.n_params
    after = f32.kv_cache_bytes + f32.capture_bytes
    assert f32.total_bytes == f32.weights_bytes + f32.runtime_bytes + max(after, 2 * e.n_params)
    assert "more while loading" in f32.summary()
    # at its own dtype, or quantised at load: nothing more
    bf = estimate_entry(e, 64, dtype="bfloat16", free_bytes=free)
    assert bf.load_copy_bytes == 0
    assert bf.total_bytes == bf.weights_bytes + bf.runtime_bytes + bf.kv_cache_bytes + bf.capture_bytes
    assert estimate_entry(e, 64, dtype="float32", free_bytes=free, quantize="int8").load_copy_bytes == 0
    # a long context: the capture after the load is the larger term, not added to the load's copy
    long = estimate_entry(e, 256, dtype="float32", free_bytes=free)
    assert long.total_bytes == long.weights_bytes + long.runtime_bytes + max(
        long.kv_cache_bytes + long.capture_bytes, long.load_copy_bytes
    )
