"""Hand-written trace cases: steps whose evidence is incomplete get no verdict -- a range far past
the trace's end, start-up, unparsable or empty markers, GPU events without launch records that
decide the verdict, a starved host (see tracekit.py for the conventions)."""

from __future__ import annotations

import pytest
from tracegen import annotation, cpu_op, dataloader, kernel, launch, runtime, step
from tracekit import analyze, check_partition, only_row

from perfscope.record.host_steps import HOST_STEPS_KEY


def _steady(n_steps=3, t0=0):
    """CPU steps of 100 us, each 90 us of operators: compute-bound."""
    events = []
    for n in range(n_steps):
        s = t0 + 100 * n
        events += [step(n + 1, s, 100), cpu_op("aten::mm", s + 5, 90)]
    return events


def test_a_step_range_far_past_the_last_event_is_incomplete(tmp_path):
    # ProfilerStep#1 lasts 13 s; the last event ends 2 ms in
    events = [step(1, 0, 13_000_000), cpu_op("aten::mm", 0, 2000)]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["status"] == "incomplete"
    assert row["status_reason"] == "its range runs 13.00 s past the last event the trace recorded"  # 12.998 s
    assert a.verdict.verdict is None
    assert a.verdict.reason.startswith("every step is incomplete")


def test_a_window_dominated_by_initialisation_is_not_launch_bound(tmp_path):
    # step 1 [0, 5 s): CUDA context creation hides in cudaDeviceGetStreamPriorityRange (3 s) and
    # cudaFree (1 s): 80% of the step, well over the 10% rule. Steps 2-3 are ordinary.
    events = [step(1, 0, 5_000_000), cpu_op("aten::to", 0, 4_000_100),
              runtime("cudaDeviceGetStreamPriorityRange", 10, 3_000_000, correlation=None),
              runtime("cudaFree", 3_000_020, 1_000_000, correlation=None),
              *launch("k", 4_000_200, 4_000_210, 900_000, correlation=1)]
    for n, s in ((2, 5_000_000), (3, 5_001_000)):
        events += [step(n, s, 1000), cpu_op("aten::mm", s, 990), *launch("gemm", s + 1, s + 10, 980, correlation=n)]
    a = analyze(tmp_path, events)
    check_partition(a.steps)
    st = a.steps.set_index("step")
    assert st.loc[1, "status"] == "initialisation"
    assert st.loc[1, "status_reason"] == ("one-time device initialisation (cudaDeviceGetStreamPriorityRange 3.00 s, "
                                          "cudaFree 1.00 s) takes 80% of the step")
    assert st.loc[1, "verdict"] is None
    assert a.verdict.verdict == "compute-bound"  # steps 2 and 3: 980 of 1000 us busy
    assert a.summary()["overall"]["steps_counted"] == 2


def test_a_run_of_initialisation_only_has_no_verdict_and_says_what_to_do(tmp_path):
    events = [step(1, 0, 1_000_000), cpu_op("aten::to", 0, 999_000),
              runtime("cuInit", 10, 900_000, correlation=None), *launch("k", 900_100, 900_200, 50, correlation=1)]
    a = analyze(tmp_path, events)
    assert a.verdict.verdict is None
    assert "past start-up" in a.verdict.advice


@pytest.mark.parametrize("marker", ["ProfilerStep#NaN", "ProfilerStep#-1", "ProfilerStep# 7",
                                    "ProfilerStep#1234567890123456789", "ProfilerStep#١٢"])
def test_a_step_marker_whose_number_does_not_parse_is_named(tmp_path, marker):
    events = _steady(2) + [annotation(marker, 300, 100), cpu_op("aten::mm", 305, 90)]
    a = analyze(tmp_path, events)
    assert list(a.steps["step"]) == [1, 2]  # ProfilerStep#١٢ is not step 12
    (w,) = [w for w in a.warnings if "ProfilerStep# marker" in w]
    assert "1 ProfilerStep# marker with a number that is not a step number" in w and marker in w
    assert any("outside every step" in e["reason"] for e in a.summary()["data_quality"])


