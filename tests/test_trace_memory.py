"""Memory from the traces' allocator instants (``details.trace_memory``): levels, per-step peaks and
growth, and the operators charged, worked out by hand on a small trace, then checked on a real
2021 trace and a CPU trace recorded here."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import msgspec
import numpy as np
import pytest
from tracegen import HOST_PID, MAIN_TID, cpu_op, step, write_trace

import perfscope
from perfscope.record import codec


def instant(ts, size, total=None, reserved=None, device_type=0, device_id=-1, tid=MAIN_TID):
    args = {"Device Type": device_type, "Device Id": device_id, "Bytes": size}
    if total is not None:
        args.update({"Total Allocated": total, "Total Reserved": reserved if reserved is not None else 0})
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": HOST_PID, "tid": tid, "ts": ts, "args": args}


def _events(with_totals: bool):
    t = (lambda v: v) if with_totals else (lambda v: None)
    events = []
    for n in (1, 2, 3):
        at = n * 1000
        events += [step(n, at, 1000), cpu_op("aten::mm", at + 100, 500), cpu_op("aten::empty", at + 110, 10)]
    # cpu: +100 in step 1's aten::empty (inside aten::mm), freed; +200 in step 2, kept; +50 and a free
    # in step 3, and +10 outside any operator. Levels: 100, 0, 200, 250, 200, 210.
    events += [instant(1115, 100, t(100)), instant(1700, -100, t(0)), instant(2115, 200, t(200)),
               instant(3115, 50, t(250)), instant(3800, -50, t(200)), instant(3900, 10, t(210))]
    # cuda:0: 1000 bytes in step 1, freed in it; the allocator keeps 2048 reserved
    events += [instant(1130, 1000, t(1000), t(2048), 1, 0), instant(1500, -1000, t(0), t(2048), 1, 0)]
    return events


def _view(tmp_path, with_totals=True):
    analysis = perfscope.analyze(write_trace(tmp_path / "trace.json", _events(with_totals)))
    assert sorted(analysis.steps["step"].tolist()) == [1, 2, 3]
    (trace,) = analysis.details.trace_memory
    return {d.device: d for d in trace.devices}, trace


def test_levels_peaks_growth_and_charged_operators_by_hand(tmp_path):
    devices, trace = _view(tmp_path)
    assert [d for d in devices] == ["cuda:0", "cpu"]  # most bytes allocated first: 1000 > 360
    cpu, cuda = devices["cpu"], devices["cuda:0"]
    assert cpu.relative is False and cpu.peak_reserved_bytes is None  # the CPU allocator keeps no reserve
    assert cpu.since_profiler_start is True and cuda.since_profiler_start is False
    from perfscope.console_views import trace_memory_line
    from perfscope.record.view import record_of

    only_cpu = {"details": {"trace_memory": [msgspec.to_builtins(msgspec.structs.replace(trace, devices=[cpu]))]}}
    assert "since the profiler started (its count, not the process's memory)" in trace_memory_line(record_of(only_cpu))
    assert (cpu.events, cpu.allocations, cpu.allocated_bytes) == (6, 4, 360)
    assert cpu.peak_allocated_bytes == 250 and cpu.growth_bytes == 210  # 210 at the end, 0 before
    assert msgspec.to_builtins(cpu.steps) == [
        {"step": 1, "peak_allocated_bytes": 100, "growth_bytes": 0, "allocations": 1},
        {"step": 2, "peak_allocated_bytes": 200, "growth_bytes": 200, "allocations": 1},
        {"step": 3, "peak_allocated_bytes": 250, "growth_bytes": 10, "allocations": 2},  # 200 -> 210
    ]
    # charged to aten::mm, not the aten::empty that only provided the memory
    assert [(o.name, o.allocations, o.bytes) for o in cpu.top_operators] == [
        ("aten::mm", 3, 350), ("(outside any operator)", 1, 10)]
    assert cpu.top_operators[0].share == pytest.approx(350 / 360)
    curve = np.array([[p[0], p[1]] for p in cpu.curve])
    assert curve[0].tolist() == [0.0, 0.0] and curve[-1].tolist() == [3.0, 210.0]  # 3 steps of 1 ms
    assert curve[:, 1].max() == 250 and (np.diff(curve[:, 0]) >= 0).all()  # no peak averaged away
    assert cuda.peak_allocated_bytes == 1000 and cuda.peak_reserved_bytes == 2048
    assert [s.peak_allocated_bytes for s in cuda.steps] == [1000, 0, 0]
    assert all(p[2] == 2048 for p in cuda.curve[1:])


def test_a_trace_without_allocator_totals_gives_changes_since_its_first_instant(tmp_path):
    devices, _ = _view(tmp_path, with_totals=False)
    cpu = devices["cpu"]
    assert cpu.relative is True and cpu.peak_allocated_bytes == 250 and cpu.growth_bytes == 210
    assert cpu.peak_reserved_bytes is None


def test_no_allocator_instants_no_section(tmp_path):
    events = [e for e in _events(True) if e["ph"] == "X"]
    assert perfscope.analyze(write_trace(tmp_path / "t.json", events)).details.trace_memory is None


def test_bad_instants_are_left_out_and_the_rest_read(tmp_path):
    events = _events(True) + [
        {"ph": "i", "name": "[memory]", "pid": HOST_PID, "tid": MAIN_TID, "ts": 3950, "args": {"Bytes": "lots"}},
        {"ph": "i", "name": "[memory]", "pid": HOST_PID, "tid": MAIN_TID, "ts": "x", "args": {"Bytes": 5}},
        {"ph": "i", "name": "[memory]", "pid": HOST_PID, "tid": MAIN_TID, "ts": 3960, "args": None}]
    analysis = perfscope.analyze(write_trace(tmp_path / "t.json", events))
    cpu = {d.device: d for d in analysis.details.trace_memory[0].devices}["cpu"]
    assert cpu.events == 6 and cpu.peak_allocated_bytes == 250


def test_the_summary_holds_it_and_the_report_and_console_show_it(tmp_path):
    trace = write_trace(tmp_path / "trace.json", _events(True))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(trace), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "memory (allocator records): cuda:0 peak 0.00 GiB allocated, +0.0 MiB over the counted steps" in proc.stdout
    summary = codec.load_summary(out / "summary.json")  # validated against the record's schema
    assert summary["details"]["trace_memory"][0]["devices"][1]["device"] == "cpu"
    html = (out / "report.html").read_text()
    memory = html[html.index('id="memory"'):]
    memory = memory[: memory.index("</section>")]
    assert "From the traces&#x27; allocator records" in memory or "From the traces' allocator records" in memory
    assert memory.count("<svg") == 2 and "aten::mm" in memory and "(outside any operator)" in memory


def test_a_real_2021_trace_agrees_with_its_own_running_sum(shared_traces):
    path = shared_traces / "tb_plugin" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    gpu = sorted((e["ts"], e["args"]["Bytes"]) for e in events
                 if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)
    level = np.cumsum([b for _, b in gpu])
    ts = np.array([t for t, _ in gpu])
    spans = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}
    analysis = perfscope.analyze(path)
    cuda = {d.device: d for d in analysis.details.trace_memory[0].devices}["cuda:0"]
    assert cuda.relative is True and cuda.events > 0
    for row in cuda.steps:
        a, b = spans[row.step]
        inside = level[(ts >= a) & (ts < b)]  # the step's CPU range lies inside its window
        assert inside.max() <= row.peak_allocated_bytes <= level.max()
    assert cuda.peak_allocated_bytes == max(r.peak_allocated_bytes for r in cuda.steps)
    assert cuda.growth_bytes == sum(r.growth_bytes for r in cuda.steps)  # the steps are contiguous
    names = [o.name for o in cuda.top_operators]
    assert names and not set(names) & {"aten::empty", "aten::empty_strided"}
    assert sum(o.bytes for o in cuda.top_operators) <= cuda.allocated_bytes


SCRIPT = """
import torch
from torch.profiler import profile, schedule, ProfilerActivity
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
             schedule=schedule(wait=0, warmup=1, active=4, repeat=1)) as p:
    for _ in range(5):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(torch.zeros(1 << 16))  # 256 KiB kept alive every step: steady growth
        p.step()
p.export_chrome_trace(%r)
"""


def test_a_cpu_trace_recorded_here_has_allocator_totals_and_shows_the_growth(tmp_path):
    path = tmp_path / "cpu.pt.trace.json"
    subprocess.run([sys.executable, "-c", SCRIPT % str(path)], check=True, timeout=300, capture_output=True)
    events = json.loads(path.read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    analysis = perfscope.analyze(path)
    cpu = {d.device: d for d in analysis.details.trace_memory[0].devices}["cpu"]
    assert cpu.relative is False and cpu.peak_allocated_bytes <= max(totals)
    grown = [r.growth_bytes for r in cpu.steps]
    assert all(g >= 1 << 18 for g in grown), grown  # each step keeps at least its 256 KiB tensor
