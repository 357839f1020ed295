"""The rank-executor contract (:class:`perfscope.analysis.executors.RankExecutor`): results in
item order and as soon as each is done, the function's own exceptions at their item, a worker
that dies as :class:`~perfscope.analysis.executors.ExecutorError` naming the item (executors whose
function runs in other processes), ``running`` turning a dead pool into that error, and ``close``
more than once.

The functions handed to an executor are defined here at module level, so that worker processes
unpickle them by name; a gate is a file, which every worker sees.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from perfscope.analysis.executors import ExecutorError, RankExecutor
from perfscope.errors import TraceFormatError
from perfscope.testing import ContractError, expect

GATE_WAIT_S = 15.0  # seconds a gated item waits for its gate before it gives up


class Boom(Exception):
    """An exception class of the caller's own, which must cross to the caller as itself."""


def square(x):
    """``x * x``."""
    return x * x


def later_ones_first(i):
    """``i * i``, the last items finishing first: an executor yielding in completion order shows."""
    time.sleep(0.02 * (5 - i))
    return i * i


def gated(arg):
    """Item ``(0, gate)`` returns at once; ``(1, gate)`` only once the file ``gate`` exists."""
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


def raise_at_2(arg):
    """``i``, except that item 2 raises the exception named ``kind`` (:data:`EXCEPTIONS`)."""
    i, kind = arg
    if i == 2:
        raise EXCEPTIONS[kind]()
    return i


def die_on_marked(item):
    """Kills the worker process that runs an item marked ``die:`` (as the OOM killer would)."""
    if item.startswith("die:"):
        os._exit(1)
    return item.upper()


def check_order(executor: RankExecutor) -> None:
    """Results come in item order; items may be any iterable, or none."""
    expect(list(executor.map(later_ones_first, range(6))) == [i * i for i in range(6)], "results out of item order")
    expect(list(executor.map(square, (x for x in (3, 1, 2)))) == [9, 1, 4], "a generator of items went wrong")
    expect(list(executor.map(square, [])) == [], "no items gave results")


def check_streaming(executor: RankExecutor) -> None:
    """A result is yielded before later items are done (item 1 waits for a gate opened only once
    result 0 is here: an executor that collects every result first makes it give up)."""
    with tempfile.TemporaryDirectory() as d:
        gate = Path(d) / "gate"
        try:
            it = executor.map(gated, [(0, str(gate)), (1, str(gate))])
            expect(next(it) == 0, "first result wrong")
            gate.touch()
            expect(next(it) == 1, "second result wrong")
        except TimeoutError as e:
            raise ContractError(str(e)) from None
        expect(next(it, None) is None, "a result after the last item")


def check_exceptions(executor: RankExecutor) -> None:
    """An exception of the function reaches the caller at its item, as itself (not a subclass or a
    wrapper), after the results before it and with none after."""
    for kind, make in EXCEPTIONS.items():
        expected = make()
        got = []
        it = executor.map(raise_at_2, [(i, kind) for i in range(5)])
        try:
            for r in it:
                got.append(r)
        except Exception as e:  # noqa: BLE001 - the check is on what arrives
            expect(type(e) is type(expected) and str(e) == str(expected),
                   f"{kind}: arrived as {type(e).__name__}: {e}")
        else:
            raise ContractError(f"{kind}: the function's exception never reached the caller")
        expect(got == [0, 1], f"{kind}: results around the exception were {got}, not [0, 1]")
        expect(next(it, None) is None, f"{kind}: a result after the exception")


def check_dead_worker(executor: RankExecutor) -> None:
    """(Executors whose function runs in other processes.) A worker that dies is an
    ExecutorError naming the first item not yielded; no result after it; the executor then works
    again on sound workers."""
    items = ["rank0.json", "rank1.json", "die:rank2.json", "rank3.json"]
    got = []
    it = executor.map(die_on_marked, items)
    try:
        for r in it:
            got.append(r)
    except ExecutorError as e:
        k = len(got)
        expect(k <= 2 and got == [s.upper() for s in items[:k]], f"results before the dead worker: {got}")
        expect(items[k] in str(e), f"the error does not name {items[k]}: {e}")
    else:
        raise ContractError("a dead worker was not an ExecutorError")
    expect(next(it, None) is None, "a result after the dead worker")
    expect(list(executor.map(square, [1, 2, 3])) == [1, 4, 9], "the executor does not work after a dead worker")


def check_running(executor: RankExecutor) -> None:
    """``running(name)`` lets the work's own errors through unchanged and turns a dead pool
    worker into an ExecutorError naming ``name``; the pool is sound again afterwards."""
    try:
        with executor.running("big.json"):
            raise KeyError("a key")
    except KeyError:
        pass
    else:
        raise ContractError("running() swallowed the work's own error")
    if executor.pool is None:
        return
    try:
        with executor.running("big.json"):
            executor.pool.submit(os._exit, 1).result()
    except ExecutorError as e:
        expect("big.json" in str(e), f"the error does not name big.json: {e}")
    else:
        raise ContractError("a dead pool worker was not an ExecutorError")
    expect(executor.pool.submit(pow, 2, 10).result() == 1024, "the pool is not sound again")
    expect(list(executor.map(square, [4, 5])) == [16, 25], "the executor does not work again")


def check_close(executor: RankExecutor) -> None:
    """Work, then ``close`` twice."""
    expect(list(executor.map(square, [2])) == [4], "map went wrong")
    executor.close()
    executor.close()