def test_a_zero_length_step_is_incomplete(tmp_path):
    events = _steady(2) + [step(3, 300, 0), cpu_op("aten::mm", 300, 0)]
    a = analyze(tmp_path, events)
    assert a.steps.set_index("step").loc[3, "status_reason"] == "zero length"
    assert a.summary()["overall"]["steps_counted"] == 2


def test_a_trace_of_step_markers_only_has_no_verdict(tmp_path):
    a = analyze(tmp_path, [step(n + 1, 100 * n, 100) for n in range(3)])
    assert set(a.steps["status_reason"]) == {"no event recorded inside the step (only its marker)"}
    assert a.verdict.verdict is None  # not "100% launch-bound"


def test_gpu_events_without_launch_records_withhold_a_verdict_they_would_decide(tmp_path):
    # step [0, 1000): the host runs one op [0, 990); two kernels without launch records (no
    # correlation id, as with args: null) run [50, 450) and [600, 995).
    events = [step(1, 0, 1000), cpu_op("aten::mm", 0, 990), kernel("k_a", 50, 400, correlation=None),
              kernel("k_b", 600, 395, correlation=None)]
    # GPU busy [50, 450) and [600, 995): compute 795 us. Idle: [0, 50) before k_a (unlinked, other),
    # [450, 600) before k_b (unlinked, other) = 200 us = 20%, [995, 1000) host wait 5 us.
    # As recorded: launch 0.5%, other 20% -> compute-bound. Read as launch wait: launch 20.5% < 25%
    # -> still compute-bound: the verdict stands.
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["unlinked_idle_us"] == pytest.approx(200)
    assert row["status"] == "ok" and row["verdict"] == "compute-bound"
    # Now the gap decides: k_b starts at 700, so 300 us (30%) of unlinked idle -> launch 30.5% >= 25%.
    events[-1] = kernel("k_b", 700, 295, correlation=None)
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["unlinked_idle_us"] == pytest.approx(300)
    assert row["status"] == "incomplete" and row["verdict"] is None
    assert row["status_reason"] == ("30% of the step is GPU idle before GPU events without a launch record: read as "
                                    "launch wait the step is launch-bound, as a dependency wait compute-bound, and the "
                                    "trace cannot tell which")


def _host(tmp_path, steps_record, events):
    return analyze(tmp_path, events, **{HOST_STEPS_KEY: {"version": 1, "steps": steps_record}})


def test_a_starved_host_is_host_contended_not_compute_bound(tmp_path):
    # Three 1-second CPU steps, almost all inside operators (compute-bound by the trace alone). The
    # host record says the training thread ran 200 ms of each second and waited 700 ms for a core.
    events = []
    for n in range(3):
        s = 1_000_000 * n
        events += [step(n + 1, s, 1_000_000), cpu_op("aten::tiny_op", s + 1000, 998_000)]
    rec = [{"step": n + 1, "wall_us": 1_000_000, "thread_cpu_us": 200_000, "process_cpu_us": 210_000,
            "run_queue_us": 700_000} for n in range(3)]
    a = _host(tmp_path, rec, events)
    assert a.steps["status"].tolist() == ["host-contended"] * 3
    assert a.steps["status_reason"].iloc[0] == ("of the step's 1000.0 ms the training thread waited 70% for a core, "
                                                "ran 20% and slept or waited for data the rest")
    # the host record travels with the step (microseconds)
    assert a.steps["host_run_queue_us"].iloc[0] == pytest.approx(700_000)
    assert a.steps["host_thread_cpu_us"].iloc[0] == pytest.approx(200_000)
    # No step is clean: the steps get a provisional verdict, with 70% of their time waiting for cores.
    assert a.verdict.provisional and a.verdict.verdict == "compute-bound"
    assert a.verdict.core_wait_share == pytest.approx(0.7)
    assert a.steps["provisional_verdict"].tolist() == ["compute-bound"] * 3 and a.steps["verdict"].isna().all()
    assert any("provisional verdict" in n and "70% of their time" in n for n in a.notes), a.notes


