"""GPU telemetry: utilisation, power, clocks and throttling per step, from the NVML samples
``perfscope profile`` took beside the profiled window (``details.telemetry``)."""

from __future__ import annotations

from perfscope.record.schema import Telemetry
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import esc, note, num, pct, section, table

MAX_ROWS = 60


def _f(value, fmt: str, unit: str = "") -> str:
    v = num(value)
    return "-" if v is None else f"{v:{fmt}}{unit}"


def headline(record: Record) -> str | None:
    """``GPU utilisation 87% (NVML)`` for the verdict line (``not measured`` where no sample
    settled), or None without samples."""
    t = model.details(record).telemetry
    if t is None:
        return None
    if t.gpu_util_pct is None:
        return "GPU utilisation not measured" if t.unsettled is not None else None
    return f"GPU utilisation {t.gpu_util_pct:.0f}% ({t.source or 'NVML'})"


def _head(record: Record, t: Telemetry) -> str:
    """The headline with the samples, clocks, power, throttling and the sampler's own cost."""
    clocks, power = t.sm_clock_mhz or {}, t.power_w or {}
    throttled = t.throttled_share or 0.0
    reasons = ", ".join(f"{k} {pct(v, 0)}" for k, v in sorted((t.throttle or {}).items(), key=lambda kv: -kv[1]))
    return (f'<p class="verdict{" warn" if throttled >= 0.05 else ""}"><strong>{esc(headline(record) or "-")}</strong>'
            f"<small>{esc(_f(t.samples, ',.0f'))} samples every {esc(_f(t.interval_s, '.2f', ' s'))} in the "
            f"counted steps; SM clock {esc(_f(clocks.get('min'), '.0f'))}–{esc(_f(clocks.get('max'), '.0f', ' MHz'))}, "
            f"power {esc(_f(power.get('mean'), '.0f', ' W'))} mean, {esc(_f(power.get('max'), '.0f', ' W'))} peak; "
            + (f"clocks throttled in {esc(pct(throttled, 0))} of the samples ({esc(reasons)})" if throttled else
               "no clock throttling seen")
            + f". The sampler used {esc(pct(t.sampler_cpu_share, 2))} of one core."
            + (f" Utilisation and power: not measured, {esc(t.unsettled)}." if t.unsettled is not None else "")
            + "</small></p>")


def _step_row(s: dict) -> tuple[str, list[str]]:
    """A counted step's telemetry row, highlighted where some of its samples were throttled."""
    share = num(s.get("throttled_share"))
    return ("hl" if share else "", [esc(s.get("rank")), esc(s.get("step")), _f(s.get("gpu_util_pct"), ".0f", "%"),
                                    _f(s.get("power_w"), ".0f", " W"), _f(s.get("sm_clock_mhz"), ".0f", " MHz"),
                                    pct(share, 0), _f(s.get("telemetry_samples"), ".0f")])


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    t = model.details(record).telemetry
    title = "GPU telemetry"
    if t is None:
        return section("telemetry", title, note("Not recorded: the traces hold no telemetry record (perfscope profile "
                                                 "samples the GPU through NVML on a CUDA device)."))
    if t.skipped:
        return section("telemetry", title, note(f"Not sampled: {t.skipped}."))
    rows = [_step_row(s) for s in model.counted_steps(record)[:MAX_ROWS] if num(s.get("telemetry_samples")) is not None]
    tab = table([("rank", ""), ("step", ""), ("GPU utilisation", ""), ("power", ""), ("lowest SM clock", ""),
                 ("samples throttled", ""), ("samples", "")], rows,
                "Per counted step: NVML's utilisation (the share of its sample period a kernel ran) and power, "
                "averaged over the step's samples taken a full averaging period (up to 1 s) after the profiled "
                "window opened (earlier ones hold time before it); the lowest SM clock seen; the share of samples with a throttle "
                "reason. The timeline draws the samples under the step.")
    return section("telemetry", title, _head(record, t) + tab)
