"""The machine a benchmark runs on: CPU, memory, versions, load, and its float32 matmul peak.

Qt-free. :func:`machine_info` is what every ``attnscope bench`` report records about the machine;
:func:`matmul_peak` the best ``(n, n) @ (n, n)`` float32 throughput (``2 n³`` FLOPs each), against
which a prefill's FLOP/s is read (:mod:`attnscope.core.bench.overhead`).
"""

from __future__ import annotations

import os
import platform
import time


def proc_bytes(path: str, key: str) -> int | None:
    """A ``key: N kB`` field of a ``/proc`` file (``/proc/meminfo``, ``/proc/self/status``) in bytes; None
    off Linux or where the field is absent."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def meminfo(key: str) -> int | None:
    """A field of ``/proc/meminfo`` in bytes (None off Linux)."""
    return proc_bytes("/proc/meminfo", key)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system does not say)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(device: str) -> dict:
    """CPU count, threads, versions, device name and memory of this machine (JSON-ready)."""
    import torch
    import transformers

    info = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_model": _cpu_model(),
        "mem_total_bytes": meminfo("MemTotal"),
        "mem_available_bytes": meminfo("MemAvailable"),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "loadavg_start": loadavg(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return info


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def matmul_peak(n: int = 2048, repeats: int = 5, device: str = "cpu") -> dict:
    """Best float32 matmul throughput: ``2 n³`` FLOPs per ``(n, n) @ (n, n)``.

    Returns ``{"n", "flop", "seconds": [...], "peak_flops"}`` (FLOP/s of the fastest run; the
    benchmark times it at its start and its end and keeps the best, so one busy moment does not
    make the prefill look faster than the machine's peak).
    """
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    torch.matmul(a, b)  # warm-up
    sync(device)
    secs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        secs.append(time.perf_counter() - t0)
    flop = 2 * n**3
    return {"n": n, "flop": flop, "seconds": secs, "peak_flops": flop / min(secs)}


def available_bytes(device: str) -> int | None:
    """Bytes free now: host ``MemAvailable``, or the GPU's free memory on CUDA."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info()[0]
    return meminfo("MemAvailable")
