"""Where the per-file work of an analysis runs: here, on this machine's cores, or on a Dask cluster.

An executor is passed to :func:`perfscope.analysis.run.analyze_files` as an instance of
:class:`RankExecutor`; every implementation passes the same contract tests
(``tests/test_executors.py``). The work given to it is one file each (read, decode, find the
steps, measure them); the reduction of the per-file results into one summary always happens in
the calling process, so every executor gives the same summary.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Executor

from perfscope.errors import PerfscopeError


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Hide the ``__main__`` module while worker processes start.

    Forkserver and spawn workers import the parent's ``__main__`` again -- the user's training
    script, when perfscope is called from it or runs it -- which would run the script a second
    time (or fail for want of an ``if __name__ == "__main__"`` guard). The work sent to them is
    perfscope's own, so they need nothing from it.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _pool_class():
    from concurrent.futures import ProcessPoolExecutor

    class Pool(ProcessPoolExecutor):
        """A process pool whose workers (started on demand, and the fork server with the first)
        start with ``__main__`` hidden (:func:`_main_hidden`)."""

        def _spawn_process(self):  # the one place the pool starts a process (CPython 3.9+)
            # the fork server starts with the first worker: the mark (this process's pid) makes it
            # die with this process, also when this one is killed before the server asks the kernel
            previous = os.environ.get("PERFSCOPE_FORKSERVER")
            os.environ["PERFSCOPE_FORKSERVER"] = str(os.getpid())
            try:
                with _main_hidden():
                    super()._spawn_process()
            finally:
                if previous is None:
                    os.environ.pop("PERFSCOPE_FORKSERVER", None)
                else:
                    os.environ["PERFSCOPE_FORKSERVER"] = previous

    return Pool


class ExecutorError(PerfscopeError):
    """The executor itself failed (a worker died and its work could not be done elsewhere, the
    cluster cannot be reached): the analysis is incomplete and no summary is written."""


def cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` set)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


class RankExecutor(abc.ABC):
    """Runs one function over a list of items.

    Contract (every implementation):

    - :meth:`map` yields ``fn(item)`` for every item, in the order of ``items``, each as soon as it
      and all before it are done;
    - an exception raised by ``fn`` is raised by the iteration at that item, the same exception
      type and message (results before it were yielded already);
    - when the executor cannot run an item (its worker died and no other one took it over, the
      cluster went away), the iteration raises :class:`ExecutorError` naming the item; no later
      result is yielded; the executor stays usable (a later :meth:`map` runs on sound workers);
    - ``fn`` and the items are picklable: a module-level function and paths;
    - :meth:`close` may be called more than once.

    Attributes:
        workers: How many items may run at once (1 for :class:`SerialExecutor`).
        pool: A :class:`concurrent.futures.Executor` of processes that a single large file may
            use for its batches, or None.
    """

    workers: int = 1
    pool: Executor | None = None

    @abc.abstractmethod
    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item, in order (see the class docstring)."""

    @contextlib.contextmanager
    def running(self, item) -> Iterator[None]:
        """The context of work on ``item`` done in the calling process with :attr:`pool` (one large
        file's batches): a worker of the pool that dies raises :class:`ExecutorError` naming
        ``item``, as :meth:`map` would. Exceptions of the work itself pass through unchanged."""
        yield

    def close(self) -> None:
        """Release workers and connections (idempotent)."""

    def __enter__(self) -> RankExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SerialExecutor(RankExecutor):
    """Everything in the calling process, one item after the other."""

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        for item in items:
            yield fn(item)