def contended_io_run(tmp_path):
    """1000 us steps: 80 us in a DataLoader fetch (8%: under io's 10% threshold), 800 us of
    operators, 120 us of gaps around them, and 500 us of waiting for a core. A thread waiting for
    data sleeps: the wait was in the work, which shrinks to 420 us; the step would take 500 us, 16%
    of it io."""
    events = []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), dataloader(s, 80), cpu_op("aten::mm", s + 100, 400),
                   cpu_op("aten::add", s + 510, 400)]
    rec = [{"step": n + 1, "wall_us": 1000, "thread_cpu_us": 400, "process_cpu_us": 400, "run_queue_us": 500}
           for n in range(3)]
    return _host(tmp_path, rec, events)


def test_a_provisional_verdict_takes_the_wait_out_of_the_work_not_the_data_wait(tmp_path):
    a = contended_io_run(tmp_path)
    assert a.steps["status"].tolist() == ["host-contended"] * 3
    assert a.steps["core_wait_us"].tolist() == [500] * 3
    assert a.verdict.provisional and a.verdict.verdict == "io-bound", a.verdict
    assert a.verdict.fractions["io"] == pytest.approx(0.16)
    summary = a.summary()
    assert summary["overall"]["provisional"] is True and summary["overall"]["core_wait_share"] == pytest.approx(0.5)
    assert summary["overall"]["verdict"] == "io-bound"
    assert summary["overall"]["step_time_us"] == pytest.approx(500)  # without the waits
    # what a user reads: the console and the report say provisional, and how busy the host was
    from perfscope.console import format_summary
    from perfscope.reports.sections.verdict import render

    text = format_summary(summary)
    assert "verdict: io-bound, provisional" in text and "0.50 ms without them, 1.00 ms as measured" in text
    assert "busy host: the training thread waited for a core 50% of the time" in text
    assert "(host-contended; provisional io-bound)" in text
    html = render(summary)
    assert "io-bound, provisional</strong>" in html and "Provisional</strong>: no step had clean evidence" in html


def test_a_clean_step_beside_contended_ones_gives_an_ordinary_verdict(tmp_path):
    events = []
    for n in range(2):
        s = 1_000_000 * n
        events += [step(n + 1, s, 1_000_000), cpu_op("aten::tiny_op", s + 1000, 998_000)]
    rec = [{"step": 1, "wall_us": 1_000_000, "thread_cpu_us": 200_000, "process_cpu_us": 210_000, "run_queue_us": 700_000},
           {"step": 2, "wall_us": 1_000_000, "thread_cpu_us": 990_000, "process_cpu_us": 990_000, "run_queue_us": 0}]
    a = _host(tmp_path, rec, events)
    assert a.steps["status"].tolist() == ["host-contended", "ok"]
    assert a.verdict.verdict == "compute-bound" and not a.verdict.provisional and a.verdict.core_wait_share is None
    assert "provisional_verdict" not in a.steps.columns


def test_a_step_after_the_host_records_end_is_not_counted(tmp_path):
    # The script ended inside step 3: its host record was never written; steps 1-2 have theirs.
    events = []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), cpu_op("aten::mm", s + 10, 980)]
    rec = [{"step": n + 1, "wall_us": 1000, "thread_cpu_us": 990, "process_cpu_us": 990, "run_queue_us": 0}
           for n in range(2)]
    a = _host(tmp_path, rec, events)
    assert a.steps["status"].tolist() == ["ok", "ok", "incomplete"]
    assert "no host record" in a.steps["status_reason"].iloc[2]


