"""Where the per-file work of an analysis runs: here, on this machine's cores, or on a Dask cluster.

An executor is passed to :func:`perfscope.analysis.run.analyze_files` as an instance of
:class:`RankExecutor`; every implementation passes the same contract tests
(``tests/test_executors.py``). The work given to it is one file each (read, decode, find the
steps, measure them); the reduction of the per-file results into one summary always happens in
the calling process, so every executor gives the same summary.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor

from perfscope.errors import PerfscopeError


class ExecutorError(PerfscopeError):
    """The executor itself failed (a worker died and its work could not be done elsewhere, the
    cluster cannot be reached): the analysis is incomplete and no summary is written."""


def cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` set)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


class RankExecutor:
    """Runs one function over a list of items.

    Contract (every implementation):

    - :meth:`map` yields ``fn(item)`` for every item, in the order of ``items``, each as soon as it
      and all before it are done;
    - an exception raised by ``fn`` is raised by the iteration at that item, the same exception
      type and message (results before it were yielded already);
    - when the executor cannot run an item (its worker died and no other one took it over, the
      cluster went away), the iteration raises :class:`ExecutorError` naming the item; no later
      result is yielded;
    - ``fn`` and the items are picklable: a module-level function and paths.

    Attributes:
        workers: How many items may run at once (1 for :class:`SerialExecutor`).
        pool: A :class:`concurrent.futures.Executor` of processes that a single large file may
            use for its batches, or None.
    """

    workers: int = 1
    pool: Executor | None = None

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        raise NotImplementedError

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
        from concurrent.futures import ProcessPoolExecutor

        self.workers = cores() if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["perfscope.analysis.run"])
        self.pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        from concurrent.futures.process import BrokenProcessPool

        items = list(items)
        futures = [self.pool.submit(fn, item) for item in items]
        try:
            for item, fut in zip(items, futures):
                try:
                    yield fut.result()
                except BrokenProcessPool:
                    raise ExecutorError(f"a worker process died while analyzing {item} (killed, or out of memory); "
                                        "nothing was written") from None
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


class DaskExecutor(RankExecutor):
    """The workers of a running Dask cluster (``dask.distributed``).

    The cluster's workers read the trace files themselves, so they must see them at the same
    paths (a shared file system). A worker that dies has its items run again on the others, as
    Dask does (``distributed.scheduler.allowed-failures`` times); past that, :class:`ExecutorError`.

    Args:
        address: The scheduler's address (``tcp://host:8786``), or an existing
            ``distributed.Client``.
        timeout_s: Seconds to wait for the scheduler (seconds, as Dask's ``timeout``).

    Raises:
        ExecutorError: ``dask.distributed`` is not installed, or the scheduler cannot be reached.
    """

    def __init__(self, address, *, timeout_s: float = 30.0) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise ExecutorError("--dask needs dask.distributed: pip install 'perfscope-torch[dask]'") from None
        self._own = not isinstance(address, Client)
        if self._own:
            try:
                self.client = Client(address, timeout=timeout_s, set_as_default=False)
            except (OSError, TimeoutError, ValueError, TypeError) as e:
                raise ExecutorError(f"cannot reach the Dask scheduler at {address!s:.200} ({type(e).__name__}: {e})") from None
        else:
            self.client = address
        self.workers = max(len(self.client.scheduler_info().get("workers", {})), 1)

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        from distributed import KilledWorker

        items = list(items)
        futures = self.client.map(fn, items, pure=False)
        try:
            for item, fut in zip(items, futures):
                try:
                    yield fut.result()
                except KilledWorker:
                    raise ExecutorError(f"Dask workers died while analyzing {item} (each one that tried it); "
                                        "nothing was written") from None
                except (OSError, TimeoutError) as e:  # the scheduler went away
                    raise ExecutorError(f"lost the Dask cluster while analyzing {item} ({type(e).__name__}: {e}); "
                                        "nothing was written") from None
        finally:
            self.client.cancel(futures)

    def close(self) -> None:
        if self._own and getattr(self, "client", None) is not None:
            self.client.close()
            self.client = None
