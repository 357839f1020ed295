"""The contract of :class:`perfscope.analysis.executors.RankExecutor`, run against every
implementation: results in item order and as soon as they are done, the function's exceptions at
their item, a dead worker as ExecutorError naming the item, close() more than once, ``workers`` and
``pool``. Each executor gets the same tests, so a new one is checked by adding it to ``KINDS``.

Everything given to an executor is a module-level function or exception (workers unpickle them by
name, importing this module, so dask is imported only where a test needs it: a worker starts
faster); gates and markers are files, which every worker process sees.
"""

from __future__ import annotations

import logging
import os
import socket
from concurrent.futures import Executor
from pathlib import Path

import pytest

from perfscope.analysis.executors import DaskExecutor, ExecutorError, ProcessExecutor, RankExecutor, SerialExecutor
from perfscope.testing import ContractError
from perfscope.testing.executors import (
    check_close,
    check_dead_worker,
    check_exceptions,
    check_order,
    check_running,
    check_streaming,
    gated,
    square,
)
from conftest import HANG_TIMEOUT_S  # noqa: E402

KINDS = ["serial", "process", "dask"]
WITH_WORKERS = ["process", "dask"]  # where fn runs in another process, which may die
# No dashboard, and the scheduler's HTTP server on a free port (8787 may be another cluster's)
NO_DASHBOARD = {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"}}


def _die_first_time(arg):
    """Kills its worker the first time only (the marker file says it happened), then returns."""
    value, marker = arg
    if marker is not None and not Path(marker).exists():
        Path(marker).touch()
        os._exit(1)
    return value


# --- the executors -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes; a task is given up after 2 workers died running it
    (allowed-failures 1, not 3: each death costs a worker restart)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        c = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", **NO_DASHBOARD)
    try:
        yield c
    finally:
        c.close()


def _make(kind: str, request) -> RankExecutor:
    if kind == "serial":
        return SerialExecutor()
    if kind == "process":
        return ProcessExecutor(2)
    from distributed import Client

    c = request.getfixturevalue("cluster")
    with Client(c.scheduler_address, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=HANG_TIMEOUT_S)  # both back, after a test that killed one
    return DaskExecutor(c.scheduler_address)


def _made(request):
    ex = _make(request.param, request)
    try:
        yield ex
    finally:
        ex.close()


@pytest.fixture(params=KINDS)
def executor(request):
    yield from _made(request)


@pytest.fixture(params=WITH_WORKERS)
def worker_executor(request):
    yield from _made(request)


# --- the contract (perfscope.testing.executors), on every executor ---------------------------------


def test_results_come_in_item_order(executor):
    check_order(executor)


def test_a_result_is_yielded_before_later_items_are_done(executor):
    check_streaming(executor)


def test_an_exception_of_fn_reaches_the_caller_at_its_item(executor):
    check_exceptions(executor)


def test_a_worker_that_dies_is_an_executor_error_naming_the_item(worker_executor):
    check_dead_worker(worker_executor)


def test_running_turns_a_dead_pool_worker_into_an_executor_error(executor):
    check_running(executor)


def test_close_may_be_called_again(executor):
    check_close(executor)


def test_the_suite_catches_an_executor_that_collects_before_yielding(monkeypatch):
    from perfscope.testing import executors as suite

    class Collecting(SerialExecutor):
        def map(self, fn, items):
            return iter([fn(x) for x in items])

    monkeypatch.setattr(suite, "GATE_WAIT_S", 0.2)  # in this process: item 1 gives up soon
    with pytest.raises(ContractError, match="not yielded"), Collecting() as ex:
        check_streaming(ex)


# --- each implementation's own -------------------------------------------------------------------


def test_dask_runs_again_elsewhere_an_item_whose_worker_died(request, tmp_path):
    ex = _make("dask", request)
    try:
        items = [(0, None), (1, None), (2, str(tmp_path / "died-once")), (3, None)]
        assert list(ex.map(_die_first_time, items)) == [0, 1, 2, 3]
        assert (tmp_path / "died-once").exists()  # it did kill a worker
    finally:
        ex.close()


def test_as_a_context_manager_it_closes(request):
    for kind in KINDS:
        with _make(kind, request) as ex:
            assert list(ex.map(square, [3])) == [9]
        ex.close()  # once more, after __exit__
        if isinstance(ex, ProcessExecutor):
            assert ex.pool is None


def test_workers_and_pool(executor):
    if isinstance(executor, SerialExecutor):
        assert executor.workers == 1 and executor.pool is None
    elif isinstance(executor, ProcessExecutor):
        assert executor.workers == 2 and isinstance(executor.pool, Executor)
    else:
        assert executor.workers == 2 and executor.pool is None  # 2 workers of 1 thread


def test_a_dask_executor_on_a_given_client_leaves_it_open(cluster):
    from distributed import Client

    with Client(cluster.scheduler_address, set_as_default=False) as client:
        ex = DaskExecutor(client)
        assert list(ex.map(square, [7])) == [49]
        ex.close()
        ex.close()
        assert client.status == "running"
        assert client.submit(square, 8).result() == 64


def test_an_unreachable_scheduler_is_an_executor_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ExecutorError, match=rf"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:{port}"):
        DaskExecutor(f"tcp://127.0.0.1:{port}", timeout_s=1)


def test_a_process_executor_needs_a_worker():
    with pytest.raises(ValueError, match="at least 1"):
        ProcessExecutor(0)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_scheduler_that_goes_away_is_an_executor_error(tmp_path):
    import dask
    from distributed import LocalCluster

    # short reconnection attempts: the client's and the orphaned worker's (closing the cluster)
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        c = LocalCluster(n_workers=1, processes=False, threads_per_worker=1, protocol="tcp://", host="127.0.0.1",
                         **NO_DASHBOARD)
        ex = DaskExecutor(c.scheduler_address)
        gate = tmp_path / "gate"
        try:
            it = ex.map(gated, [(0, str(gate)), (1, str(gate))])
            assert next(it) == 0
            c.sync(c.scheduler.close)  # the scheduler alone, while item 1 waits at its gate on the worker
            with pytest.raises(ExecutorError, match=r"lost the Dask cluster while analyzing \(1, ") as raised:
                next(it)
            assert "\n" not in str(raised.value)  # one line, for the command's one line
            said = _Records()
            logging.getLogger("distributed.client").addHandler(said)
            try:
                ex.close()
            finally:
                logging.getLogger("distributed.client").removeHandler(said)
            assert [r.getMessage() for r in said.records if r.levelno >= logging.WARNING] == []  # nothing more said
        finally:
            gate.touch()
            ex.close()
            c.close()