def test_a_data_wait_explains_low_cpu_time(tmp_path):
    # 90% of each step in a DataLoader fetch: the thread sleeps on the workers' queue, not starved
    events = []
    for n in range(2):
        s = 1000 * n
        events += [step(n + 1, s, 1000), dataloader(s, 900), cpu_op("aten::mm", s + 905, 90)]
    rec = [{"step": n + 1, "wall_us": 1000, "thread_cpu_us": 100, "process_cpu_us": 100, "run_queue_us": 0}
           for n in range(2)]
    a = _host(tmp_path, rec, events)
    assert a.steps["status"].tolist() == ["ok", "ok"]
    assert a.verdict.verdict == "io-bound"


def test_without_run_queue_figures_unexplained_off_cpu_time_decides(tmp_path):
    # 2 CPU steps of 100 us, 90 us of operators; no run-queue figure (not Linux). Step 1: the thread
    # ran 30 of 100 us, nothing explains the other 70 (no fetch, no collective): 30 < 50 -> contended.
    # Step 2: it ran 80 us: not contended.
    rec = [{"step": 1, "wall_us": 100, "thread_cpu_us": 30, "process_cpu_us": 30, "run_queue_us": None},
           {"step": 2, "wall_us": 100, "thread_cpu_us": 80, "process_cpu_us": 80, "run_queue_us": None}]
    a = _host(tmp_path, rec, _steady(2))
    assert a.steps["status"].tolist() == ["host-contended", "ok"]
    assert "does not report waits for a core" in a.steps["status_reason"].iloc[0]


def test_off_cpu_time_without_run_queue_wait_is_not_contention(tmp_path):
    # the thread blocked voluntarily (a lock, an intra-op pool): off the CPU, but never waiting for a core
    events = _steady(2)
    rec = [{"step": n + 1, "wall_us": 100, "thread_cpu_us": 20, "process_cpu_us": 180, "run_queue_us": 1}
           for n in range(2)]
    assert _host(tmp_path, rec, events).steps["status"].tolist() == ["ok", "ok"]


@pytest.mark.parametrize(("process", "workers", "busy", "cause"), [
    (1_900, 0, 7_600, "other processes"),      # 2 cores x 4 ms: the job ran 24%, the machine was full
    (1_500, 5_800, 7_700, "this job"),         # its workers took the cores: the job oversubscribes them
])
def test_a_busy_host_says_who_held_the_cores(tmp_path, process, workers, busy, cause):
    events = []
    for n in range(3):
        s = 4000 * n
        events += [step(n + 1, s, 4000), cpu_op("aten::mm", s + 10, 3980)]
    rec = [{"step": n + 1, "wall_us": 4000, "thread_cpu_us": 1000, "process_cpu_us": process, "run_queue_us": 2500,
            "machine_busy_us": busy, "workers_cpu_us": workers, "cores": 2} for n in range(3)]
    a = _host(tmp_path, rec, events)
    split = a.summary()["details"]["host_cpu"]
    assert split["cause"] == cause and split["cores"] == 2
    assert split["training_process"] == pytest.approx(process / 8000)
    assert split["workers"] == pytest.approx(workers / 8000)
    from perfscope.console import format_summary

    text = format_summary(a.summary())
    line = next(x for x in text.splitlines() if x.startswith("cores: "))
    if cause == "this job":
        assert "oversubscribes the cores itself" in line and "num_workers" in line
    else:
        assert "a property of this machine" in line and "num_workers" not in line


