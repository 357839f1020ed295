"""``perfscope analyze DIR --dask ADDRESS`` end to end, against a local Dask cluster of worker
processes: the same summary.json as the serial analysis (and as ``--jobs 2``), a worker killed
while the ranks are analyzed (a whole analysis or a one-line error with nothing written, never a
partial summary), and a scheduler nobody answers at.

The command runs as a subprocess, as a user runs it; the cluster runs in the test process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from tracegen import cpu_op, launch, step, write_trace
from tracekit import NCCL_NEW
from conftest import HANG_TIMEOUT_S  # noqa: E402

RANKS = 6
BASE_NS = 1_700_000_000_000_000_000
# Fields of summary.json that differ between two analyses of the same traces (perfscope/analysis/summary.py):
# only when it was written.
VOLATILE = ("generated_at",)
CLI_TIMEOUT_S = 180


def _rank_trace(path: Path, rank: int, steps: int = 4, kernels: int = 3000) -> Path:
    """One rank of a data-parallel job: per step of 40 ms, ``kernels`` small kernels one after the
    other (4 us apart), then an all-reduce that ends at the same time on every rank; ~3.5 MB of
    text, so that the analysis of each rank takes long enough for a worker to be killed in the
    middle of it."""
    events, corr = [], 1
    for n in range(steps):
        s = 40_000 * n
        events += [step(n + 1, s, 40_000), cpu_op("aten::mm", s, 39_000)]
        t = s + 10
        for k in range(kernels):
            events += launch("gemm", t, t + 5, 2 + (rank + k) % 2, correlation=corr)
            corr, t = corr + 1, t + 4
        events += launch(NCCL_NEW, t, t + 20, s + 39_500 - (t + 20), correlation=corr, stream=20)
        corr += 1
    return write_trace(path, events, distributedInfo={"rank": rank, "world_size": RANKS}, baseTimeNanoseconds=BASE_NS)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("job") / "ranks"
    d.mkdir()
    for r in range(RANKS):
        _rank_trace(d / f"rank{r}.json", r)
    return d


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    # no dashboard, and the scheduler's HTTP server on a free port (8787 may be another cluster's)
    c = LocalCluster(n_workers=3, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None,
                     scheduler_kwargs={"dashboard_address": ":0"})
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(cluster):
    """A client of the cluster, once all 3 workers are there (a test before may have killed one)."""
    from distributed import Client

    with Client(cluster.scheduler_address, set_as_default=False) as c:
        c.wait_for_workers(3, timeout=HANG_TIMEOUT_S)
        yield c


def _perfscope(*args, cwd=None, env=None, wait=True):
    exe = Path(sys.executable).with_name("perfscope")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "perfscope.cli"]
    proc = subprocess.Popen([*cmd, *map(str, args)], cwd=cwd, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    return proc.returncode, out, err


def _comparable(summary_file: Path) -> dict:
    summary = orjson.loads(summary_file.read_bytes())
    for key in VOLATILE:
        summary.pop(key)
    return summary


@pytest.fixture(scope="module")
def serial(ranks, tmp_path_factory) -> dict:
    """The summary of the analysis in one process (``--jobs 1``), its volatile fields removed."""
    out = tmp_path_factory.mktemp("serial") / "out"
    rc, _, err = _perfscope("analyze", ranks, "--jobs", 1, "--out", out)
    assert rc == 0, err
    summary = _comparable(out / "summary.json")
    assert summary["run"]["ranks_analyzed"] == RANKS and summary["overall"]["steps_counted"] == RANKS * 4
    assert summary["warnings"] == []  # the traces are clean: what differs would be the executor's doing
    return summary


def _analyze_tasks(stream: list[dict]) -> list[dict]:
    return [t for t in stream if str(t["key"]).startswith("analyze_as-")]


def test_the_cluster_gives_the_serial_summary(ranks, serial, client, tmp_path):
    from distributed import get_task_stream

    out = tmp_path / "out"
    with get_task_stream(client) as tasks:
        rc, _, err = _perfscope("analyze", ranks, "--dask", client.scheduler.address, "--out", out)
    assert rc == 0, err
    assert _comparable(out / "summary.json") == serial
    # and the cluster's workers did analyze the ranks (not this machine in their place)
    assert len(_analyze_tasks(tasks.data)) == RANKS


def test_a_single_rank_is_analyzed_on_the_cluster_too(ranks, client, tmp_path):
    from distributed import get_task_stream

    one = tmp_path / "one"
    one.mkdir()
    (one / "rank0.json").write_bytes((ranks / "rank0.json").read_bytes())
    with get_task_stream(client) as tasks:
        rc, _, err = _perfscope("analyze", one, "--dask", client.scheduler.address, "--out", tmp_path / "out")
    assert rc == 0, err
    assert len(_analyze_tasks(tasks.data)) == 1  # --dask was asked for: the file is read there


def test_a_relative_path_is_analyzed_on_the_cluster(ranks, client, tmp_path):
    # the workers' working directory is the test's, not the command's
    rc, _, err = _perfscope("analyze", ranks.name, "--dask", client.scheduler.address, "--out", tmp_path / "out",
                            cwd=ranks.parent)
    assert rc == 0, err
    assert orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["run"]["ranks_analyzed"] == RANKS


def test_two_local_processes_give_the_serial_summary(ranks, serial, tmp_path):
    out = tmp_path / "out"
    rc, _, err = _perfscope("analyze", ranks, "--jobs", 2, "--out", out)
    assert rc == 0, err
    assert _comparable(out / "summary.json") == serial


@pytest.mark.parametrize("with_out", [True, False], ids=["--out", "default-out"])
def test_an_unreachable_scheduler_is_one_line_and_nothing_written(ranks, tmp_path, with_out):
    with socket.socket() as s:  # a port nobody listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "out"
    args = ["analyze", ranks, "--dask", f"tcp://127.0.0.1:{port}"] + (["--out", out] if with_out else [])
    # Dask retries a refused connection for its connect timeout (30 s by default): 2 s here
    rc, _, err = _perfscope(*args, cwd=cwd, env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"perfscope: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}")
    assert not out.exists() and list(cwd.iterdir()) == []  # no output directory, not even an empty one


def _kill_a_busy_worker(client, proc) -> None:
    """SIGKILL (as the OOM killer does) a worker process while it holds a rank's analysis."""
    deadline = time.monotonic() + CLI_TIMEOUT_S
    while time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items() if any(str(k).startswith("analyze_as-") for k in keys)]
        if busy:
            break
        assert proc.poll() is None, "the analysis ended before any rank reached a worker"
        time.sleep(0.005)
    else:
        pytest.fail("no rank's analysis reached a worker")
    pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
    assert proc.poll() is None, "the analysis ended before a worker could be killed"
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("allowed_failures", [3, 0], ids=["rerun", "give-up"])
def test_a_worker_killed_mid_run_gives_the_whole_summary_or_one_line_and_nothing(
        ranks, serial, cluster, client, tmp_path, allowed_failures):
    # 3 (Dask's default): the killed worker's ranks are analyzed again by the others; 0: the
    # scheduler gives them up at once. Set on the running scheduler, which reads it per death.
    before = cluster.scheduler.allowed_failures
    cluster.scheduler.allowed_failures = allowed_failures
    out = tmp_path / "out"
    try:
        proc = _perfscope("analyze", ranks, "--dask", client.scheduler.address, "--out", out, wait=False)
        try:
            _kill_a_busy_worker(client, proc)
            _, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        cluster.scheduler.allowed_failures = before
    if proc.returncode == 0:  # a whole analysis: every rank, as the serial one
        assert _comparable(out / "summary.json") == serial
    else:  # or none: one clear line, and no summary to be taken for a whole one
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("perfscope: error: "), err
        assert "died" in lines[0] or "lost" in lines[0], err  # says why
        assert not (out / "summary.json").exists()


