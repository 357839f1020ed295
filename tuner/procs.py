"""A trial's processes: started under a keeper, marked, and all stopped at the end.

Every trial runs under :mod:`perfscope.process.keeper`: a child subreaper that ends every process the
trial started -- also one that left the trial's process group and session and cleared its
environment -- when the trial is stopped or exits, and also when the tuner itself is killed
outright (the kernel tells the keeper). As a second line, every trial runs with
``PERFSCOPE_TRIAL=<unique token>`` and whatever still carries the token once the keeper is done is
killed too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

from perfscope.process import keeper
from perfscope.process.group import signal_group

MARK_ENV = "PERFSCOPE_TRIAL"
# Seconds the trial gets after SIGTERM before SIGKILL: torchrun needs a moment to stop its ranks.
TERM_GRACE_S = {False: 3.0, True: 10.0}


def new_mark() -> str:
    """A token identifying one trial's processes (put it in the child's environment as MARK_ENV)."""
    return uuid.uuid4().hex


def trial_command(command: list[str], launched: bool) -> list[str]:
    """``command`` run under a keeper; start it with ``start_new_session=True``.

    Args:
        command: The trial's measurement command.
        launched: True when it is ``torch.distributed.run`` (a longer grace to stop its ranks).
    """
    return keeper.command(command, TERM_GRACE_S[launched])


def stop_trial(proc: subprocess.Popen, launched: bool, mark: str | None = None) -> None:
    """Stop a trial started with :func:`trial_command`, and everything it started.

    Its keeper gets SIGTERM and stops the trial (SIGTERM to the trial's group, SIGKILL to every
    descendant after the grace); then the keeper's group and any marked stray are killed.

    Args:
        proc: The keeper's process.
        launched: As given to :func:`trial_command`.
        mark: The trial's MARK_ENV token, or None.
    """
    keeper.stop(proc, TERM_GRACE_S[launched])
    signal_group(proc.pid, signal.SIGKILL)  # a command started without a keeper, or a keeper cut short
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