class ProcessExecutor(RankExecutor):
    """A pool of worker processes on this machine (default: one per core).

    Workers start from a fork server that imported perfscope once, so they start in milliseconds
    and never inherit the threads of the calling process (a profiled script's, torch's).

    Args:
        workers: Number of worker processes (>= 1; default :func:`cores`).

    Raises:
        ValueError: ``workers`` < 1.
    """

    def __init__(self, workers: int | None = None) -> None:
        import multiprocessing

        self.workers = cores() if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        methods = multiprocessing.get_all_start_methods()
        self._ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(["perfscope.analysis.worker_init", "perfscope.analysis.run"])
        self.pool = self._new_pool()

    def _new_pool(self) -> Executor:
        from perfscope.analysis import worker_init

        return _pool_class()(max_workers=self.workers, mp_context=self._ctx, initializer=worker_init.worker)

    def _broken(self, item) -> ExecutorError:
        """The error for ``item`` once a worker died, after replacing the pool: a broken
        ProcessPoolExecutor refuses all later work, and this executor must stay usable."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self._new_pool()
        # The pool fails every unfinished item when one worker dies, without saying which one
        # was running in it: ``item`` is the first not analyzed, not necessarily the culprit.
        return ExecutorError(f"a worker process died (killed, or out of memory) before {item} was analyzed; "
                             "nothing was written")

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        from concurrent.futures.process import BrokenProcessPool

        items = list(items)
        futures = []
        try:
            try:
                for item in items:
                    futures.append(self.pool.submit(fn, item))
            except BrokenProcessPool:  # a worker died while the later items were submitted
                pass
            for i, item in enumerate(items):
                try:
                    if i >= len(futures):
                        raise BrokenProcessPool(item)
                    result = futures[i].result()
                except BrokenProcessPool:
                    raise self._broken(item) from None
                futures[i] = None  # the caller holds the result now; no second reference
                yield result
        finally:
            for fut in futures:
                if fut is not None:
                    fut.cancel()

    @contextlib.contextmanager
    def running(self, item) -> Iterator[None]:
        from concurrent.futures.process import BrokenProcessPool

        try:
            yield
        except BrokenProcessPool:
            raise self._broken(item) from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


_SCHEMES = ("tcp", "tls", "ucx", "ws", "wss")


def _connect(client_class, address: str, timeout_s: float | None):
    """A Dask client of the scheduler at ``address``, with one line for every way it can fail.

    The address is checked first (a malformed one would leave Dask retrying in the background);
    the connection runs in a thread that is given up after the timeout, since a service that is
    not a Dask scheduler (a web server) may accept it and never answer; a scheduler without
    workers is refused, as nothing would ever run.

    Raises:
        ExecutorError: any of those.
    """
    import threading

    import dask

    from distributed.comm import parse_address, parse_host_port

    where = f"the Dask scheduler at {address:.200}"
    try:
        scheme, loc = parse_address(address)
        if scheme not in _SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r} (tcp://HOST:PORT)")
        parse_host_port(loc)
    except (ValueError, TypeError) as e:
        raise ExecutorError(f"not an address of a Dask scheduler: {address:.200} ({_one_line(e)})") from None
    # Dask retries a refused connection until its timeout (a scheduler may be starting); left to
    # Dask's setting, a user can shorten it without a perfscope option.
    if timeout_s is None:
        timeout_s = dask.utils.parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
    got: dict = {}

    def connect() -> None:
        try:
            got["client"] = client_class(address, set_as_default=False, timeout=timeout_s)
        except BaseException as e:  # noqa: BLE001 (every failure becomes the one line below)
            got["error"] = e

    t = threading.Thread(target=connect, daemon=True, name="perfscope-dask-connect")
    t.start()
    t.join(timeout_s + 10.0)
    if "client" not in got:
        e = got.get("error")
        why = f"{type(e).__name__}: {_one_line(e)}" if e is not None else f"no answer in {timeout_s + 10:g} s"
        raise ExecutorError(f"cannot reach {where} ({why}); is it a Dask scheduler?") from None
    client = got["client"]
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except (TimeoutError, OSError) as e:
        client.close()
        raise ExecutorError(f"{where} has no workers (none joined in {timeout_s:g} s: {type(e).__name__})") from None
    return client


class DaskExecutor(RankExecutor):
    """The workers of a running Dask cluster (``dask.distributed``).

    The cluster's workers read the trace files themselves, so they must see them at the same
    paths (a shared file system). A worker that dies has its items run again on the others, as
    Dask does (``distributed.scheduler.allowed-failures`` times); past that, :class:`ExecutorError`.

    Args:
        address: The scheduler's address (``tcp://host:8786``), or an existing
            ``distributed.Client``.
        timeout_s: Seconds to wait for the scheduler to answer; None: Dask's setting
            ``distributed.comm.timeouts.connect`` (30 s unless configured, e.g. by the
            environment variable ``DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=5s``).

    Raises:
        ExecutorError: ``dask.distributed`` is not installed, or the scheduler cannot be reached.
    """

    def __init__(self, address, *, timeout_s: float | None = None) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise ExecutorError("--dask needs dask.distributed: pip install distributed (or this package's "
                                "'dask' extra)") from None
        self._own = not isinstance(address, Client)
        if self._own:
            self.client = _connect(Client, str(address), timeout_s)
        else:
            self.client = address
        # items that may run at once: every worker thread (the workers there now; 1 when none is yet)
        self.workers = max(sum(self.client.nthreads().values()), 1)

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        from distributed import KilledWorker

        items = list(items)
        futures = self.client.map(fn, items, pure=False)
        try:
            for i, item in enumerate(items):
                try:
                    result = futures[i].result()
                except KilledWorker as e:
                    raise ExecutorError(_gave_up(item, getattr(e, "allowed_failures", None))) from None
                except (OSError, CancelledError) as e:
                    if futures[i].status == "error":
                        raise  # fn's own exception (a worker that cannot read the file): as raised
                    # the scheduler went away (the client cancels every future then), or someone cancelled them
                    raise ExecutorError(f"lost the Dask cluster while analyzing {item} ({type(e).__name__}: "
                                        f"{_one_line(e)}); nothing was written") from None
                # Released as soon as the caller has it: a worker keeps a result in its memory as
                # long as a future refers to it, and a cluster's ranks may not all fit there.
                futures[i] = None
                yield result
        finally:
            left = [f for f in futures if f is not None]
            if left:
                with contextlib.suppress(Exception):  # a lost scheduler must not hide the error above
                    self.client.cancel(left)

    def close(self) -> None:
        if self._own and getattr(self, "client", None) is not None:
            # A client that lost its scheduler logs an error as it closes ("failed to reconnect"):
            # the caller has had the ExecutorError that says so, in one line.
            log = logging.getLogger("distributed.client")
            level = log.level
            log.setLevel(logging.CRITICAL)
            try:
                self.client.close()
            finally:
                log.setLevel(level)
            self.client = None


def _gave_up(item, reruns) -> str:
    """Why Dask gave up on ``item``: the workers that ran it died ``reruns`` + 1 times."""
    if not isinstance(reruns, int):
        deaths, limit = "Dask workers died while running it", "more often than distributed.scheduler.allowed-failures"
    else:
        deaths = ("the Dask worker running it died" if reruns == 0
                  else f"{reruns + 1} Dask workers died while running it")
        limit = f"distributed.scheduler.allowed-failures is {reruns}"
    return f"gave up on {item}: {deaths} (killed, or out of memory; {limit}); nothing was written"


def _one_line(e: BaseException) -> str:
    """``e``'s message on one line (Dask's span several), for the one line of an error."""
    return " ".join(str(e).split())
