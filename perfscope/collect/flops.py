"""Counts the floating-point operations of one start-up step of the profiled script.

:class:`FlopStep` is driven by :class:`~perfscope.collect.host.HostStepRecorder` at the step
boundaries: it enters ``torch.utils.flop_counter.FlopCounterMode`` (a dispatch mode: every
operator of the step, forward and backward, passes through it) at the start of its target step
and leaves it at that step's end. The target is a start-up step before the profiled window
(:func:`target_step`), which the whole-run view leaves out of the run's pace: counting slows the
step it counts. The record (:mod:`perfscope.record.step_flops`) goes into the trace header with the CPU's
facts and the CUDA device's name, from which the analysis takes the peak rate.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

from perfscope.record.step_flops import FLOPS_KEY, CpuFacts, StepFlops, encode

MAX_OPERATORS = 12
# /proc/cpuinfo flags that decide a core's vector rate (docs/metrics.md, Model FLOPs utilisation).
RATE_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve")


def target_step(skip_first: int) -> int | None:
    """The step to count: the second (the first compiles, autotunes and warms caches), else the
    first, where the profiler's schedule leaves them untraced; None when it traces from step 1."""
    if skip_first >= 2:
        return 2
    return 1 if skip_first == 1 else None


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one ``field -> value`` dict per logical CPU."""
    out = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        out.append(fields)
    return out


def _cpu_number(block: dict[str, str]) -> int:
    try:
        return int(block["processor"])
    except ValueError:
        return -1


def _clock(sys_cpu: str, mhz: list[str]) -> tuple[float | None, str | None]:
    """(GHz, where it was read): ``cpuinfo_max_freq`` where the kernel gives it, else the
    highest ``cpu MHz``; (None, None) without either."""
    try:
        with open(f"{sys_cpu}/cpu0/cpufreq/cpuinfo_max_freq", encoding="ascii") as f:
            return int(f.read()) / 1e6, "cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    values = []
    for v in mhz:
        try:
            values.append(float(v))
        except ValueError:
            continue
    return (max(values) / 1e3, "cpu MHz") if values else (None, None)


def cpu_facts(cpuinfo: str = "/proc/cpuinfo", sys_cpu: str = "/sys/devices/system/cpu") -> CpuFacts:
    """The CPU's model, vendor, physical cores this process may use, clock and vector flags."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return CpuFacts()
    blocks = [b for b in _cpuinfo_blocks(text) if "processor" in b]
    first = blocks[0] if blocks else {}
    mine = _allowed(blocks)
    cores = {(b.get("physical id", "0"), b.get("core id", b["processor"])) for b in mine}
    ghz, source = _clock(sys_cpu, [b.get("cpu MHz", "") for b in mine])
    return CpuFacts(**_identity(first), cores=len(cores) or None, ghz=ghz if ghz and 0 < ghz <= 20 else None,
                    ghz_source=source)


def _identity(first: dict) -> dict:
    """The model, vendor and the vector flags that set the peak rate, from the first processor."""
    flags = set((first.get("flags") or first.get("Features") or "").split())
    return {"model": first.get("model name") or None, "vendor": first.get("vendor_id") or None,
            "flags": [f for f in RATE_FLAGS if f in flags]}


def _allowed(blocks: list[dict]) -> list[dict]:
    """The processors (``/proc/cpuinfo`` blocks) this process may run on (all where the platform
    does not say)."""
    if not hasattr(os, "sched_getaffinity"):
        return blocks
    allowed = os.sched_getaffinity(0)
    return [b for b in blocks if _cpu_number(b) in allowed]


def _compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (0 before dynamo is imported)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo, "counters", None)
    try:
        return int(counters["stats"].get("unique_graphs", 0)) if counters else 0
    except Exception:  # noqa: BLE001
        return 0


