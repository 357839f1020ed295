"""A trial's processes: started in their own session, marked, and all stopped at the end.

Killing the trial's process group reaches the script, its DataLoader workers and anything else
that stays in the group. A process the script starts in a session of its own (``setsid``,
``start_new_session=True``) leaves the group; it still inherits the environment, so every trial
runs with ``PERFSCOPE_TRIAL=<unique token>`` and whatever still carries the token once the group is
gone is killed too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

from perfscope.collect.launch import signal_group

MARK_ENV = "PERFSCOPE_TRIAL"
# Seconds the group gets after SIGTERM before SIGKILL: torchrun needs a moment to stop its ranks.
TERM_GRACE_S = {False: 3.0, True: 10.0}


def new_mark() -> str:
    """A token identifying one trial's processes (put it in the child's environment as MARK_ENV)."""
    return uuid.uuid4().hex


def stop_trial(proc: subprocess.Popen, launched: bool, mark: str | None = None) -> None:
    """Stop a trial: SIGTERM to its group, SIGKILL after a grace period, then any marked stray.

    Args:
        proc: The trial's process, started with ``start_new_session=True``.
        launched: True when it is ``torch.distributed.run`` (a longer grace to stop its ranks).
        mark: The trial's MARK_ENV token, or None.
    """
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=TERM_GRACE_S[launched])
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid, signal.SIGKILL)  # DataLoader workers and the rest of the group
    proc.wait()
    if mark is not None:
        for pid in marked_processes(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def marked_processes(mark: str) -> list[int]:
    """PIDs of live processes whose environment holds ``MARK_ENV=mark`` (Linux /proc; [] elsewhere)."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return found
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
