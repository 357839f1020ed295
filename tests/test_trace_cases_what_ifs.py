"""Hand-written trace cases: the GPU what-ifs of perfscope/analysis/what_ifs.py -- CUDA graphs for
launch waits and channels-last for cuDNN's layout transposes -- and the advice sentences they open
(see tracekit.py). Times are µs."""

from __future__ import annotations

import pytest
from tracegen import cpu_op, launch, step
from tracekit import analyze, check_partition


def test_launch_waits_are_what_cuda_graphs_could_remove(tmp_path):
    # one 10 µs kernel in a 600 µs step: the GPU waits for the host most of the step
    a = analyze(tmp_path, [step(1, 0, 600), cpu_op("aten::add", 0, 598), *launch("k", 1, 10, 10, correlation=1)])
    check_partition(a.steps)
    row = a.steps.iloc[0]
    launch_cost = row["launch_wait_us"] + row["kernel_wait_us"]
    found = a.summary()["details"]["facts"]["graphs"]
    assert found["share"] == pytest.approx(launch_cost / 600)
    assert found["step_time_without_us"] == pytest.approx(600 - launch_cost)
    assert a.verdict.advice.startswith("Capture the step in CUDA graphs: the GPU waits for the host's launches")
    assert "compile: reduce-overhead" in a.verdict.advice


def test_a_run_that_replays_graphs_is_not_told_to_capture_them(tmp_path):
    events = [step(1, 0, 600), cpu_op("aten::add", 0, 598), *launch("k", 1, 10, 10, correlation=1)]
    events[2] = dict(events[2], name="cudaGraphLaunch")
    a = analyze(tmp_path, events)
    assert "Capture the step in CUDA graphs" not in a.verdict.advice


def test_layout_transposes_are_measured_and_channels_last_advised(tmp_path):
    # a 1000 µs step: a convolution [10, 510), then cuDNN's two transposes [520, 620) and [630, 730)
    events = [step(1, 0, 1000), cpu_op("aten::convolution", 0, 990),
              *launch("sm80_xmma_fprop_implicit_gemm_f32f32", 1, 10, 500, correlation=1),
              *launch("nchwToNhwcKernel", 2, 520, 100, correlation=2),
              *launch("nhwcToNchwKernel", 3, 630, 100, correlation=3)]
    a = analyze(tmp_path, events)
    found = a.summary()["details"]["facts"]["layout_transposes"]
    assert found["kernels_per_step"] == 2 and found["transpose_us_per_step"] == pytest.approx(200)
    assert found["share"] == pytest.approx(0.2) and found["step_time_without_us"] == pytest.approx(800)
    assert found["speedup"] == pytest.approx(1.25)
    advice = a.summary()["details"]["advice"]["compute"]
    assert advice.startswith("Store the convolutions channels-last: cuDNN spent 20% of the step")
    assert "channels_last: true" in advice and "1.0 ms -> at best 0.8 ms, about 1.25x" in advice


def test_a_cpu_run_has_neither(tmp_path):
    a = analyze(tmp_path, [step(1, 0, 600), cpu_op("aten::add", 0, 598)])
    facts = a.summary()["details"]["facts"]
    assert facts["graphs"] is None and facts["layout_transposes"] is None
