"""Collection runs of several ranks: each torchrun rank profiling itself, the rank traces a run
wrote told apart from stale ones, waiting for all ranks, a bad torchrun environment, and
``nproc_per_node`` runs that succeed, fail on one rank or are interrupted with Ctrl-C."""

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

pytest.importorskip("torch")

from collectkit import SMALL, loop_script, profiler_steps, trace_events, write_script

from perfscope.collect import (
    CollectError,
    ProfileSchedule,
    collect,
    is_distributed_worker,
    remove_stale_rank_traces,
    traces,
    wait_for_rank_traces,
)
from conftest import HANG_TIMEOUT_S  # noqa: E402

# --------------------------------------------------------------------------- rank trace files


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
        out, _ = proc.communicate(timeout=HANG_TIMEOUT_S)
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
