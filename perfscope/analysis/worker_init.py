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

from perfscope.collect.keeper import PR_SET_PDEATHSIG, pid_alive, prctl


def die_with_parent(caller: int | None = None) -> None:
    """SIGKILL this process when its parent exits (Linux; nothing elsewhere). When the parent, or
    the ``caller`` (the process whose work this is), is already gone -- it died while this one
    started, before the request could take effect -- exit now."""
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent or (caller is not None and not pid_alive(caller)):
        os._exit(1)


def worker() -> None:
    """The pool's initializer: die with the fork server (and never outlive the caller), leave
    Ctrl-C to the caller."""
    import multiprocessing

    caller = multiprocessing.parent_process()
    die_with_parent(caller.pid if caller is not None else None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_STARTER = os.environ.get("PERFSCOPE_FORKSERVER", "")
if __name__ != "__main__" and _STARTER.isdigit():
    # The fork server, importing this as a preload module; its starter's pid catches a starter
    # killed while this server was still starting (it is then reparented, and the kernel's death
    # signal would never come).
    die_with_parent()
    if os.getppid() != int(_STARTER):
        os._exit(1)
