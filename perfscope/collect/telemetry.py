"""GPU telemetry beside the profiled window: a thread that samples the training process's device
through a :class:`DeviceSource` (NVML by default: :class:`NvmlSource`, package ``nvidia-ml-py``,
module ``pynvml``) and writes what it saw into the trace header (format:
:mod:`perfscope.record.telemetry_format`).

Rate and overhead: :data:`DEFAULT_INTERVAL_S` (10 samples a second), bounded to
[:data:`MIN_INTERVAL_S`, :data:`MAX_INTERVAL_S`]. NVML's utilisation counters integrate over their
own sample period (1/6 s to 1 s by device), so sampling faster adds cost, not detail. A sample is
six NVML calls of tens of microseconds each; the sampler times itself and doubles its interval
whenever reading takes more than :data:`MAX_BUSY_SHARE` (1%) of it, so its share of one core stays
under 1% (the record keeps ``sampler_busy_s``, and the analysis states the share).

The device is the one the training thread uses: at each step boundary
:meth:`TelemetrySampler.bind` (called on that thread) looks up ``torch.cuda.current_device()``
once CUDA is initialised (perfscope never initialises it), and the source opens that device by
its UUID. Before that, nothing is sampled; where NVML or a GPU is absent the record says why.
"""

from __future__ import annotations

import abc
import json
import sys
import threading
import time
from collections import deque

from perfscope.record.telemetry_format import FIELDS, MAX_SAMPLES, NVML_AVERAGING_S, TELEMETRY_KEY, VERSION

DEFAULT_INTERVAL_S = 0.1
MIN_INTERVAL_S = 0.02
MAX_INTERVAL_S = 1.0
MAX_BUSY_SHARE = 0.01


class TelemetryUnavailable(Exception):
    """The source cannot sample (no library, no device); the message says why, for the record."""


class DeviceSource(abc.ABC):
    """Where samples come from. Contract (``tests/test_telemetry.py`` runs it on every source):

    - :meth:`open` takes a CUDA device (its UUID as torch reports it, and its index), returns a
      description ``{"index", "name", "uuid"}``, and raises :class:`TelemetryUnavailable` with the
      reason when it cannot sample it;
    - :meth:`read` returns one sample of the opened device: a dict with the keys of
      :data:`~perfscope.record.telemetry_format.FIELDS` but ``unix_ns`` and ``device`` (values numbers, or
      None where the device does not report one); it may raise only :class:`TelemetryUnavailable`;
    - :meth:`close` releases what :meth:`open` took, and may be called without :meth:`open`;
    - :attr:`averaging_s` says how far back (seconds) a reading's utilisation and power reach.
    """

    name = "source"
    averaging_s = 0.0

    @abc.abstractmethod
    def open(self, uuid: str | None, index: int) -> dict: ...

    @abc.abstractmethod
    def read(self) -> dict: ...

    def close(self) -> None:  # noqa: B027 - a source may hold nothing
        pass


class NvmlSource(DeviceSource):
    """NVML through ``pynvml`` (the ``nvidia-ml-py`` package)."""

    name = "NVML"
    averaging_s = NVML_AVERAGING_S

    def __init__(self) -> None:
        self._nvml = None
        self._handle = None

    def open(self, uuid: str | None, index: int) -> dict:
        try:
            import pynvml
        except ImportError:
            raise TelemetryUnavailable("nvidia-ml-py (module pynvml) is not installed") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise TelemetryUnavailable(f"NVML cannot start: {e}") from None
        self._nvml = pynvml
        try:
            if uuid:
                text = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(text)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            found = pynvml.nvmlDeviceGetUUID(self._handle)
        except pynvml.NVMLError as e:
            self.close()
            raise TelemetryUnavailable(f"NVML has no device {uuid or index}: {e}") from None
        as_text = (lambda v: v.decode() if isinstance(v, bytes) else str(v))  # noqa: E731 - older bindings give bytes
        return {"index": index, "name": as_text(name), "uuid": as_text(found)}

    def _get(self, call, *args):
        try:
            return call(self._handle, *args)
        except self._nvml.NVMLError:  # not supported on this device (power on some boards, MIG): null
            return None

    def read(self) -> dict:
        n = self._nvml
        if n is None or self._handle is None:
            raise TelemetryUnavailable("NVML is not open")
        util = self._get(n.nvmlDeviceGetUtilizationRates)
        mem = self._get(n.nvmlDeviceGetMemoryInfo)
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        return {"gpu_util_pct": getattr(util, "gpu", None), "mem_util_pct": getattr(util, "memory", None),
                "mem_used_bytes": getattr(mem, "used", None), "power_mw": self._get(n.nvmlDeviceGetPowerUsage),
                "sm_clock_mhz": self._get(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM),
                "mem_clock_mhz": self._get(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_MEM),
                "reasons": self._get(reasons), "temp_c": self._get(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)}

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        self._nvml = self._handle = None


