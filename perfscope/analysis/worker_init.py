"""Set-up of the processes an analysis starts: they end with the process that started them.

Imported by the fork server when it starts (its preload list, :class:`~perfscope.analysis.executors.ProcessExecutor`)
and run by every worker (the pool's initializer): each asks the kernel for SIGKILL when its parent
dies (``PR_SET_PDEATHSIG``), so a ``perfscope analyze`` killed outright (a batch system's timeout,
``kill PID``) leaves no fork server or worker behind. Workers ignore SIGINT: a Ctrl-C reaches the
whole process group, and the calling process alone answers it (its own one line; no worker
tracebacks). Nothing here runs in the calling process.
"""

from __future__ import annotations

import os
import signal

from perfscope.process.keeper import die_with_parent


def worker() -> None:
    """The pool's initializer: die with the process that started this worker, leave Ctrl-C to
    the caller.

    A worker forked from a process that had imported this module (the fork server, which
    preloads it) expects that process as its parent; a spawned one, the caller.
    """
    import multiprocessing

    caller = multiprocessing.parent_process()
    if _IMPORTED_BY != os.getpid():
        die_with_parent(parent=_IMPORTED_BY)
    else:
        die_with_parent(parent=caller.pid if caller is not None else None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# Inherited by forked children: a worker whose fork server died before the worker's own request
# would read its new parent from getppid(), so it compares with this instead.
_IMPORTED_BY = os.getpid()
_STARTER = os.environ.get("PERFSCOPE_FORKSERVER", "")
if __name__ != "__main__" and _STARTER.isdigit():
    # The fork server, importing this as a preload module (and a spawned worker, whose parent is
    # the starter too): the starter's pid catches a starter killed while it was still starting.
    die_with_parent(parent=int(_STARTER))
