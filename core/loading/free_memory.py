"""How much memory a load may use: free VRAM on a CUDA device, else the system's available RAM
(:func:`free_memory`). Asked by the precision decision (:mod:`attnscope.core.loading.precision`:
does float32 fit) and the fit estimate (:mod:`attnscope.core.loading.fit`). A leaf of ``core/loading``."""

from __future__ import annotations

from pathlib import Path

from attnscope.core import backend_registry as registry


def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_memory(backend: str = registry.DEFAULT, device: str = "cpu") -> tuple[int | None, str]:
    """``(free bytes or None, what was measured)`` for ``backend`` on ``device``.

    CUDA: ``torch.cuda.mem_get_info`` of that device (None when CUDA is not available). CPU and
    MLX: available system RAM (psutil if installed, else /proc/meminfo; None elsewhere).
    """
    spec = registry.get(backend)
    if "device" in spec.options and str(device).startswith("cuda"):
        try:
            import torch

            if not torch.cuda.is_available():
                return None, "VRAM (no CUDA device)"
            dev = torch.device(device)
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            free, _total = torch.cuda.mem_get_info(idx)
            return int(free), f"VRAM (cuda:{idx})"
        except Exception:  # noqa: BLE001 - a broken driver reads as "unknown", never as a crash
            return None, "VRAM"
    label = spec.memory
    try:
        import psutil

        return int(psutil.virtual_memory().available), label
    except ImportError:
        return _meminfo_available(), label
