"""Memory of each profiled step: the process's peak resident set, and on CUDA the caching
allocator's peak allocated and reserved bytes; the capacity they are measured against.

:class:`MemoryProbe` is driven by :class:`~perfscope.collect.host.HostStepRecorder` at each step
boundary: :meth:`~MemoryProbe.begin` resets the peaks, :meth:`~MemoryProbe.end` reads them.

- Host: Linux's peak resident set ``VmHWM`` (``/proc/self/status``), reset by writing ``5`` to
  ``/proc/self/clear_refs`` (``proc(5)``, Linux 4.0 and later). Where the reset is refused the
  step's figure is left out: the lifetime peak is not a step's peak.
- CUDA, when the script has initialised it (perfscope never initialises CUDA itself):
  ``torch.cuda.reset_peak_memory_stats`` then ``max_memory_allocated``/``max_memory_reserved`` of
  the current device; its capacity from ``torch.cuda.mem_get_info`` (total bytes).

Side effect, documented in docs/collection.md: from the first step until the profiled window ends the peaks a script
reads itself (``torch.cuda.max_memory_allocated()``, ``VmHWM``, ``getrusage`` ``ru_maxrss``)
restart at every step boundary.
"""

from __future__ import annotations

import sys

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_MEMINFO = "/proc/meminfo"


def _status_kib(field: str, path: str = _STATUS) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_total_bytes() -> int | None:
    """The machine's memory (``MemTotal`` of ``/proc/meminfo``), bytes; None where unknown."""
    kib = _status_kib("MemTotal", _MEMINFO)
    return kib * 1024 if kib is not None else None


def _cuda():
    """torch.cuda when the script has initialised CUDA, else None (never initialises it)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the profiled run
        return None


class MemoryProbe:
    """Per-step peaks; every reading is a best effort that yields None where it cannot be taken."""

    def __init__(self) -> None:
        self._host_reset = False
        self._capacity: dict | None = None  # kept once the device's is known: capacities do not change

    def begin(self) -> None:
        """Reset the peaks at the start of a step."""
        try:
            with open(_CLEAR_REFS, "w", encoding="ascii") as f:
                f.write("5")
            self._host_reset = True
        except OSError:
            self._host_reset = False
        cuda = _cuda()
        if cuda is not None:
            try:
                cuda.reset_peak_memory_stats()
            except Exception:  # noqa: BLE001
                pass

    def end(self) -> dict:
        """The step's peaks, bytes: ``peak_rss_bytes``, ``device_peak_allocated_bytes``,
        ``device_peak_reserved_bytes`` (None where not measured)."""
        rss = _status_kib("VmHWM") if self._host_reset else None
        out = {"peak_rss_bytes": rss * 1024 if rss is not None else None,
               "device_peak_allocated_bytes": None, "device_peak_reserved_bytes": None}
        cuda = _cuda()
        if cuda is not None:
            try:
                out["device_peak_allocated_bytes"] = int(cuda.max_memory_allocated())
                out["device_peak_reserved_bytes"] = int(cuda.max_memory_reserved())
            except Exception:  # noqa: BLE001
                pass
        return out

    def capacity(self) -> dict:
        """``host_total_bytes`` and, on CUDA, ``device_total_bytes`` and ``device`` (``cuda:N``);
        read until the device's is found, then kept (it is asked at every recorded step)."""
        if self._capacity is not None and "device_total_bytes" in self._capacity:
            return self._capacity
        out = {"host_total_bytes": (self._capacity or {}).get("host_total_bytes") or host_total_bytes()}
        cuda = _cuda()
        if cuda is not None:
            try:
                index = cuda.current_device()
                out["device_total_bytes"] = int(cuda.mem_get_info(index)[1])
                out["device"] = f"cuda:{index}"
            except Exception:  # noqa: BLE001
                pass
        self._capacity = out
        return out
