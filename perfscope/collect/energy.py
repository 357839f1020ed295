"""Energy per step: a cumulative counter read at the traced steps' boundaries, into the host record.

Two counters, each an :class:`EnergyMeter` (the contract ``tests/test_energy.py`` runs on both):

- :class:`NvmlMeter`, on a process that uses CUDA: NVML's total-energy counter of the training
  thread's device (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded;
  Volta and later). One per GPU: the job's figure is the sum over its ranks.
- :class:`RaplMeter`, otherwise: the CPU packages' RAPL counters in Linux's powercap folder
  (``/sys/class/powercap/intel-rapl:N/energy_uj``, microjoules, wrapping at
  ``max_energy_range_uj``; AMD's are under the same name). The whole machine's packages: the
  job's figure counts each machine once.

Only the steps the profiler traces are read (two counter reads a step, a few microseconds each);
where neither counter is readable -- no NVML, a GPU without the counter, powercap absent or
readable by root only (Linux made ``energy_uj`` root-only in 2020, CVE-2020-8694) -- the record
says why and every step's ``energy_j`` is null.
"""

from __future__ import annotations

import abc
import os
import socket
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
# Where powercap is, where it is not at its usual place (a container mounting the host's sysfs
# elsewhere): the folder that holds the intel-rapl:N zones.
POWERCAP_ENV = "PERFSCOPE_POWERCAP"


def powercap_root() -> Path:
    """The powercap folder: ``$PERFSCOPE_POWERCAP``, else :data:`POWERCAP`."""
    return Path(os.environ.get(POWERCAP_ENV) or POWERCAP)


class EnergyUnavailable(Exception):
    """The counter cannot be read; the message says why, for the record."""


class EnergyMeter(abc.ABC):
    """A cumulative energy counter.

    Contract: :meth:`read` returns joules since some fixed origin, never decreasing between two
    calls on one meter (wraps are unfolded); it raises only :class:`EnergyUnavailable`.
    :attr:`source` names the counter, :attr:`unit` what it covers (``GPU`` or ``machine``).
    """

    source = ""
    unit = ""

    @abc.abstractmethod
    def read(self) -> float:
        """Joules so far."""


class RaplMeter(EnergyMeter):
    """The machine's CPU packages' RAPL counters (``root``: the powercap folder).

    Raises:
        EnergyUnavailable: no package zone, or one that cannot be read.
    """

    source = "RAPL"
    unit = "machine"

    def __init__(self, root: Path | None = None) -> None:
        root = root or powercap_root()
        # Top-level zones are the packages (intel-rapl:0, :1 ...); their subzones (intel-rapl:0:0)
        # are parts of them and would count twice.
        zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)
        if not zones:
            raise EnergyUnavailable(f"no RAPL package in {root} (not an x86 Linux host, or powercap is not mounted)")
        self._zones = [(z / "energy_uj", self._range(z)) for z in zones]
        self._last = [self._raw(path) for path, _ in self._zones]
        self._total_uj = 0.0

    @staticmethod
    def _range(zone: Path) -> float:
        try:
            return float((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            return float(2**32)  # the counter's width where the range is not published

    @staticmethod
    def _raw(path: Path) -> float:
        try:
            return float(path.read_text())
        except PermissionError:
            raise EnergyUnavailable(f"{path} is readable by root only (Linux's default since 2020)") from None
        except (OSError, ValueError) as e:
            raise EnergyUnavailable(f"{path} cannot be read: {e}") from None

    def read(self) -> float:
        for i, (path, span) in enumerate(self._zones):
            now = self._raw(path)
            step = now - self._last[i]
            self._total_uj += step if step >= 0 else step + span  # the counter wrapped
            self._last[i] = now
        return self._total_uj / 1e6


class NvmlMeter(EnergyMeter):
    """NVML's total-energy counter of one GPU (``uuid`` as torch reports it, else ``index``).

    Raises:
        EnergyUnavailable: no ``pynvml``, NVML does not start, no such device, or the device has
            no energy counter (before Volta).
    """

    source = "NVML"
    unit = "GPU"

    def __init__(self, uuid: str | None, index: int) -> None:
        try:
            import pynvml
        except ImportError:
            raise EnergyUnavailable("nvidia-ml-py (module pynvml) is not installed") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            if uuid:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            else:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._handle = handle
            self.read()
        except pynvml.NVMLError as e:
            raise EnergyUnavailable(f"NVML gives no energy counter for device {uuid or index}: {e}") from None

    def read(self) -> float:
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3
        except self._nvml.NVMLError as e:
            raise EnergyUnavailable(f"NVML's energy counter failed: {e}") from None


def open_meter(device: tuple[str | None, int] | None, powercap: Path | None = None) -> EnergyMeter:
    """The meter of this process: its CUDA device's (``device``: ``(uuid, index)``) where it uses
    one, else the machine's RAPL.

    Raises:
        EnergyUnavailable: with the reason neither can be read.
    """
    if device is not None:
        return NvmlMeter(*device)
    return RaplMeter(powercap or powercap_root())


class EnergyProbe:
    """Per-step energy for the host record: :meth:`begin` and :meth:`end` at a traced step's
    boundaries give ``{"energy_j": joules or None}``; :meth:`record` says which counter, or why none.

    The meter is opened at the first traced boundary (where the script has initialised CUDA by
    then, its device's), once; ``opener`` replaces :func:`open_meter` (stand-ins in tests).
    """

    def __init__(self, opener=None) -> None:
        self._opener = opener
        self._meter: EnergyMeter | None = None
        self._why: str | None = None
        self._start: float | None = None

    def _open(self) -> None:
        if self._meter is not None or self._why is not None:
            return
        try:
            if self._opener is not None:
                self._meter = self._opener()
            else:
                from perfscope.collect.telemetry import _training_device

                self._meter = open_meter(_training_device())
        except EnergyUnavailable as e:
            self._why = str(e)

    def _read(self) -> float | None:
        if self._meter is None:
            return None
        try:
            return self._meter.read()
        except EnergyUnavailable as e:
            self._meter, self._why = None, str(e)
            return None

    def joules(self) -> float | None:
        """The counter now (joules), opening it on the first call; None where none can be read
        (:meth:`record` says why). The measurement's :class:`~perfscope.measure.hooks.Recorder`
        reads it at every step boundary."""
        self._open()
        return self._read()

    def begin(self) -> None:
        self._start = self.joules()

    def end(self) -> dict:
        now = self._read()
        energy = now - self._start if now is not None and self._start is not None else None
        return {"energy_j": energy}

    def record(self) -> dict:
        """``{"source", "unit", "machine"}`` of the counter, or ``{"source": None, "why"}``."""
        if self._meter is not None:
            return {"source": self._meter.source, "unit": self._meter.unit, "machine": socket.gethostname()}
        return {"source": None, "why": self._why or "no traced step was read"}
