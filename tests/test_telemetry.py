"""GPU telemetry: the source contract (every source), the sampler with an injected device and
clock, the record read back, its alignment to the trace's clock, per-step figures and throttling."""

from __future__ import annotations

import pytest
from tracegen import cpu_op, launch, step
from tracekit import analyze

from perfscope.collect.telemetry import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    DeviceSource,
    NvmlSource,
    TelemetrySampler,
    TelemetryUnavailable,
)
from perfscope.console import format_summary
from perfscope.record.host_steps import HOST_STEPS_KEY
from perfscope.record.telemetry_format import FIELDS, TELEMETRY_KEY, TelemetryRecord, parse


class FakeSource(DeviceSource):
    """A device whose readings follow a script: utilisation 0..100, throttled when asked."""

    name = "fake"

    def __init__(self, readings=None, slow_s=0.0):
        self.readings = list(readings or [])
        self.opened = self.closed = 0
        self.slow_s = slow_s

    def open(self, uuid, index):
        self.opened += 1
        return {"index": index, "name": "Fake GPU", "uuid": uuid or f"GPU-{index}"}

    def read(self):
        if self.slow_s:
            import time

            time.sleep(self.slow_s)
        base = {"gpu_util_pct": 50, "mem_util_pct": 20, "mem_used_bytes": 2**30, "power_mw": 250_000,
                "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "reasons": 0, "temp_c": 60}
        return {**base, **(self.readings.pop(0) if self.readings else {})}

    def close(self):
        self.closed += 1


def sources():
    return [FakeSource(), NvmlSource()]


@pytest.mark.parametrize("source", sources(), ids=lambda s: type(s).__name__)
def test_source_contract(source):
    try:
        device = source.open(None, 0)
    except TelemetryUnavailable as e:  # NVML without a GPU here: a reason, not a crash
        assert str(e)
        source.close()
        return
    assert set(device) == {"index", "name", "uuid"}
    sample = source.read()
    assert set(sample) == set(FIELDS[2:])
    assert all(v is None or isinstance(v, (int, float)) for v in sample.values())
    source.close()
    source.close()  # twice is harmless


def test_nvml_here_says_why_it_cannot_sample():
    s = TelemetrySampler(NvmlSource())
    s.bind(device=(None, 0))
    rec = s.record()
    assert rec["version"] == 1 and rec["skipped"]  # no NVML library on this machine
    s.stop()


def test_sampler_records_samples_on_its_clock():
    ticks = iter(range(1_000, 10_000, 100))
    src = FakeSource([{"gpu_util_pct": 10}, {"gpu_util_pct": 90, "reasons": 0x40}])
    s = TelemetrySampler(src, interval_s=0.1, clock=lambda: next(ticks))
    s.devices = [src.open("GPU-x", 0)]
    s.sample_once()
    s.sample_once()
    rec = s.record()
    assert rec["fields"] == list(FIELDS) and rec["source"] == "fake"
    assert [r[0] for r in rec["samples"]] == [1_000, 1_100]
    assert [r[2] for r in rec["samples"]] == [10, 90] and rec["samples"][1][8] == 0x40
    parsed, problems = parse(rec)
    assert problems == [] and parsed.samples[1]["reasons"] == 0x40
    assert rec["averaging_s"] == 0.0 and parsed.averaging_s == 0.0  # the source's: the fake reads what is now
    assert NvmlSource.averaging_s == 1.0
    # a record from before the field: as its source averages (NVML up to a second)
    assert parse({k: v for k, v in rec.items() if k != "averaging_s"} | {"source": "NVML"})[0].averaging_s == 1.0


def test_sampler_backs_off_when_reading_costs_over_one_percent():
    s = TelemetrySampler(FakeSource(slow_s=0.003), interval_s=MIN_INTERVAL_S)
    s.devices = [{"index": 0, "name": "x", "uuid": "u"}]
    for _ in range(4):
        s.sample_once()
    assert s.interval_s > MIN_INTERVAL_S and s.interval_s <= MAX_INTERVAL_S


def test_thread_samples_from_bind_to_stop():
    import time

    src = FakeSource()
    s = TelemetrySampler(src, interval_s=MIN_INTERVAL_S)
    s.bind()  # no CUDA in this process: nothing starts
    assert s._thread is None and s.record()["skipped"].startswith("no CUDA device")
    s.bind(device=("GPU-1", 1))
    time.sleep(0.2)
    s.stop()
    n = len(s.record()["samples"])
    assert n >= 3 and src.opened == 1 and src.closed == 1
    time.sleep(0.1)
    assert len(s.record()["samples"]) == n  # stopped for good


def test_unusable_samples_are_counted():
    rec = TelemetrySampler(FakeSource())
    rec.devices = [{"index": 0, "name": "x", "uuid": "u"}]
    rec.sample_once()
    r = rec.record()
    r["samples"] += [["x"] * len(FIELDS), [1, 5] + [0] * (len(FIELDS) - 2)]  # bad time; no device 5
    parsed, problems = parse(r)
    assert len(parsed.samples) == 1 and problems == [
        "2 telemetry samples are unusable (a value out of its range, or of the wrong type)"]
    assert parse({"version": 1, "skipped": "no GPU"})[0] == TelemetryRecord(skipped="no GPU")
    assert "not one this perfscope reads" in parse([1, 2])[0].skipped
    r["samples"] = [r["samples"][0][:2] + [1_000_000] + r["samples"][0][3:],  # utilisation beyond 100%
                    r["samples"][0][:8] + [-1, 60]]  # a negative reasons mask
    assert parse(r)[0].samples == []


BASE_NS = 1_790_000_000_000_000_000  # the trace's baseTimeNanoseconds
SKEW_NS = 3_000_000  # the samples' clock runs 3 ms behind the trace's


def traced(tmp_path, utils, reasons=None, host=True, shift_ns=0, averaging_s=0.0):
    """Four 1 ms GPU steps; telemetry samples every 250 µs with the given utilisation per step,
    from a device whose readings reach ``averaging_s`` back (None: the record does not say)."""
    events = []
    for i in range(4):
        t0 = 1000 * i
        events += [step(i + 1, t0, 1000), cpu_op("aten::mm", t0 + 5, 100),
                   *launch("gemm", t0 + 10, t0 + 20, 900, correlation=i + 1)]
    origin_ns = BASE_NS  # the first event is at ts 0
    samples = []
    for i, u in enumerate(utils):
        for k in range(4):
            t_trace = origin_ns + (1000 * i + 250 * k + 100) * 1000
            samples.append([t_trace - SKEW_NS + shift_ns, 0, u, 10, 2**30, 300_000, 1400 if (reasons or {}).get(i) else 1980,
                            2619, (reasons or {}).get(i, 0), 70])
    meta = {"baseTimeNanoseconds": BASE_NS,
            TELEMETRY_KEY: {"version": 1, "source": "NVML", "interval_s": 0.00025, "sampler_busy_s": 0.00001,
                            "devices": [{"index": 0, "name": "H100", "uuid": "GPU-1"}], "fields": list(FIELDS),
                            "samples": samples}}
    if averaging_s is not None:
        meta[TELEMETRY_KEY]["averaging_s"] = averaging_s
    if host:
        meta[HOST_STEPS_KEY] = {"version": 1, "steps": [
            {"step": i + 1, "wall_us": 1000, "thread_cpu_us": 990, "process_cpu_us": 995, "run_queue_us": 0,
             "start_unix_ns": origin_ns + 1000 * i * 1000 - SKEW_NS} for i in range(4)]}
    return analyze(tmp_path, events, **meta)


def test_samples_align_to_the_step_windows_through_the_host_record(tmp_path):
    a = traced(tmp_path, [20, 40, 60, 80])
    rows = a.steps.set_index("step")
    assert rows.loc[1, "gpu_util_pct"] == pytest.approx(20) and rows.loc[4, "gpu_util_pct"] == pytest.approx(80)
    assert (rows["telemetry_samples"] == 4).all()
    assert rows.loc[2, "power_w"] == pytest.approx(300)
    t = a.details.telemetry
    assert t["alignment"] == [{"rank": 0, "offset_us": pytest.approx(SKEW_NS / 1000), "source": "step starts"}]
    counted = rows[rows["counted"]]
    assert t["gpu_util_pct"] == pytest.approx(counted["gpu_util_pct"].mean())
    assert t["throttled_share"] == 0 and not any("throttled" in w for w in a.warnings)
    assert a.summary()["details"]["telemetry"]["source"] == "NVML"


def test_without_a_host_record_the_clocks_are_taken_as_they_are(tmp_path):
    a = traced(tmp_path, [20, 40, 60, 80], host=False)
    assert a.details.telemetry["alignment"][0]["source"] == "clocks"
    # 3 ms of skew moves every sample three steps early: only the last step's samples fall in step 1
    assert a.steps.set_index("step").loc[1, "gpu_util_pct"] == pytest.approx(80)


def test_throttling_is_called_out(tmp_path):
    a = traced(tmp_path, [90, 90, 90, 90], reasons={1: 0x40, 2: 0x4})
    t = a.details.telemetry
    assert t["throttle"]["thermal (hardware)"] > 0 and t["throttle"]["power cap (software)"] > 0
    assert t["sm_clock_mhz"]["min"] == 1400
    (w,) = [w for w in a.warnings if "throttled" in w]
    assert "thermal (hardware)" in w and "SM clock 1400-1980 MHz" in w


def test_a_run_without_a_gpu_says_why(tmp_path):
    events = [step(1, 0, 1000), cpu_op("aten::addmm", 10, 900)]
    a = analyze(tmp_path, events, **{TELEMETRY_KEY: {"version": 1, "skipped": "no CUDA device: the script did "
                                                                               "not use one"}})
    assert a.details.telemetry == {"skipped": "no CUDA device: the script did not use one"}
    assert "gpu_util_pct" not in a.steps


def test_samples_outside_every_counted_step_say_so(tmp_path):
    a = traced(tmp_path, [20, 40, 60, 80], shift_ns=10**12)  # a quarter of an hour after the trace
    t = a.details.telemetry
    assert t["skipped"].startswith("16 telemetry samples, none inside the counted steps")
    assert "gpu telemetry: not sampled (16 telemetry samples, none inside" in format_summary(a.summary())


def test_readings_that_reach_back_before_the_window_are_not_taken_for_it(tmp_path):
    # readings averaged over 1.5 ms: the samples of the first 1.5 ms of the window hold time before it
    a = traced(tmp_path, [20, 40, 60, 80], averaging_s=0.0015)
    rows = a.steps.set_index("step")
    assert rows.loc[1, "gpu_util_pct"] != rows.loc[1, "gpu_util_pct"]  # NaN: no settled sample in step 1
    assert rows.loc[2, "gpu_util_pct"] == pytest.approx(40) and rows.loc[4, "gpu_util_pct"] == pytest.approx(80)
    assert rows.loc[1, "sm_clock_mhz"] == 1980  # clocks are read as they are now: every sample
    t = a.details.telemetry
    assert t["samples"] == 16 and t["settled_samples"] == 10 and t["unsettled"] is None
    assert t["gpu_util_pct"] == pytest.approx((2 * 40 + 4 * 60 + 4 * 80) / 10)
    line = [x for x in format_summary(a.summary()).splitlines() if x.startswith("gpu:")][0]
    assert line.startswith("gpu: utilisation 64% (NVML, 10 of 16 samples: the others hold time before the window)")
    # a window longer than the averaging whose samples stopped early: said as such, not as a short window
    (tmp_path / "early").mkdir()
    early = traced(tmp_path / "early", [20, 40, 60, 80], averaging_s=0.0039)
    assert early.details.telemetry["unsettled"].startswith("no sample of the counted steps was taken 0.0039 s or more")


def test_a_window_shorter_than_nvmls_averaging_gets_no_utilisation(tmp_path):
    a = traced(tmp_path, [20, 40, 60, 80], averaging_s=None)  # NVML's second, 4 ms of steps
    t = a.details.telemetry
    assert t["gpu_util_pct"] is None and t["power_w"]["mean"] is None and t["settled_samples"] == 0
    assert t["unsettled"].startswith("the profiled steps span 4 ms, no more than the 1 s over which NVML averages")
    assert t["sm_clock_mhz"]["min"] == 1980
    line = [x for x in format_summary(a.summary()).splitlines() if x.startswith("gpu:")][0]
    assert line.startswith("gpu: utilisation not measured (the profiled steps span 4 ms") and "SM clock 1980" in line
    assert a.steps["gpu_util_pct"].isna().all()