def test_a_long_step_with_almost_no_operators_on_its_thread_gets_a_note(tmp_path):
    from tracegen import cpu_op, step, write_trace

    import perfscope

    # steps 1-2: 413 ms each with 4 operators on the training thread; step 3: 100 operators
    events = []
    for n in (1, 2):
        s = (n - 1) * 413_000
        events += [step(n, s, 413_000), *[cpu_op("aten::add", s + 1000 * k, 500) for k in range(4)]]
    events += [step(3, 826_000, 413_000), *[cpu_op("aten::add", 826_000 + 4000 * k, 2000) for k in range(100)]]
    a = perfscope.analyze(write_trace(tmp_path / "t.json", events))
    assert set(a.steps.loc[a.steps["counted"], "step"]) == {1, 2, 3}
    notes = [n for n in a.notes if "almost no operators" in n]
    assert len(notes) == 1 and notes[0].startswith("2 counted steps of 413 ms or more"), a.notes
    assert "as few as 4; rank 0: steps 1-2)" in notes[0]
    # the same steps with their operators: no note
    busy = [e for e in events if not e["name"].startswith("ProfilerStep")]
    busy += [cpu_op("aten::mul", (n - 1) * 413_000 + 10_000 + 1000 * k, 500) for n in (1, 2) for k in range(20)]
    again = perfscope.analyze(write_trace(tmp_path / "u.json", [e for e in events if e["name"].startswith("ProfilerStep")] + busy))
    assert not [n for n in again.notes if "almost no operators" in n]


@pytest.mark.parametrize("threads", [1, 2])
def test_where_intra_op_workers_waited_a_provisional_verdict_needs_its_class_both_ways(tmp_path, threads):
    # 1000 us steps: 300 us of operators (400 us apart), the training thread waited 300 us for a core;
    # its intra-op worker waited 600 us, while the thread may have spun for it (CPU time)
    events, rec = [], []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000)] + [cpu_op("aten::mm", s + 10 + 400 * j, 100) for j in range(3)]
        rec.append({"step": n + 1, "wall_us": 1000, "thread_cpu_us": 700, "process_cpu_us": 1300,
                    "run_queue_us": 300, "sibling_run_queue_us": 600, "intra_op_threads": threads})
    a = _host(tmp_path, rec, events)
    assert a.steps["status"].tolist() == ["host-contended"] * 3
    if threads == 1:  # no intra-op workers: the provisional verdict as ever
        assert a.verdict.provisional and a.verdict.verdict is not None
        assert (a.steps["spin_bound_us"] == 0).all()
        return
    assert "its 2 intra-op threads waited up to 60% for cores" in a.steps["status_reason"].iloc[0]
    assert (a.steps["spin_bound_us"] == 600).all()


def test_a_class_that_holds_with_and_without_the_workers_spinning_stands(tmp_path):
    # io-bound either way: a 700 us DataLoader wait (the thread sleeps) beside 200 us of operators
    events, rec = [], []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), dataloader(s, 700), cpu_op("aten::mm", s + 750, 200)]
        rec.append({"step": n + 1, "wall_us": 1000, "thread_cpu_us": 200, "process_cpu_us": 400,
                    "run_queue_us": 100 + 250, "sibling_run_queue_us": 300, "intra_op_threads": 2})
    a = _host(tmp_path, rec, events)
    assert a.verdict.provisional and a.verdict.verdict == "io-bound"


def test_a_class_the_workers_spinning_could_change_is_withheld(tmp_path):
    # Operators 800 us of a 1000 us step, 150 us between them: compute-bound as measured; taking the
    # worker's 700 us wait out of the operators leaves launch-bound. The trace cannot tell.
    events, rec = [], []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000)] + [cpu_op("aten::mm", s + 10 + 250 * j, 200) for j in range(4)]
        rec.append({"step": n + 1, "wall_us": 1000, "thread_cpu_us": 700, "process_cpu_us": 1400,
                    "run_queue_us": 300, "sibling_run_queue_us": 700, "intra_op_threads": 2})
    a = _host(tmp_path, rec, events)
    assert a.verdict.verdict is None and not a.verdict.provisional
    assert "the trace cannot tell which" in a.verdict.reason and "compute-bound" in a.verdict.reason
    assert "torch.set_num_threads(1)" in a.verdict.advice
    summary = a.summary()  # the details: the steps as recorded, outside any verdict
    assert summary["details"]["scope"] == "withheld" and summary["overall"]["provisional"] is not True