def _training_device() -> tuple[str | None, int] | None:
    """(UUID, index) of the calling thread's CUDA device once the script initialised CUDA, else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        index = cuda.current_device()
        uuid = getattr(cuda.get_device_properties(index), "uuid", None)
        return (str(uuid) if uuid is not None else None), index
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the profiled run
        return None


class TelemetrySampler:
    """Samples one device on a daemon thread from :meth:`bind` to :meth:`stop`.

    Args:
        source: The :class:`DeviceSource` (default :class:`NvmlSource`).
        interval_s: Seconds between samples, clipped to the bounds of the module docstring.
        clock: ``() -> ns since the epoch`` (``time.time_ns``; tests pass their own).
    """

    def __init__(self, source: DeviceSource | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 clock=time.time_ns) -> None:
        self.source = source if source is not None else NvmlSource()
        self.interval_s = min(max(float(interval_s), MIN_INTERVAL_S), MAX_INTERVAL_S)
        self._clock = clock
        self.samples: deque[list] = deque(maxlen=MAX_SAMPLES)
        self.devices: list[dict] = []
        self.skipped: str | None = None
        self.busy_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def bind(self, device: tuple[str | None, int] | None = None) -> None:
        """On the training thread: open its CUDA device (``device``, else the current one) and
        start sampling, once; without CUDA yet, nothing happens (called again at the next step)."""
        if self._thread is not None or self.skipped is not None:
            return
        device = device if device is not None else _training_device()
        if device is None:
            return
        try:
            self.devices = [self.source.open(*device)]
        except TelemetryUnavailable as e:
            self.skipped = str(e)
            return
        self._thread = threading.Thread(target=self._run, name="perfscope-telemetry", daemon=True)
        self._thread.start()

    def sample_once(self) -> None:
        """Take one sample now (the thread's loop body; tests call it directly)."""
        t0 = time.perf_counter()
        try:
            values = self.source.read()
        except TelemetryUnavailable as e:
            self.skipped = f"sampling stopped: {e}"
            self._stop.set()
            return
        row = [self._clock(), 0] + [values.get(f) for f in FIELDS[2:]]
        busy = time.perf_counter() - t0
        with self._lock:
            self.samples.append(row)
            self.busy_s += busy
        if busy > MAX_BUSY_SHARE * self.interval_s and self.interval_s < MAX_INTERVAL_S:
            self.interval_s = min(self.interval_s * 2, MAX_INTERVAL_S)  # keep the overhead under 1% of a core

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop the thread and release the device."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.source.close()

    def record(self) -> dict:
        """The record for the trace header (:mod:`perfscope.record.telemetry_format`)."""
        if not self.devices:
            why = self.skipped or "no CUDA device: the script did not use one"
            return {"version": VERSION, "skipped": why}
        with self._lock:
            samples, busy = list(self.samples), self.busy_s
        out = {"version": VERSION, "source": self.source.name, "interval_s": self.interval_s,
               "averaging_s": float(self.source.averaging_s), "sampler_busy_s": round(busy, 6), "devices": self.devices,
               "fields": list(FIELDS), "samples": samples}
        if self.skipped:
            out["stopped"] = self.skipped
        return out

    def header(self) -> tuple[str, str]:
        """``(key, JSON text)`` for ``add_metadata_json``."""
        return TELEMETRY_KEY, json.dumps(self.record())
