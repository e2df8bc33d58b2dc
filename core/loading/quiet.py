"""Quiet libraries: the warnings and progress bars transformers and torchao print on import and load
(AttnScope reports its own progress, :mod:`attnscope.core.loading.progress`)."""

from __future__ import annotations


def quiet_imports() -> None:
    """Silence the warnings libraries log when first imported (no import here: cheap, call early).

    transformers imports torchao (the --quantize library) when installed; on a CPU build torchao
    logs one warning per CUDA extension it cannot load, torch's pytree one per enum it registers.
    """
    import logging

    for noisy in ("torchao", "torch.utils._pytree"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def quiet_transformers() -> None:
    """Silence transformers' console progress bars and warnings: AttnScope reports its own progress."""
    quiet_imports()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
