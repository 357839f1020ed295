"""Worker processes on this machine give the analysis the serial path gives: ranks in parallel,
and the batches of one large file decoded by the pool (docs/reading.md, "Every core")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perfscope.analysis.progress import Progress
from perfscope.analysis.run import analyze_files, choose_executor
from perfscope.errors import TraceFormatError

A100 = Path(__file__).resolve().parents[2] / "shared/traces/hta/a100_rank3_of8_train.json.gz"
TWO = Path(__file__).resolve().parents[2] / "shared/traces/hta/two_ranks"


def _same(a, b) -> dict:
    sa, sb = a.summary(), b.summary()
    sa.pop("generated_at", None)
    sb.pop("generated_at", None)
    return sa == sb


@pytest.mark.skipif(not A100.is_file(), reason="needs ../shared/traces")
def test_one_file_decoded_by_two_workers_gives_the_serial_analysis():
    serial = analyze_files([A100], jobs=1)
    pooled = analyze_files([A100], jobs=2)
    assert _same(serial, pooled)
    assert pooled.steps.equals(serial.steps)


@pytest.mark.skipif(not A100.is_file(), reason="needs ../shared/traces")
def test_the_pool_of_one_file_is_shut_down_before_its_rows_are_assembled(monkeypatch):
    import multiprocessing

    from perfscope.analysis.executors import ProcessExecutor
    from perfscope.trace import assemble

    seen = []
    real = assemble.assemble

    def watched(*args, **kwargs):
        seen.append(len(multiprocessing.active_children()))
        return real(*args, **kwargs)

    monkeypatch.setattr(assemble, "assemble", watched)
    analyze_files([A100], jobs=2)
    assert seen == [0]  # the analysis's own pool: its workers were gone before the assembly
    with ProcessExecutor(2) as given:
        analyze_files([A100], executor=given)
        assert given.pool is not None  # a caller's executor stays the caller's to close
        assert seen[1] > 0


@pytest.mark.skipif(not TWO.is_dir(), reason="needs ../shared/traces")
def test_ranks_on_two_workers_give_the_serial_analysis_and_the_progress_counts_every_byte():
    files = sorted(TWO.glob("*.json.gz"))
    serial = analyze_files(files, jobs=1)
    progress = Progress(files, enabled=True)
    seen = []
    progress._bar.update = seen.append  # what the bar would be told
    pooled = analyze_files(files, jobs=2, progress=progress)
    progress._bar = type("Off", (), {"close": lambda self: None})()
    assert _same(serial, pooled)
    assert sum(seen) == sum(f.stat().st_size for f in files)
    assert progress._done_files == len(files)


def test_an_unreadable_single_file_fails_the_same_with_workers(tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": ]}')
    with pytest.raises(TraceFormatError) as serial:
        analyze_files([bad], jobs=1)
    with pytest.raises(TraceFormatError) as pooled:
        analyze_files([bad], jobs=2)
    assert str(pooled.value) == str(serial.value) and "rank0.json:1:" in str(serial.value)


def test_small_traces_stay_in_this_process_unless_workers_are_asked_for(tmp_path):
    small = tmp_path / "t.json"
    small.write_text('{"traceEvents": []}')
    with choose_executor([small], None) as auto:
        assert auto.workers == 1 and auto.pool is None
    with choose_executor([small], 2) as asked:
        assert asked.workers == 2 and asked.pool is not None


def _children(pid: int) -> set[int]:
    """Every process below ``pid`` (a scan of /proc)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat[stat.rfind(")") + 2 :].split()[1])
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.update(kids)
        todo.extend(kids)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2] != "Z"


@pytest.mark.skipif(not A100.is_file() or not Path("/proc").is_dir(), reason="needs ../shared/traces and Linux")
def test_workers_end_when_the_analysis_is_killed_outright(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    d = tmp_path / "ranks"
    d.mkdir()
    for r in range(12):
        (d / f"rank{r}.json.gz").write_bytes(A100.read_bytes())
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", "analyze", str(d), "--jobs", "2", "--out",
                             str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        workers: set[int] = set()
        for _ in range(300):  # the fork server and its two workers
            workers = _children(proc.pid)
            if len(workers) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None and len(workers) >= 3, "the analysis ended before its workers were seen"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for _ in range(600):  # 30 s: a worker still importing on a loaded machine notices late
            left = _marked(proc.pid) | {p for p in workers if _alive(p)}
            if not left:
                break
            time.sleep(0.05)
        # also those started after the snapshot (by their mark: every process the analysis
        # starts inherits it), and the resource tracker, which ends once they all have
        stale = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in left if _alive(p)}
        assert not stale, f"processes of the killed analysis still run: {stale}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _marked(proc.pid):
            os.kill(p, signal.SIGKILL)


