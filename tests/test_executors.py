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
import time
from concurrent.futures import Executor
from pathlib import Path

import pytest

from perfscope.analysis.executors import DaskExecutor, ExecutorError, ProcessExecutor, RankExecutor, SerialExecutor
from perfscope.errors import TraceFormatError

KINDS = ["serial", "process", "dask"]
WITH_WORKERS = ["process", "dask"]  # where fn runs in another process, which may die
GATE_WAIT_S = 15.0  # seconds a gated item waits for its gate before it gives up
# No dashboard, and the scheduler's HTTP server on a free port (8787 may be another cluster's)
NO_DASHBOARD = {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"}}


class Boom(Exception):
    """An exception class of the caller's own, which must cross to the caller as itself."""


# --- the functions the executors run (module level: they must pickle) ---------------------------


def _square(x):
    return x * x


def _later_ones_first(i):
    # the last item finishes first: an executor that yields in completion order is caught
    time.sleep(0.02 * (5 - i))
    return i * i


def _gated(arg):
    """Item 0 returns at once; item 1 only once the caller has created the gate file."""
    i, gate = arg
    if i == 1:
        deadline = time.monotonic() + GATE_WAIT_S
        while not Path(gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the gate never opened: the first result was not yielded before the second was done")
            time.sleep(0.01)
    return i


EXCEPTIONS = {
    "ValueError": lambda: ValueError("bad value in item 2"),
    "own class": lambda: Boom("boom at item 2"),
    "OSError": lambda: FileNotFoundError(2, "No such file or directory", "/nowhere/rank2.json"),
    "PerfscopeError": lambda: TraceFormatError("rank2.json: not a Kineto trace"),
}


def _raise_at_2(arg):
    i, kind = arg
    if i == 2:
        raise EXCEPTIONS[kind]()
    return i


def _die_on_marked(item):
    """Kills the worker process that runs an item marked ``die:`` (as the OOM killer would)."""
    if item.startswith("die:"):
        os._exit(1)
    return item.upper()


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
        client.wait_for_workers(2, timeout=60)  # both back, after a test that killed one
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


# --- the contract --------------------------------------------------------------------------------


def test_results_come_in_item_order(executor):
    assert list(executor.map(_later_ones_first, range(6))) == [i * i for i in range(6)]


def test_items_may_be_any_iterable_and_none_is_fine(executor):
    assert list(executor.map(_square, (x for x in (3, 1, 2)))) == [9, 1, 4]
    assert list(executor.map(_square, [])) == []


def test_a_result_is_yielded_before_later_items_are_done(executor, tmp_path):
    # item 1 waits for a gate that is opened only once result 0 is here: an executor that
    # collects every result before yielding the first makes item 1 give up (TimeoutError)
    gate = tmp_path / "gate"
    it = executor.map(_gated, [(0, str(gate)), (1, str(gate))])
    assert next(it) == 0
    gate.touch()
    assert next(it) == 1
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("kind", list(EXCEPTIONS))
def test_an_exception_of_fn_reaches_the_caller_at_its_item(executor, kind):
    expected = EXCEPTIONS[kind]()
    it = executor.map(_raise_at_2, [(i, kind) for i in range(5)])
    got = []
    with pytest.raises(type(expected)) as raised:
        for r in it:
            got.append(r)
    assert got == [0, 1]  # the results before it, none after
    assert type(raised.value) is type(expected)  # not a subclass or a wrapper of it
    assert str(raised.value) == str(expected)
    with pytest.raises(StopIteration):
        next(it)


def test_a_worker_that_dies_is_an_executor_error_naming_the_item(worker_executor):
    items = ["rank0.json", "rank1.json", "die:rank2.json", "rank3.json"]
    it = worker_executor.map(_die_on_marked, items)
    got = []
    with pytest.raises(ExecutorError) as raised:
        for r in it:
            got.append(r)
    # Results come in order, so none from the dying item or after it. A process pool fails every
    # item not done when one of its workers dies: the error names the first item not yielded.
    k = len(got)
    assert k <= 2 and got == [s.upper() for s in items[:k]]
    assert items[k] in str(raised.value)
    with pytest.raises(StopIteration):  # no later result
        next(it)
    # and the executor still works, on sound workers
    assert list(worker_executor.map(_square, [1, 2, 3])) == [1, 4, 9]


def test_dask_runs_again_elsewhere_an_item_whose_worker_died(request, tmp_path):
    ex = _make("dask", request)
    try:
        items = [(0, None), (1, None), (2, str(tmp_path / "died-once")), (3, None)]
        assert list(ex.map(_die_first_time, items)) == [0, 1, 2, 3]
        assert (tmp_path / "died-once").exists()  # it did kill a worker
    finally:
        ex.close()


def test_running_turns_a_dead_pool_worker_into_an_executor_error(executor):
    # the work on one large file done here, its batches on the executor's pool
    with pytest.raises(KeyError, match="a key"):  # the work's own errors pass through unchanged
        with executor.running("big.json"):
            raise KeyError("a key")
    if executor.pool is None:
        return
    with pytest.raises(ExecutorError, match=r"big\.json"):
        with executor.running("big.json"):
            executor.pool.submit(os._exit, 1).result()
    assert executor.pool.submit(pow, 2, 10).result() == 1024  # a sound pool again
    assert list(executor.map(_square, [4, 5])) == [16, 25]


def test_close_may_be_called_again(executor):
    assert list(executor.map(_square, [2])) == [4]
    executor.close()
    executor.close()


def test_as_a_context_manager_it_closes(request):
    for kind in KINDS:
        with _make(kind, request) as ex:
            assert list(ex.map(_square, [3])) == [9]
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
        assert list(ex.map(_square, [7])) == [49]
        ex.close()
        ex.close()
        assert client.status == "running"
        assert client.submit(_square, 8).result() == 64


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
            it = ex.map(_gated, [(0, str(gate)), (1, str(gate))])
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
