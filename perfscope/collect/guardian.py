"""The guardian: what a script started dies with perfscope, also when perfscope is killed outright.

``perfscope profile`` runs the script in its own process, so no keeper (:mod:`perfscope.process.keeper`)
can sit between them. Instead, while the script runs, a small guardian process watches::

    python -m perfscope.collect.guardian PID MARK

It learns every process descended from PID (psutil's view of the process table, each
:data:`SCAN_INTERVAL_S`) and remembers each by its PID and start time, also after it leaves the
tree (an orphan is re-parented to init). perfscope holds the write end of the guardian's stdin:

* perfscope says ``done`` and closes it when the script ended on its own: the guardian exits and
  kills nothing (what the script started and left running is the script's business, as under
  ``python SCRIPT``);
* perfscope says ``stop`` when it ended the script early (after the profiled window): the script's
  own clean-up did not run, so the guardian ends what it left running (SIGTERM, then SIGKILL after
  :data:`STOP_GRACE_S`), DataLoader workers and multiprocessing's helpers aside;
* the pipe closes without ``done``, or perfscope's process is gone: perfscope died (SIGKILL, the OOM killer, a crash). The guardian
  kills every process it has seen that is still alive with the same start time, and every process
  whose environment still carries ``PERFSCOPE_RUN=MARK`` (set for the script's run, so children
  inherit it), then exits.

While the script runs, perfscope's process is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
an orphan of the script's tree stays in it until the next scan. What the guardian cannot see: a
process started in the last scan interval before perfscope died that also cleared its
environment. An orphan that exits during the run stays a zombie of perfscope's process (it holds
a PID, nothing else) until perfscope exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psutil

from perfscope.process.keeper import PR_SET_CHILD_SUBREAPER, live, prctl

MARK_ENV = "PERFSCOPE_RUN"
SCAN_INTERVAL_S = 0.25
STOP_GRACE_S = 2.0  # what a process left by a cut script gets between SIGTERM and SIGKILL


def _process(pid: int) -> psutil.Process | None:
    """The live process ``pid`` (its identity: PID and start time), or None."""
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return None
    return process if live(process) else None


def _marked(mark: str) -> list[psutil.Process]:
    """The processes whose environment carries ``PERFSCOPE_RUN=MARK`` (this one aside)."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(MARK_ENV) == mark:
                found.append(process)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return found


def _signal(process: psutil.Process, sig: int = signal.SIGKILL) -> None:
    """``sig`` to the process, unless it is gone (psutil checks that its PID still names it)."""
    try:
        process.send_signal(sig)
    except psutil.Error:
        pass


def _cmdline(process: psutil.Process | None) -> list[str] | None:
    try:
        return process.cmdline() if process is not None else None
    except psutil.Error:
        return None


def _end_left_over(script: psutil.Process | None, seen: dict[int, psutil.Process]) -> None:
    """perfscope cut the script short: end what it started and left running (SIGTERM, then SIGKILL
    after :data:`STOP_GRACE_S`), as its own clean-up would have. Forks of perfscope's process
    (DataLoader workers: they end with their iterator) and multiprocessing's helpers (its resource
    tracker and fork server, which perfscope's process still talks to) are left alone."""
    ours = _cmdline(script)
    targets = []
    for child in seen.values():
        cmd = _cmdline(child) if live(child) else None
        if cmd is None or cmd == ours or any("multiprocessing" in part for part in cmd):
            continue
        targets.append(child)
        _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(map(live, targets)):
        time.sleep(0.05)
    for child in targets:
        if live(child):
            _signal(child)


def watch(pid: int, mark: str) -> int:
    """The guardian's loop (see the module docstring); returns its exit status."""
    seen: dict[int, psutil.Process] = {}
    me = os.getpid()
    script = _process(pid)
    said = b""

    groups: set[int] = set()
    try:
        own_group = os.getpgid(pid)
    except OSError:
        return 0

    def scan() -> None:
        try:
            children = script.children(recursive=True) if script is not None else []
        except psutil.Error:
            return
        for child in children:
            if child.pid != me and child.pid not in seen and live(child):
                seen[child.pid] = child
                try:
                    groups.add(os.getpgid(child.pid))
                except OSError:
                    pass

    # The pipe alone does not tell: a child the script forked holds a copy of its write end.
    while script is not None and live(script):
        scan()
        ready, _, _ = select.select([sys.stdin.buffer], [], [], SCAN_INTERVAL_S)
        if ready:
            chunk = os.read(sys.stdin.fileno(), 64)
            said += chunk
            # The word ends the watch, not the end of the pipe: forks of perfscope's process
            # (DataLoader workers) hold copies of its write end and may outlive the run.
            if not chunk or b"\n" in said:
                break
    if said.strip() == b"done":
        return 0
    if said.strip() == b"stop":
        scan()
        _end_left_over(script, seen)
        return 0
    for child in seen.values():
        if live(child):
            _signal(child)
    # A process that forks again and again outruns any scan, but its children stay in its process
    # group: kill the groups the script's processes made (never perfscope's own, which holds the shell's job).
    for group in groups - {own_group}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for child in _marked(mark):
        _signal(child)
    return 0


class Guard:
    """What :func:`guarded` yields: set :attr:`script_cut` when perfscope ended the script early."""

    def __init__(self) -> None:
        self.script_cut = False


@contextlib.contextmanager
def guarded() -> Iterator[Guard]:
    """Run the block (the script) under a guardian; nothing happens where ``/proc`` is missing.

    Sets ``$PERFSCOPE_RUN`` for the block, so the script's children carry the mark. If the block
    sets the yielded guard's ``script_cut``, what the script left running is ended at the block's
    end (see :func:`_end_left_over`).
    """
    guard = Guard()
    if not os.path.isdir("/proc"):
        yield guard
        return
    mark = uuid.uuid4().hex
    try:
        guardian = subprocess.Popen([sys.executable, "-m", "perfscope.collect.guardian", str(os.getpid()), mark],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        yield guard  # best effort: a run without a guardian is still a run
        return
    previous = os.environ.get(MARK_ENV)
    os.environ[MARK_ENV] = mark
    # A subreaper keeps the script's orphans (a daemon's double fork) in this process's tree, where
    # the next scan finds them, instead of handing them to init at once.
    subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield guard
    finally:
        if subreaper:
            prctl(PR_SET_CHILD_SUBREAPER, 0)
        if previous is None:
            os.environ.pop(MARK_ENV, None)
        else:
            os.environ[MARK_ENV] = previous
        try:
            guardian.stdin.write(b"stop\n" if guard.script_cut else b"done\n")
            guardian.stdin.close()
        except OSError:
            pass
        guardian.wait()


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1]), sys.argv[2]))