class FlopStep:
    """Counts the FLOPs of one step (see the module docstring).

    Args:
        target: The step to count (:func:`target_step`), or None for none.

    Attributes:
        active: The counter is on (the current step is being counted).
        record: The result once the step ended (or why it was not counted); None before.
    """

    def __init__(self, target: int | None) -> None:
        self.target = target
        self.active = False
        self.record: StepFlops | None = None
        self._counter = None
        self._by_dtype: dict[str, float] = defaultdict(float)
        self._graphs = _compiled_graphs()  # compiled before the script ran (by this process's host)

    def boundary(self, next_step: int) -> None:
        """A step ends and ``next_step`` begins (on the training thread). A script that has
        compiled a graph since the run began is not counted: the counter would recompile it."""
        if self._counter is not None:
            self._stop()
        if next_step == self.target and self.record is None:
            self._start(next_step)

    def close(self) -> None:
        """The run ends: a count still on is dropped (the script ended inside the counted step)."""
        if self._counter is not None:
            step = self.record.step if self.record else None
            self._leave()
            self.record = StepFlops(step=step, skipped="the script ended inside the counted step",
                                    cpu=cpu_facts(), device=_device_name())

    def header(self) -> tuple[str, str] | None:
        """``(key, JSON text)`` for the trace header once the step was counted (or skipped)."""
        return (FLOPS_KEY, encode(self.record)) if self.record is not None and not self.active else None

    # ----------------------------------------------------------------- internals
    def _start(self, step: int) -> None:
        torch = sys.modules.get("torch")
        if torch is None or _compiled_graphs() > self._graphs:
            self.record = StepFlops(step=step, skipped="the script compiles its model (torch.compile): not counted",
                                    cpu=cpu_facts(), device=_device_name())
            return
        try:
            from torch.utils.flop_counter import FlopCounterMode, flop_registry

            mapping = {k: self._recorder(f) for k, f in flop_registry.items()}
            counter = FlopCounterMode(display=False, custom_mapping=mapping)
            counter.__enter__()
        except Exception as exc:  # noqa: BLE001 - counting must never stop the script
            self.record = StepFlops(step=step, skipped=f"the FLOP counter could not start: {str(exc)[:160]}",
                                    cpu=cpu_facts(), device=_device_name())
            return
        self._counter, self.active = counter, True
        self.record = StepFlops(step=step)

    def _recorder(self, formula):
        """``formula`` (a registry entry taking the operator's raw arguments) that also keeps the
        FLOPs by the dtype of the first tensor argument; a formula that fails counts 0."""
        by_dtype = self._by_dtype

        def count(*args, out_val=None, **kwargs):
            try:
                n = formula(*args, out_val=out_val, **kwargs)
            except Exception:  # noqa: BLE001 - a shape the formula does not know: not counted
                return 0
            dtype = next((str(a.dtype) for a in args if hasattr(a, "dtype") and hasattr(a, "shape")), "unknown")
            by_dtype[dtype] += n
            return n

        count._get_raw = True  # the registry's entries already take raw arguments
        return count

    def _leave(self):
        counter, self._counter, self.active = self._counter, None, False
        try:
            counter.__exit__(None, None, None)
        except Exception:  # noqa: BLE001
            return None
        return counter

    def _stop(self) -> None:
        step = self.record.step if self.record else None
        counter = self._leave()
        if counter is None:
            self.record = StepFlops(step=step, skipped="the FLOP counter failed at the step's end", cpu=cpu_facts(),
                                    device=_device_name())
            return
        ops = counter.get_flop_counts().get("Global", {})
        top = sorted(((str(k), float(v)) for k, v in ops.items()), key=lambda kv: -kv[1])[:MAX_OPERATORS]
        self.record = StepFlops(step=step, flops=float(counter.get_total_flops()),
                                by_dtype={k: float(v) for k, v in self._by_dtype.items() if v},
                                by_operator=dict(top), cpu=cpu_facts(), device=_device_name())


def _device_name() -> str | None:
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return str(cuda.get_device_name()) if cuda is not None and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None
