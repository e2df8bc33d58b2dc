"""Peak memory of a stretch of code: the resident set size's high-water mark (:class:`PeakRSS`).

Qt-free. Linux: the kernel's high-water mark is reset by writing ``5`` to ``/proc/self/clear_refs``
(Linux ≥ 4.0) and read back as ``VmHWM``; elsewhere a sampling thread reads the RSS every
millisecond (it may miss spikes shorter than that).
"""

from __future__ import annotations

import threading
import time

from attnscope.core.bench.machine import proc_bytes


def status_bytes(key: str) -> int | None:
    """A field of ``/proc/self/status`` in bytes (``VmRSS``, ``VmHWM``); None off Linux."""
    return proc_bytes("/proc/self/status", key)


def rss_now() -> int:
    """This process's resident set size now, in bytes."""
    rss = status_bytes("VmRSS")
    if rss is not None:
        return rss
    import psutil  # pragma: no cover - non-Linux only

    return psutil.Process().memory_info().rss  # pragma: no cover


class PeakRSS:
    """Peak resident set size between :meth:`start` and :meth:`stop`, in bytes.

    Linux: resets the kernel's high-water mark (``echo 5 > /proc/self/clear_refs``) and reads
    ``VmHWM``; otherwise a thread samples the RSS every ``interval`` seconds (may miss spikes
    shorter than that).
    """

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.method = ""
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Reset the high-water mark; return the RSS now (bytes)."""
        self.before = rss_now()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if status_bytes("VmHWM") is None:
                raise OSError
            self.method = "VmHWM after clear_refs"
        except OSError:
            self.method = f"RSS sampled every {self.interval * 1e3:g} ms"
            self._peak = self.before
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self.before

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, rss_now())
            time.sleep(self.interval)

    def stop(self) -> int:
        """Peak RSS (bytes) since :meth:`start`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            return max(self._peak, rss_now())
        return max(status_bytes("VmHWM") or 0, rss_now())
