"""The guardian: what a script started dies with perfscope, also when perfscope is killed outright.

``perfscope profile`` runs the script in its own process, so no keeper (:mod:`perfscope.process.keeper`)
can sit between them. Instead, while the script runs, a small guardian process watches::

    python -m perfscope.collect.guardian PID MARK

It learns every process descended from PID (a scan of ``/proc`` each
:data:`SCAN_INTERVAL_S`) and remembers each by its start time, also after it leaves the tree (an
orphan is re-parented to init). perfscope holds the write end of the guardian's stdin:

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

from perfscope.process.keeper import PR_SET_CHILD_SUBREAPER, prctl

MARK_ENV = "PERFSCOPE_RUN"
SCAN_INTERVAL_S = 0.25
STOP_GRACE_S = 2.0  # what a process left by a cut script gets between SIGTERM and SIGKILL


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, ``/proc/PID/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[0] != b"Z" else None


def _marked(mark: str) -> list[int]:
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                continue
    return found


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def _end_left_over(pid: int, seen: dict[int, int]) -> None:
    """perfscope cut the script short: end what it started and left running (SIGTERM, then SIGKILL
    after :data:`STOP_GRACE_S`), as its own clean-up would have. Forks of perfscope's process
    (DataLoader workers: they end with their iterator) and multiprocessing's helpers (its resource
    tracker and fork server, which perfscope's process still talks to) are left alone."""
    ours = _cmdline(pid)
    live = [(child, started) for child, started in seen.items() if _start_time(child) == started]
    targets = []
    for child, started in live:
        cmd = _cmdline(child) or b""
        if cmd == ours or b"multiprocessing" in cmd:
            continue
        targets.append((child, started))
        _kill(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(_start_time(c) == s for c, s in targets):
        time.sleep(0.05)
    for child, started in targets:
        if _start_time(child) == started:
            _kill(child)


def watch(pid: int, mark: str) -> int:
    """The guardian's loop (see the module docstring); returns its exit status."""
    from perfscope.process.keeper import descendants

    seen: dict[int, int] = {}
    me = os.getpid()
    born = _start_time(pid)
    said = b""

    groups: set[int] = set()
    try:
        own_group = os.getpgid(pid)
    except OSError:
        return 0

    def scan() -> None:
        for child in descendants(pid):
            if child != me and child not in seen:
                started = _start_time(child)
                if started is not None:
                    seen[child] = started
                    try:
                        groups.add(os.getpgid(child))
                    except OSError:
                        pass

    # The pipe alone does not tell: a child the script forked holds a copy of its write end.
    while born is not None and _start_time(pid) == born:
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
        _end_left_over(pid, seen)
        return 0
    for child, started in seen.items():
        if _start_time(child) == started:
            _kill(child)
    # A process that forks again and again outruns any scan, but its children stay in its process
    # group: kill the groups the script's processes made (never perfscope's own, which holds the shell's job).
    for group in groups - {own_group}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for child in _marked(mark):
        _kill(child)
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
