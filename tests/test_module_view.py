"""Time per nn.Module: the ranges perfscope profile records, the profiler's with_stack events, the
view, the report."""

from __future__ import annotations

import pytest
from tracegen import annotation, cpu_op, event, launch, step
from tracekit import analyze

from perfscope.reports.bottleneck import render_report


def test_module_ranges_nest_into_host_and_device_time_per_module(tmp_path):
    # step [0, 1000): Net [10, 900) holds fc1 [20, 400) and fc2 [420, 880); fc1 launches a kernel
    # of 300 us, fc2 one of 200 us; an aten op outside any module launches one of 50 us
    events = [step(1, 0, 1000), annotation("nn.Module: Net (Net)", 10, 890),
              annotation("nn.Module: Net.fc1 (Linear)", 20, 380), annotation("nn.Module: Net.fc2 (Linear)", 420, 460),
              cpu_op("aten::addmm", 30, 50), cpu_op("aten::addmm", 430, 50), cpu_op("aten::sum", 905, 40),
              *launch("gemm_a", 40, 100, 300, correlation=1), *launch("gemm_b", 440, 500, 200, correlation=2),
              *launch("reduce", 910, 920, 50, correlation=3)]
    a = analyze(tmp_path, events)
    view = a.summary()["details"]["modules"]
    assert view["source"] == "perfscope" and view["modules"] == 3
    rows = {r["module"]: r for r in view["rows"]}
    net, fc1, fc2 = rows["Net (Net)"], rows["Net.fc1 (Linear)"], rows["Net.fc2 (Linear)"]
    assert (net["depth"], fc1["depth"]) == (0, 1)
    assert net["host_us"] == pytest.approx(890) and net["host_self_us"] == pytest.approx(890 - 380 - 460)
    assert fc1["device_us"] == pytest.approx(300) and fc2["device_self_us"] == pytest.approx(200)
    assert net["device_us"] == pytest.approx(500) and net["device_self_us"] == pytest.approx(0)
    assert [r["module"] for r in view["rows"]] == ["Net (Net)", "Net.fc1 (Linear)", "Net.fc2 (Linear)"]  # a tree
    html = render_report(a.summary(), find_traces=False)
    assert 'id="modules"' in html and "Net.fc1 (Linear)" in html and "device self (ms)" in html


def test_the_profilers_with_stack_module_events_are_read_too(tmp_path):
    events = [step(1, 0, 1000), cpu_op("aten::mm", 0, 990),
              event("python_function", "nn.Module: Sequential_0", 5, 900),
              event("python_function", "nn.Module: Linear_0", 10, 300)]
    view = analyze(tmp_path, events).summary()["details"]["modules"]
    assert view["source"] == "with_stack"
    assert {r["module"]: r["host_self_us"] for r in view["rows"]} == {"Sequential_0": pytest.approx(600),
                                                                      "Linear_0": pytest.approx(300)}


def test_a_trace_without_module_ranges_has_no_view(tmp_path):
    a = analyze(tmp_path, [step(1, 0, 100), cpu_op("aten::mm", 0, 90)])
    assert a.summary()["details"]["modules"] is None
    assert 'id="modules"' not in render_report(a.summary(), find_traces=False)


def test_profile_records_a_range_per_module_call_inside_the_steps(tmp_path):
    pytest.importorskip("torch")
    import dataclasses

    from collectkit import SMALL, loop_script, profiler_steps, trace_events, within

    import perfscope
    from perfscope.collect import collect

    plain = collect(loop_script(tmp_path, iterations=12), [], out_dir=tmp_path / "plain", schedule=SMALL)
    assert not any(e["name"].startswith("nn.Module: ") for e in trace_events(plain.trace_files[0]))  # asked for only
    schedule = dataclasses.replace(SMALL, modules=True)
    result = collect(loop_script(tmp_path, iterations=12), [], out_dir=tmp_path / "out", schedule=schedule)
    (trace,) = result.trace_files
    events = trace_events(trace)
    steps = profiler_steps(events)
    modules = [e for e in events if e["name"].startswith("nn.Module: ")]
    names = {e["name"] for e in modules}
    assert names == {"nn.Module: Sequential (Sequential)", "nn.Module: Sequential.0 (Linear)",
                     "nn.Module: Sequential.1 (ReLU)", "nn.Module: Sequential.2 (Linear)"}
    # every range lies inside one recorded step: none straddles a boundary
    assert all(any(within(m, s) for s in steps) for m in modules)
    assert sum(e["name"] == "nn.Module: Sequential (Sequential)" for e in modules) == len(steps)
    view = perfscope.analyze(trace).summary()["details"]["modules"]
    top = view["rows"][0]
    assert top["module"] == "Sequential (Sequential)" and top["depth"] == 0
    # the ranges are switched off after the window: the script's later module calls pass untouched
    from torch.nn.modules import module as module_mod

    assert not module_mod._global_forward_pre_hooks and not module_mod._global_forward_hooks
