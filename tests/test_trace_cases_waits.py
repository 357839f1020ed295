"""Hand-written trace cases: a step whose GPU mostly waits on dependencies says so and names what
it waited on; warnings reach stderr, summary.json and the top of the report; damaged files in a
directory give a non-zero exit; analysis stays linear in steps (see tracekit.py)."""

from __future__ import annotations

import copy
import json

import pytest
from test_bad_input import run_cli
from tracegen import cpu_op, launch, runtime, step, write_trace
from tracekit import NCCL_NEW, analyze, check_partition, only_row

from perfscope.analysis import chunked
from perfscope.console import format_summary
from perfscope.reports import render_report


def _other_dominated():
    # step [0, 1000): compute [0, 100) and [900, 1000) (200 us); an all-reduce [760, 910) of which
    # [760, 900) is exposed (140 us = 14%). Between 100 and 760 the next kernel (launched at 20,
    # call [20, 25)) is queued but does not start: 660 us of other idle. The host sits in
    # cudaStreamSynchronize [30, 700) meanwhile.
    return [
        step(1, 0, 1000), cpu_op("aten::step", 0, 999),
        *launch("gemm_a", 1, 0, 100, correlation=1),
        runtime("cudaStreamWaitEvent", 10, 2, correlation=None),
        *launch(NCCL_NEW, 20, 760, 150, correlation=2, call_dur=5, stream=20),
        runtime("cudaStreamSynchronize", 30, 670, correlation=None),
        *launch("gemm_b", 800, 900, 100, correlation=3),
    ]


@pytest.mark.parametrize("chunk_rows", [None, 1, 3])
def test_other_as_the_largest_share_is_said_with_what_the_gpu_waited_on(tmp_path, monkeypatch, chunk_rows):
    if chunk_rows:  # the next GPU event of each gap is found a chunk of rows at a time
        monkeypatch.setattr(chunked, "CHUNK_ROWS", chunk_rows)
    a = analyze(tmp_path, _other_dominated())
    row = only_row(a)
    assert row["other_idle_us"] == pytest.approx(660)
    assert row["exposed_comm_us"] == pytest.approx(140)
    assert a.verdict.verdict == "comm-bound"  # the largest cause a knob removes
    assert a.verdict.other_largest
    waits = a.details.other_waits
    assert waits.other_idle_us == pytest.approx(660)
    # the sync call [30, 700) covers [100, 700) of the other idle [100, 760): 600 us
    assert waits.causes["host synchronisation"].us == pytest.approx(600)
    assert waits.causes["host synchronisation"].calls == {"cudaStreamSynchronize": pytest.approx(600)}
    # the rest, [700, 760), ends when the all-reduce launched right after cudaStreamWaitEvent starts
    assert waits.causes["cross-stream wait"].us == pytest.approx(60)
    assert waits.causes["not shown in the trace"].us == pytest.approx(0)
    s = a.summary()
    text = format_summary(s)
    assert "largest share: other 66%" in text
    assert "the GPU waited on: host synchronisation 91% (cudaStreamSynchronize); cross-stream wait 9%" in text
    html = render_report(s, find_traces=False)
    assert "The largest share is other, 66% of step time" in html.split('id="verdict"')[1].split("</section>")[0]


def test_warnings_go_to_stderr_and_into_summary_and_report(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 10, 40), cpu_op("aten::neg", 60, -3)]
    path = write_trace(tmp_path / "t.json", events)
    r = run_cli(tmp_path, "analyze", path, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "negative duration" not in r.stdout  # the table stays clean
    assert "perfscope: warning: t.json: 1 event dropped: negative duration (aten::neg (1))" in r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any("negative duration" in w for w in s["warnings"])
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.index('id="warnings"') < html.index('id="verdict"')


def test_a_damaged_trace_in_a_directory_gives_a_non_zero_exit_and_keeps_the_rest(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    write_trace(d / "rank0.json", [step(1, 0, 100), cpu_op("aten::mm", 0, 90)])
    (d / "rank1.json").write_bytes(b'{"traceEvents": [ {"ph": "X" "cat": 1} ]}')
    r = run_cli(tmp_path, "analyze", d, "--out", tmp_path / "out")
    assert r.returncode == 3
    assert "rank1.json:1:30: invalid JSON that cannot be repaired" in r.stderr
    assert "Traceback" not in r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [t["worker"] for t in s["traces"]] == ["rank0"] and s["skipped"][0]["damaged"]


def test_a_damaged_single_trace_is_one_line_and_exit_2(tmp_path):
    line2 = b' {"ph": "X", "cat": "cpu_op" "name": "a"}'  # a comma missing before "name"
    (tmp_path / "t.json").write_bytes(b'{"traceEvents": [\n' + line2 + b'\n]}')
    r = run_cli(tmp_path, "analyze", tmp_path / "t.json", "--out", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    col = line2.index(b'"name"') + 1
    assert f"t.json:2:{col}: invalid JSON that cannot be repaired" in r.stderr


def test_many_one_op_steps_are_analyzed_whole(tmp_path):
    # 100,000 steps of 10 us, each one 8 us operator: the analysis is linear in steps and events
    # (it did not finish for 200,000 such steps when every step scanned every event).
    n = 100_000
    events = []
    for i in range(n):
        events += [step(i + 1, 10 * i, 10), cpu_op("aten::add", 10 * i + 1, 8)]
    a = analyze(tmp_path, events)
    assert len(a.steps) == n
    assert (a.steps["operator_count"] == 1).all()
    assert a.steps["operator_us"].to_numpy() == pytest.approx(8.0)
    assert a.verdict.verdict == "compute-bound"
    check_partition(a.steps.iloc[[0, n // 2, n - 1]])


def test_a_schema_1_summary_still_renders(tmp_path):
    s = analyze(tmp_path, _other_dominated()).summary()
    old = copy.deepcopy(s)
    old["schema_version"] = 1
    for k in ("data_quality", "skipped"):
        old.pop(k)
    for k in ("reason", "other_largest", "steps_total", "steps_by_status"):
        old["overall"].pop(k)
    for st in old["steps"]:
        for k in ("status", "status_reason", "counted", "unlinked_idle_us", "unlinked_idle_frac"):
            st.pop(k)
    for k in ("other_waits", "straggler", "advice", "facts", "collectives_matched", "collectives_unmatched"):
        old["details"].pop(k)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text(json.dumps(old))
    r = run_cli(tmp_path, "report", tmp_path / "old")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "old" / "report.html").read_text()
    assert "comm-bound" in html and "predates the data-quality record" in html
