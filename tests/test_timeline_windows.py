"""The timeline draws a step from the events inside its window only, exactly as it would from
lanes of every event of the trace (what it did before), and reuses the analysis's windows."""

from __future__ import annotations

import numpy as np
import pytest

from perfscope.analysis.rank import analyze_file
from perfscope.reports import timeline_data
from perfscope.reports.timeline_data import prepare, raster

TRACES = ["hta/a100_rank3_of8_train.json.gz", "hta/amd_mi250_rocm_train.json.gz", "hta/cpu_only_rank34.pt.trace.json.gz",
          "hta/v100_single_gpu_ns_timestamps.pt.trace.json.gz", "hta/a100_alexnet_no_profiler_steps.json.gz"]


def _every_event_lanes(prep):
    every = timeline_data._lanes(prep, np.arange(prep.table.n_events))
    return lambda i: every


@pytest.mark.parametrize("name", TRACES)
def test_a_step_drawn_from_its_window_equals_one_drawn_from_every_event(shared_traces, name, monkeypatch):
    status, rank = analyze_file(shared_traces / name)
    assert status == "ok"
    prep = prepare(rank.table, rank.windows, rank.partition_sets)
    steps = range(len(prep.windows))
    drawn = [raster(prep, i) for i in steps]
    monkeypatch.setattr(prep, "lanes_at", _every_event_lanes(prep))
    for i, got in zip(steps, drawn):
        want = raster(prep, i)
        assert [lane.label for lane, _, _ in got.lanes] == [lane.label for lane, _, _ in want.lanes]
        for (_, runs_got, cov_got), (_, runs_want, cov_want) in zip(got.lanes, want.lanes):
            np.testing.assert_allclose(cov_got, cov_want, atol=1e-9)
            assert [r[:3] for r in runs_got] == [r[:3] for r in runs_want]
        np.testing.assert_array_equal(got.partition_cov, want.partition_cov)


def test_the_analysis_windows_and_sets_are_those_the_report_would_find(shared_traces):
    status, rank = analyze_file(shared_traces / TRACES[0])
    given = prepare(rank.table, rank.windows, rank.partition_sets)
    found = prepare(rank.table)
    np.testing.assert_array_equal(given.windows.start, found.windows.start)
    np.testing.assert_array_equal(given.windows.end, found.windows.end)
    for a, b in zip(given.partition, found.partition):
        np.testing.assert_array_equal(a.starts, b.starts)
        np.testing.assert_array_equal(a.ends, b.ends)
    assert given.lane_kinds == found.lane_kinds and given.streams.tolist() == found.streams.tolist()
