"""One clock for every figure beside the verdict: on a busy machine the provisional verdict takes the
waits for a core out of its steps, and the what-ifs, the optimizer's what-if, the per-step table, the
report's chart and ``diff`` use that same clock (``docs/metrics.md``, "One clock"). A sweep of
contended and clean CPU traces checks that each what-if saves exactly its class's share of the same
step time."""

from __future__ import annotations

import numpy as np
import pytest
from tracegen import cpu_op, dataloader, step
from test_trace_cases_evidence import contended_io_run
from tracekit import analyze

from perfscope import steptime
from perfscope.console import format_summary
from perfscope.record.host_steps import HOST_STEPS_KEY
from perfscope.reports import text_diff
from perfscope.reports.diff import render_diff


def _run(tmp_path, rng: np.random.Generator, contended: float):
    """Random CPU steps: a fetch, two operators, gaps; ``contended``: the share of each step's time
    outside the fetch that the training thread waited for a core (0: a quiet machine)."""
    events, rec, t = [], [], 0
    for n in range(int(rng.integers(3, 6))):
        length = int(rng.integers(1000, 5000))
        fetch = int(length * rng.uniform(0.0, 0.4))
        op = int((length - fetch) * rng.uniform(0.2, 0.45))
        events += [step(n + 1, t, length), dataloader(t, fetch) if fetch else cpu_op("aten::empty", t, 1),
                   cpu_op("aten::mm", t + fetch + 5, op), cpu_op("aten::add", t + fetch + op + 10, op)]
        wait = int((length - fetch) * contended)  # while it works: a thread waiting for data sleeps
        rec.append({"step": n + 1, "wall_us": length, "thread_cpu_us": length - wait - fetch,
                    "process_cpu_us": length - wait - fetch, "run_queue_us": wait})
        t += length
    return analyze(tmp_path, events, **{HOST_STEPS_KEY: {"version": 1, "steps": rec}})


@pytest.mark.parametrize("seed", range(12))
def test_each_what_if_saves_its_class_share_of_the_verdicts_step_time(tmp_path, seed):
    rng = np.random.default_rng(seed)
    contended = 0.0 if seed % 3 == 0 else float(rng.uniform(0.45, 0.7))  # past the rule's 25%
    a = _run(tmp_path, rng, contended)
    summary = a.summary()
    overall = summary["overall"]
    assert overall["verdict"] is not None
    assert overall["provisional"] is (contended > 0)
    rows = steptime.verdict_rows(summary["steps"], overall["provisional"])
    step_time = steptime.step_time_us(rows)
    assert overall["step_time_us"] == pytest.approx(step_time)
    for w in summary["details"]["what_if"]:
        assert w["step_time_us"] == pytest.approx(step_time)
        # one rank: removing a class saves its share of the same (verdict's) step time, no more
        assert w["saved_us_per_step"] == pytest.approx(overall["fractions"][w["class"]] * step_time, rel=1e-9)
    for row in rows:  # each row's shares add up on its own clock, the classes' and the partition's
        assert sum(row[f"{c}_cost_frac"] for c in ("io", "comm", "launch", "compute", "other")) == pytest.approx(1.0)
        parts = ("operator_frac", "exposed_comm_frac", "dataloader_frac", "framework_overhead_frac")
        assert sum(row[p] for p in parts) == pytest.approx(1.0, abs=1e-6)
        assert all(row[p] * row["step_time_us"] == pytest.approx(row[p[:-5] + "_us"]) for p in parts)
    mfu = summary["details"].get("mfu")
    if mfu and mfu.get("step_time_s"):
        assert mfu["step_time_s"] * 1e6 == pytest.approx(step_time)


def test_what_a_user_reads_after_a_provisional_verdict_is_on_its_clock(tmp_path):
    summary = contended_io_run(tmp_path).summary()  # 500 us without the waits, 80 us io (16%)
    (io,) = [w for w in summary["details"]["what_if"] if w["class"] == "io"]
    assert (io["step_time_us"], io["step_time_without_us"]) == (pytest.approx(500), pytest.approx(420))
    first = summary["steps"][0]  # both clocks travel with the step
    assert first["step_time_us"] == 1000 and first["waitfree_step_time_us"] == pytest.approx(500)
    assert first["io_cost_frac"] == pytest.approx(0.08) and first["waitfree_io_cost_frac"] == pytest.approx(0.16)
    text = format_summary(summary)
    assert "   0    1*     0.50  16.0" in text  # the table: the verdict's clock, as the verdict line
    assert "shown on its clock, without their waits for a core" in text
    said = text_diff(summary, summary, "a", "b")
    assert "A: a  io-bound, provisional, step time 0.50 ms" in said
    assert "note: A's verdict is provisional (a busy machine): its step time and shares are without the waits " \
           "for a core; 1.00 ms as measured" in said
    html = render_diff(summary, summary)
    assert "B&#x27;s verdict is provisional" in html or "B's verdict is provisional" in html
    # the report's chart and table draw both clocks, each labelled
    from perfscope.reports import render_report as render_summary

    page = render_summary(summary)
    assert "as measured: 1.00" in page and "as measured (dashed)" in page  # the dashed column's tooltip, legend
    assert "as measured (ms)" in page
    # the first row: 0.50 ms on the verdict's clock, 1.00 ms as measured, the DataLoader's 80 us 16% of the 0.50
    assert '<td class="">0.50</td><td class="">1.00</td>' in page and '<td class="">16.0%</td>' in page
    quiet = _run(tmp_path, np.random.default_rng(0), 0.0).summary()
    assert "as measured" not in render_summary(quiet)  # one clock: nothing to draw twice


def test_the_optimizer_what_if_is_on_the_verdicts_clock(tmp_path):
    # 1000 us steps: an optimizer range of 300 us, 600 us of other operators; 500 us waiting for a core.
    # On the verdict's clock the work kept half its time: the optimizer is 150 of the 500 us left.
    from tracegen import annotation

    events = []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), cpu_op("aten::mm", s + 10, 600),
                   annotation("Optimizer.step#SGD.step", s + 650, 300), cpu_op("aten::add_", s + 660, 280)]
    rec = [{"step": n + 1, "wall_us": 1000, "thread_cpu_us": 450, "process_cpu_us": 450, "run_queue_us": 500}
           for n in range(3)]
    a = analyze(tmp_path, events, **{HOST_STEPS_KEY: {"version": 1, "steps": rec}})
    assert a.verdict.provisional
    cost = a.summary()["details"]["facts"]["optimizer_step"]
    assert cost["step_time_us"] == pytest.approx(a.summary()["overall"]["step_time_us"])
    keep = a.summary()["steps"][0]["waitfree_work_keep"]
    assert cost["step_time_us"] - cost["step_time_without_us"] == pytest.approx(300 * keep)
    assert 0 < cost["share"] < 1


def test_no_runner_up_where_no_other_cause_has_a_share(tmp_path):
    events = []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), dataloader(s, 1000)]
    a = analyze(tmp_path, events)
    assert a.verdict.verdict == "io-bound" and a.verdict.runner_up is None
    assert "(runner-up none;" in format_summary(a.summary())