def _marked(starter: int) -> set[int]:
    """Live processes whose environment carries the fork server's mark for ``starter``."""
    mark = f"PERFSCOPE_FORKSERVER={starter}".encode()
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in env and _alive(int(d.name)):
                found.add(int(d.name))
    return found


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc").is_dir(), reason="needs fork and Linux")
def test_a_worker_whose_fork_server_died_before_it_asked_for_the_death_signal_exits():
    """The race the pool's initializer closes: the server forks a worker and dies before the
    worker asks the kernel; the orphan, reparented, must not wait for a signal that never comes."""
    import time

    from perfscope.analysis import worker_init

    r, w = os.pipe()
    server = os.fork()
    if server == 0:  # stands for the fork server: imported the module, forks, dies
        try:
            os.close(r)
            me = os.getpid()
            worker_pid = os.fork()
            if worker_pid == 0:
                while os.getppid() == me:  # until the server is gone and this one reparented
                    time.sleep(0.01)
                worker_init.worker()
                os.write(w, b"survived")
                os._exit(0)
            os.write(w, str(worker_pid).encode().ljust(16))
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(server, 0)
    worker_pid = int(os.read(r, 16))
    with os.fdopen(r, "rb") as pipe:
        said = pipe.read()  # EOF once the worker exited
    for _ in range(200):
        if not _alive(worker_pid):
            break
        time.sleep(0.01)
    assert said == b"" and not _alive(worker_pid)


@pytest.mark.skipif(not TWO.is_dir() or not Path("/proc/self/mem").exists(), reason="needs ../shared/traces and Linux")
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_file_that_cannot_be_read_is_named_and_left_out_of_a_directory(tmp_path, jobs):
    d = tmp_path / "ranks"
    d.mkdir()
    good = sorted(TWO.glob("*.json.gz"))[0]
    (d / good.name).write_bytes(good.read_bytes())
    (d / "rank9.json").symlink_to("/proc/self/mem")  # reading it fails with an I/O error
    a = analyze_files(sorted(d.iterdir()), skip_unreadable=True, jobs=jobs)
    (skipped,) = a.skipped
    assert skipped.reason.startswith(f"{d / 'rank9.json'}: cannot be read (")
    assert len(a.traces) == 1
    with pytest.raises(TraceFormatError, match="rank9.json: cannot be read"):
        analyze_files([d / "rank9.json"], jobs=jobs)


def _job_trace(path: Path, world_size: int, rank: int, gz: bool = False) -> Path:
    """A small CPU trace whose header says its job's world size and its rank."""
    import gzip
    import json

    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
               "ts": i * 1000, "dur": 900} for i in range(1, 4)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i * 1000 + 10, "dur": 800}
               for i in range(1, 4)]
    data = json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank,
                                                                 "world_size": world_size},
                       "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_a_folder_of_several_jobs_stops_at_the_first_conflicting_header_before_any_parse(tmp_path, monkeypatch):
    from perfscope.analysis import run as run_mod
    from perfscope.errors import AnalysisError

    files = [_job_trace(tmp_path / "a.pt.trace.json", 2, 0), _job_trace(tmp_path / "b.pt.trace.json.gz", 4, 1, gz=True),
             _job_trace(tmp_path / "c.pt.trace.json", 2, 1)]
    monkeypatch.setattr(run_mod, "_run_files", lambda *a, **k: pytest.fail("a file was parsed"))
    with pytest.raises(AnalysisError, match=r"a.pt.trace.json has world size 2, b.pt.trace.json.gz has world size 4"):
        run_mod.analyze_files(files)


def test_a_failed_analysis_leaves_no_output_folder_it_made_and_keeps_one_the_user_had(tmp_path):
    from test_bad_input import run_cli

    traces = tmp_path / "jobs"
    traces.mkdir()
    _job_trace(traces / "a.pt.trace.json", 2, 0)
    _job_trace(traces / "b.pt.trace.json", 4, 1)
    made, had = tmp_path / "new-out", tmp_path / "my-out"
    had.mkdir()
    for out in (made, had):
        r = run_cli(tmp_path, "analyze", traces, "--out", out)
        assert r.returncode == 2 and "different jobs" in r.stderr, r.stderr
    assert not made.exists() and had.is_dir()