@pytest.mark.parametrize("address", ["garbage", "tcp://", "http://127.0.0.1:8799"])
def test_a_malformed_scheduler_address_is_one_line_at_once(ranks, tmp_path, address):
    rc, _, err = _perfscope("analyze", ranks, "--dask", address, "--out", tmp_path / "out")
    # one line: no "Exception ignored in Client.__del__" after Dask's background retries
    assert rc == 2 and err.strip().count("\n") == 0 and "not an address of a Dask scheduler" in err
    assert not (tmp_path / "out").exists()


def test_a_service_that_is_not_a_scheduler_is_one_line(ranks, tmp_path):
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held = []
    threading.Thread(target=lambda: held.append(srv.accept()), daemon=True).start()  # accepts, never answers
    env = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    rc, _, err = _perfscope("analyze", ranks, "--dask", f"tcp://127.0.0.1:{srv.getsockname()[1]}", "--out",
                            tmp_path / "out", env=env)
    srv.close()
    assert rc == 2 and err.strip().count("\n") == 0 and "cannot reach the Dask scheduler" in err
    assert not (tmp_path / "out").exists()


def test_jobs_and_dask_are_one_or_the_other(ranks, tmp_path):
    rc, _, err = _perfscope("analyze", ranks, "--dask", "tcp://127.0.0.1:1", "--jobs", "2", "--out", tmp_path / "o")
    assert rc == 2 and "not allowed with" in err
