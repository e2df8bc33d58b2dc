"""Head ablation against TransformerLens (PyPI ``transformer-lens``, skipped where it is not installed):
the loop TransformerLens users write, a ``TransformerBridge`` over the same tiny llama weights with a hook on
``blocks.{layer}.attn.hook_z`` zeroing one head (at the read-out position, or everywhere), gives the same
effects as :func:`attnscope.core.analysis.head_effects.head_effects` within 1e-4, and its own residual
decomposition gives the same direct logit attribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import save_tiny

IDS = [5, 9, 14, 20, 9, 14, 33, 41, 7, 14, 20, 9]


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["readout", "everywhere"])
def test_ablation_equals_transformer_lens(scope, tmp_path, monkeypatch):
    pytest.importorskip("transformer_lens")
    from attnscope.core.analysis.head_effects import head_effects, make_target
    from attnscope.core.session import Session
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    tl = TransformerBridge.boot_transformers(
        str(folder), hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(folder), device="cpu"
    )
    s = Session.load(str(folder))
    s.prefill(IDS)
    p = len(IDS) - 2
    t = make_target(s, "logprob", position=p)
    eff = head_effects(s, t, "zero", scope)
    D, H = s.info.head_dim, s.info.n_heads
    x = torch.tensor([IDS])

    def logprob(heads=(), layer=0):
        def zero(z, hook):
            pos = slice(p, p + 1) if scope == "readout" else slice(None)
            for h in heads:
                if z.ndim == 4:  # (batch, pos, head, d_head)
                    z[:, pos, h] = 0
                else:  # (batch, pos, head·d_head)
                    z[:, pos, h * D : (h + 1) * D] = 0
            return z

        hooks = [(f"blocks.{layer}.attn.hook_z", zero)] if heads else []
        with torch.no_grad():
            logits = tl.run_with_hooks(x, fwd_hooks=hooks, return_type="logits")[0, p].double()
        return float(torch.log_softmax(logits, -1)[t.token])

    clean = logprob()
    assert abs(eff.clean - clean) < 1e-4
    worst = 0.0
    for layer in range(s.info.n_layers):
        for h in range(H):
            worst = max(worst, abs(eff.query[layer, h] - (logprob([h], layer) - clean)))
        for k in range(s.info.n_kv_heads):
            worst = max(worst, abs(eff.kv[layer, k] - (logprob(list(s.info.group(k)), layer) - clean)))
    assert worst < 1e-4, worst
    assert np.abs(eff.query).max() > 1e-3  # the heads matter: the comparison is not of zeros


@pytest.mark.slow
def test_direct_logit_attribution_equals_transformer_lens(tmp_path, monkeypatch):
    """Direct logit attribution against TransformerLens's own decomposition on the same weights: its
    ``stack_head_results`` / ``decompose_resid`` with ``apply_ln=True`` (each part divided by the final
    norm's scale for the read-out residual, the scale frozen) projected on the logit-difference direction
    give :func:`~attnscope.core.analysis.head_effects.logit_attribution`'s heads, MLPs and embedding within
    1e-4. The final norm's weight is made non-trivial first (a tiny model's is all ones), and, since a
    ``TransformerBridge`` does not fold it into ``W_U``, the direction carries it explicitly."""
    pytest.importorskip("transformer_lens")
    from attnscope.core.analysis.head_effects import logit_attribution, make_target
    from attnscope.core.session import Session
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf.model.norm.weight.copy_(1 + 0.5 * torch.randn(hf.model.norm.weight.shape, generator=g))
    hf.save_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    tl = TransformerBridge.boot_transformers(
        str(folder), hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(folder), device="cpu"
    )
    s = Session.load(str(folder))
    s.prefill(IDS)
    p = len(IDS) - 2
    t = make_target(s, "logit_diff", position=p, token=7, other=11)
    dla = logit_attribution(s, t)
    with torch.no_grad():
        logits, cache = tl.run_with_cache(torch.tensor([IDS]))
        direction = (hf.lm_head.weight[7] - hf.lm_head.weight[11]) * hf.model.norm.weight
        heads = cache.stack_head_results(layer=-1, pos_slice=p, apply_ln=True)[:, 0] @ direction
        parts, labels = cache.decompose_resid(layer=-1, pos_slice=p, return_labels=True, apply_ln=True)
        parts = parts[:, 0] @ direction
    L, H = s.info.n_layers, s.info.n_heads
    assert np.abs(heads.double().numpy().reshape(L, H) - dla.heads).max() < 1e-4
    by_label = dict(zip(labels, parts.double().numpy(), strict=True))
    assert abs(by_label["embed"] - dla.embedding) < 1e-4
    assert np.abs(np.array([by_label[f"{i}_mlp_out"] for i in range(L)]) - dla.mlp).max() < 1e-4
    assert abs(float(logits[0, p, 7] - logits[0, p, 11]) - dla.logit) < 1e-4
    assert np.abs(dla.heads).max() > 1e-2  # the heads write to the direction: not a comparison of zeros
