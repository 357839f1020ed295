"""Collection tests, part 2: how runs end (max-steps, failures, exit codes), what the script sees,
what is written, bad input, and multi-rank runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

from perfscope.collect import (  # noqa: E402
    CollectError,
    ProfileSchedule,
    collect,
    is_distributed_worker,
    remove_stale_rank_traces,
    wait_for_rank_traces,
)
from perfscope.collect import traces  # noqa: E402
from perfscope.errors import PerfscopeError  # noqa: E402
from collectkit import (  # noqa: E402
    SMALL,
    loop_script,
    profiler_steps,
    trace_events,
    write_script,
)


# --------------------------------------------------------------------------- ending


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


def test_script_sees_what_python_would_show(tmp_path):
    sub = tmp_path / "proj"
    sub.mkdir()
    script = write_script(
        sub,
        """
        import json, sys
        json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0]},
                  open(sys.argv[1], "w"))
        """,
        name="show.py",
    )
    expected_file, seen_file = tmp_path / "python.json", tmp_path / "perfscope.json"
    subprocess.run([sys.executable, str(script), str(expected_file), "--flag", "x"], check=True)
    argv_before, path_before, main_before = list(sys.argv), list(sys.path), sys.modules["__main__"]

    result = collect(str(script), [str(seen_file), "--flag", "x"], out_dir=tmp_path / "out")

    assert result.exit_code == 0
    expected, seen = json.loads(expected_file.read_text()), json.loads(seen_file.read_text())
    seen["argv"][1] = expected["argv"][1] = "<file>"
    assert seen == expected
    assert seen["name"] == "__main__" and seen["path0"] == str(sub.resolve())
    assert sys.argv == argv_before and sys.path == path_before
    assert sys.modules["__main__"] is main_before


def test_relative_out_dir_survives_a_script_that_changes_directory(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = loop_script(tmp_path, extra="pass")
    script.write_text(f"import os\nos.chdir({str(elsewhere)!r})\n" + script.read_text())
    monkeypatch.chdir(tmp_path)
    result = collect(script, [], out_dir=pathlib.Path("out"), schedule=SMALL)

    assert result.error is None
    assert result.trace_files == [tmp_path / "out" / "traces" / "rank0.pt.trace.json.gz"]
    assert result.trace_files[0].is_file() and not (elsewhere / "out").exists()
    assert result.run_info["cwd"] == str(tmp_path)  # read before the script ran
    assert os.getcwd() == str(tmp_path)  # and put back after it


def test_script_stream_changes_do_not_leak(tmp_path, monkeypatch):
    # Our own stdout/stderr on files, so the script may close them safely.
    out_file, err_file, log = tmp_path / "stdout.txt", tmp_path / "stderr.txt", tmp_path / "user.log"
    out_fd = os.open(out_file, os.O_WRONLY | os.O_CREAT)
    err_fd = os.open(err_file, os.O_WRONLY | os.O_CREAT)
    out = open(out_fd, "w", closefd=False)
    err = open(err_fd, "w", closefd=False)
    stdin = sys.stdin
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    script = write_script(
        tmp_path,
        f"""
        import io, sys
        sys.stdout = open({str(log)!r}, "w")   # redirected for good
        sys.stdin = io.StringIO("")
        print("to the user's log")
        sys.stderr.close()                     # and the real stderr closed
        raise ValueError("after closing stderr")
        """,
    )
    try:
        result = collect(script, [], out_dir=tmp_path / "out")
        assert sys.stdout is out and sys.stdin is stdin
        assert sys.stderr is not err and not sys.stderr.closed
        print("perfscope's report")
        print("perfscope's error", file=sys.stderr)
        sys.stdout.flush(); sys.stderr.flush()
    finally:
        for stream in (out, sys.stderr):
            stream.close()
        os.close(out_fd); os.close(err_fd)
    assert result.exit_code == 1 and "ValueError: after closing stderr" in result.error
    assert "perfscope" not in log.read_text()
    assert out_file.read_text() == "perfscope's report\n"
    # The script's traceback and perfscope's message reach the same file.
    err_text = err_file.read_text()
    assert "ValueError: after closing stderr" in err_text and err_text.endswith("perfscope's error\n")


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


def test_remove_stale_rank_traces(tmp_path):
    for rank in range(3):
        (tmp_path / f"rank{rank}.pt.trace.json.gz").write_bytes(b"")
    (tmp_path / "other.json").write_bytes(b"")
    removed = remove_stale_rank_traces(tmp_path, [tmp_path / "rank0.pt.trace.json.gz"])

    assert [p.name for p in removed] == ["rank1.pt.trace.json.gz", "rank2.pt.trace.json.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json", "rank0.pt.trace.json.gz"]


def test_launch_reports_only_the_traces_it_wrote(tmp_path):
    # The launcher compares the rank files before and after: a trace is
    # written to a temporary file and renamed over the old one.
    for rank in range(3):
        (tmp_path / f"rank{rank}.pt.trace.json.gz").write_bytes(b"old")
    before = traces.rank_trace_stamps(tmp_path)
    tmp = tmp_path / ".rank1.tmp.gz"
    tmp.write_bytes(b"old")  # same content and size as before
    os.replace(tmp, tmp_path / "rank1.pt.trace.json.gz")
    (tmp_path / "rank3.pt.trace.json.gz").write_bytes(b"new")  # beyond this run's ranks

    written = traces.rank_traces_written_since(tmp_path, 2, before)
    assert [p.name for p in written] == ["rank1.pt.trace.json.gz"]


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


def test_hooks_and_patches_are_removed_afterwards(tmp_path):
    import torch.optim.optimizer as optim_mod
    import torch.utils.data.dataloader as dataloader_mod
    from torch.nn.modules import module as module_mod

    from perfscope.collect import control

    def state():
        return (
            dataloader_mod._BaseDataLoaderIter.__next__,
            torch.autograd.backward,
            torch.amp.GradScaler.step,
            len(optim_mod._global_optimizer_pre_hooks),
            len(optim_mod._global_optimizer_post_hooks),
            len(module_mod._global_forward_pre_hooks),
        )

    before = state()
    collect(loop_script(tmp_path, extra="if it == 4: raise KeyError('x')"), [],
            out_dir=tmp_path / "out", schedule=SMALL)  # fmt: skip
    collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)
    assert state() == before and control.active is None


# --------------------------------------------------------------------------- errors


def test_bad_script_paths_raise_collect_error(tmp_path):
    (tmp_path / "notes.txt").write_text("print(1)")
    for bad in [tmp_path / "missing.py", tmp_path / "notes.txt", tmp_path]:
        with pytest.raises(CollectError):
            collect(bad, [], out_dir=tmp_path / "out")
    assert issubclass(CollectError, PerfscopeError)


def test_unwritable_out_dir_raises_before_running(tmp_path):
    marker = tmp_path / "ran"
    script = write_script(tmp_path, f"open({str(marker)!r}, 'w')\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(CollectError, match="cannot write to output directory"):
        collect(script, [], out_dir=blocker / "out")
    assert not marker.exists()


@pytest.mark.parametrize(
    "kwargs",
    [{"active": 0}, {"skip_first": -1}, {"warmup": 1.5}, {"active": True}, {"max_steps": 3}],
)
def test_schedule_validation(kwargs):
    field = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"ProfileSchedule.{field} must be") as info:
        ProfileSchedule(**kwargs)
    assert isinstance(info.value, PerfscopeError)  # the CLI prints it as one line


def test_schedule_stop_rule():
    assert ProfileSchedule().stop_after == 10
    assert ProfileSchedule(max_steps=0).stop_after is None
    assert ProfileSchedule(max_steps=50).stop_after == 50


# --------------------------------------------------------------------------- distributed


def test_torchrun_rank_profiles_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert is_distributed_worker()
    result = collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)

    assert [p.name for p in result.trace_files] == ["rank1.pt.trace.json.gz"]
    assert result.run_info["world_size"] == 2 and result.run_info["rank"] == 1

    # Rank 0 writes its own trace and leaves rank 1's in place; the caller
    # then waits for all ranks with wait_for_rank_traces.
    monkeypatch.setenv("RANK", "0")
    started = time.time()
    result = collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)
    assert [p.name for p in result.trace_files] == ["rank0.pt.trace.json.gz"]
    both = wait_for_rank_traces(result.trace_dir, 2, timeout_s=5, newer_than=started - 60)
    assert [p.name for p in both] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]


def test_wait_for_rank_traces(tmp_path):
    (tmp_path / "rank0.pt.trace.json.gz").write_bytes(b"")
    (tmp_path / "rank1.pt.trace.json.gz").write_bytes(b"")
    start = time.monotonic()
    assert len(wait_for_rank_traces(tmp_path, 3, timeout_s=0.3, poll_s=0.05)) == 2
    assert time.monotonic() - start >= 0.3
    assert len(wait_for_rank_traces(tmp_path, 2, timeout_s=60)) == 2  # returns at once
    old = time.time() - 3600
    os.utime(tmp_path / "rank1.pt.trace.json.gz", (old, old))
    fresh = wait_for_rank_traces(tmp_path, 2, timeout_s=0, newer_than=time.time() - 60)
    assert [p.name for p in fresh] == ["rank0.pt.trace.json.gz"]


def test_is_distributed_worker(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not is_distributed_worker()


@pytest.mark.parametrize(
    "rank, world_size, message",
    [("0", "0", "WORLD_SIZE must be >= 1"), ("x", "2", "RANK must be an integer"),
     ("0", "two", "WORLD_SIZE must be an integer"), ("2", "2", "RANK must be in 0..1"),
     ("-1", "2", "RANK must be in 0..1"), ("", "1", "RANK must be an integer")],
)  # fmt: skip
def test_invalid_torchrun_environment_is_an_error(tmp_path, monkeypatch, rank, world_size, message):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    with pytest.raises(CollectError, match=message):
        is_distributed_worker()
    marker = tmp_path / "ran"
    script = write_script(tmp_path, f"open({str(marker)!r}, 'w')\n")
    with pytest.raises(CollectError, match=message):
        collect(script, [], out_dir=tmp_path / "out")
    assert not marker.exists()  # refused before the script started


DDP_SCRIPT = """
import os, sys, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(10**6):
    if i == {fail_at} and dist.get_rank() == 1:
        raise ValueError("rank one failed")
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
"""


@pytest.mark.slow
def test_nproc_per_node_two_ranks(tmp_path):
    script = write_script(tmp_path, DDP_SCRIPT.format(fail_at=-1))
    schedule = ProfileSchedule(skip_first=1, warmup=1, active=2)
    # Left by an earlier run with 3 ranks: replaced or kept, never reported.
    old_dir = tmp_path / "out" / "traces"
    old_dir.mkdir(parents=True)
    for rank in range(3):
        (old_dir / f"rank{rank}.pt.trace.json.gz").write_bytes(b"old")
    result = collect(script, [], out_dir=tmp_path / "out", schedule=schedule, nproc_per_node=2)

    assert result.exit_code == 0 and result.error is None
    assert result.stopped_early and result.steps_seen == 4
    assert [p.name for p in result.trace_files] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    for path in result.trace_files:
        assert len(profiler_steps(trace_events(path))) == 2
    assert result.run_info["world_size"] == 2 and result.run_info["nproc_per_node"] == 2
    assert (old_dir / "rank2.pt.trace.json.gz").exists()
    assert remove_stale_rank_traces(old_dir, result.trace_files) == [old_dir / "rank2.pt.trace.json.gz"]


@pytest.mark.slow
def test_nproc_per_node_failing_rank(tmp_path):
    script = write_script(tmp_path, DDP_SCRIPT.format(fail_at=1))
    result = collect(script, [], out_dir=tmp_path / "out", schedule=SMALL, nproc_per_node=2)

    assert result.exit_code != 0
    assert "rank 1" in result.error and "ValueError: rank one failed" in result.error
    assert result.trace_files == []
    assert processes_running(script) == []  # no rank left behind


@pytest.mark.slow
def test_nproc_per_node_ctrl_c_gives_130(tmp_path):
    # Ranks that ignore SIGTERM keep the launcher waiting; a second Ctrl-C
    # then must kill them at once and still give the interrupted result.
    script = write_script(
        tmp_path,
        f"""
        import os, signal, time, torch.distributed as dist
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        dist.init_process_group("gloo")
        open(os.path.join({str(tmp_path)!r}, f"started{{dist.get_rank()}}"), "w").close()
        while True:
            time.sleep(0.1)
        """,
    )
    driver = textwrap.dedent(
        f"""
        import json, pathlib, signal
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the runner ignores it
        from perfscope.collect import collect
        result = collect({str(script)!r}, [], out_dir=pathlib.Path({str(tmp_path / "out")!r}),
                         nproc_per_node=2)
        print(json.dumps({{"exit_code": result.exit_code, "error": result.error}}))
        """
    )
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"started{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - started < 20  # not the launcher's 30 s grace
    assert proc.returncode == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["exit_code"] == 130 and "interrupted" in result["error"]
    deadline = time.monotonic() + 10
    while processes_running(script) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_running(script) == []


def processes_running(script: pathlib.Path) -> list[str]:
    found = []
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(script) in cmdline:
            found.append(cmdline)
    return found
