"""Collection runs, how they end: stopped after --max-steps (letting the last iteration finish) or
run to the end, a script that raises or calls sys.exit (exit code, one-line error, the steps
captured so far), and a failed rerun that keeps the previous trace."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from collectkit import SMALL, loop_script, profiler_steps, trace_events, write_script

from perfscope.collect import ProfileSchedule, collect

# --------------------------------------------------------------------------- max steps


def test_max_steps_ends_an_endless_script(tmp_path):
    script = write_script(
        tmp_path,
        """
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        while True:
            try:  # perfscope's stop signal must get through `except Exception`
                opt.zero_grad()
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
            except Exception:
                pass
        """,
    )
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2, max_steps=12)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.exit_code == 0 and result.error is None
    assert result.stopped_early and result.steps_seen == 12
    assert len(profiler_steps(trace_events(result.trace_files[0]))) == 2


def test_max_steps_zero_runs_to_the_end(tmp_path):
    done = tmp_path / "done.txt"
    script = loop_script(tmp_path, iterations=12)
    script.write_text(script.read_text() + f"\nopen({str(done)!r}, 'w').write('finished')\n")
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2, max_steps=0)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.exit_code == 0 and not result.stopped_early
    assert result.steps_seen == 12 and done.read_text() == "finished"
    assert len(profiler_steps(trace_events(result.trace_files[0]))) == 2


def test_max_steps_lets_the_last_iteration_finish(tmp_path):
    # The N-th step is counted inside optimizer.step(); the script must still
    # run that iteration's zero_grad, scheduler step and logging.
    log = tmp_path / "log.txt"
    script = write_script(
        tmp_path,
        f"""
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        for i in range(1, 10**6):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            with open({str(log)!r}, "a") as f:
                f.write(f"{{i}} {{sched.last_epoch}}\\n")
        """,
    )
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2, max_steps=12)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.exit_code == 0 and result.stopped_early and result.steps_seen == 12
    assert log.read_text().splitlines() == [f"{i} {i}" for i in range(1, 13)]


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "body, exit_code, expected",
    [
        ("class E(Exception):\n    def __str__(self): raise RuntimeError\nraise E()\n",
         1, "raised E: <exception str() failed> (line 3)"),
        ("import sys\nclass O:\n    def __str__(self): raise RuntimeError\nsys.exit(O())\n",
         1, "exited: <exception str() failed>"),
        ("import sys\nsys.exit(0.0)\n", 1, "exited: 0.0"),  # Python: not an int, exit 1
        ("def f(:\n", 1, "raised SyntaxError: invalid syntax (train.py, line 1)"),
    ],
)  # fmt: skip
def test_odd_failures_give_one_line(tmp_path, body, exit_code, expected):
    script = write_script(tmp_path, body)
    result = collect(script, [], out_dir=tmp_path / "out")

    assert result.exit_code == exit_code
    assert result.error == f"{script} {expected}"  # no "(line 1)" repeated


def test_failed_rerun_keeps_the_previous_trace(tmp_path):
    first = collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)
    assert len(first.trace_files) == 1
    old = first.trace_files[0].read_bytes()

    script = loop_script(tmp_path, extra="if it == 2: raise RuntimeError('early')")
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.exit_code == 1 and result.trace_files == []  # nothing of this run
    assert first.trace_files[0].read_bytes() == old  # the earlier run's data is kept


def test_script_raising_mid_window_keeps_captured_steps(tmp_path, capfd):
    script = loop_script(tmp_path, extra="if it == 5: raise ValueError('bad thing')")
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=5)
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule)

    assert result.exit_code == 1 and not result.stopped_early
    assert "ValueError: bad thing" in result.error and "(line " in result.error
    assert result.error.startswith(str(script)) and "\n" not in result.error
    names = [s["name"] for s in profiler_steps(trace_events(result.trace_files[0]))]
    assert names[:2] == ["ProfilerStep#3", "ProfilerStep#4"]  # steps 3..5 recorded
    err = capfd.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: bad thing" in err
    assert "runpy" not in err  # perfscope's own frames are not shown


def test_sys_exit_code_is_reported(tmp_path):
    script = loop_script(tmp_path, extra="if it == 4: raise SystemExit(3)")
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.exit_code == 3 and "status 3" in result.error
    assert len(result.trace_files) == 1


def test_failure_before_the_window_writes_no_trace(tmp_path):
    script = loop_script(tmp_path, extra="if it == 2: raise RuntimeError('early')")
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL)

    assert result.exit_code == 1 and "RuntimeError: early" in result.error
    assert result.trace_files == []
