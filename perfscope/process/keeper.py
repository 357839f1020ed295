"""The keeper: a small process between perfscope and a command it starts, so that whatever dies,
nothing the command started keeps running.

perfscope starts the torchrun launcher of ``profile --nproc-per-node`` and every tuner trial as::

    python -m perfscope.process.keeper --grace S -- COMMAND ARGS...

The keeper is a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a process of the command's
tree whose parent exits is re-parented to the keeper, not to init, so the keeper's descendants are
exactly the command's processes, including those that started a session of their own or cleared
their environment. The keeper ends them all:

* when the command exits: whatever it left running is killed (SIGTERM, one second, SIGKILL);
* when the keeper gets SIGTERM, SIGINT or SIGHUP: the signal goes to the command's process group,
  the command has ``--grace`` seconds to stop its own processes (torchrun stops its ranks), then
  every descendant is killed;
* when perfscope dies, even by SIGKILL: the kernel sends the keeper SIGTERM
  (``PR_SET_PDEATHSIG``), and the case above follows.

The keeper exits as the command did (the same status, or the same signal), so callers read
``returncode`` as if they had started the command themselves. Only a SIGKILL aimed at the keeper
itself defeats it; :func:`stop` therefore signals the keeper alone and waits for it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import psutil

from perfscope.text import safe

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
_STRAY_GRACE_S = 1.0  # what a stray left after the command exited gets between SIGTERM and SIGKILL
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def command(argv: Sequence[str], grace_s: float) -> list[str]:
    """``argv`` run under a keeper that gives it ``grace_s`` seconds to stop after SIGTERM.

    Args:
        argv: The command (program and arguments).
        grace_s: Seconds between the stop signal and SIGKILL of everything left.

    Returns:
        The keeper's command line (``sys.executable -m perfscope.process.keeper ...``); start it
        with ``start_new_session=True`` and stop it with :func:`stop`.
    """
    return [sys.executable, "-m", "perfscope.process.keeper", "--grace", f"{grace_s:g}",
            "--parent", str(os.getpid()), "--", *argv]


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop a keeper started from :func:`command`, and with it everything its command started.

    SIGTERM goes to the keeper alone; it stops the command within its own grace and exits. Only if
    it has not exited ``grace_s + 5`` seconds later is its whole tree killed from here.

    Args:
        proc: The keeper's process.
        grace_s: The grace given to :func:`command`.
    """
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace_s + 5.0)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
        except ProcessLookupError:
            proc.wait()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie counts: it has not been reaped)."""
    return pid > 0 and psutil.pid_exists(pid)


def descendants(pid: int) -> list[int]:
    """PIDs of the live descendants of ``pid``, parents before children ([] where ``pid`` is gone).

    Zombies (exited, not yet reaped) are left out: they hold no resources but a PID.
    """
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [child.pid for child in children if live(child)]


def live(process: psutil.Process) -> bool:
    """The process first seen as ``process`` (same PID, same start time) still runs: neither
    exited (a zombie included) nor replaced by another that took its PID."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to every live descendant of ``pid`` (not to ``pid`` itself)."""
    for child in descendants(pid):
        try:
            os.kill(child, sig)
        except (ProcessLookupError, PermissionError):
            pass


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is missing or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux
    ``PR_SET_PDEATHSIG``; nothing elsewhere). The one helper for every process perfscope starts
    that must not outlive its starter (a rank, a keeper, an analysis worker).

    ``parent`` is the pid this process's parent must have (default: its parent now). When the
    parent is already another -- the one expected died while this process started, before the
    request could take effect, and it was reparented, so the kernel's signal would never come --
    exit now (status 1).
    """
    expected = os.getppid() if parent is None else parent
    prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != expected:
        os._exit(1)


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _reap(block: bool) -> list[tuple[int, int]]:
    """Reap exited children (the command, or orphans adopted as subreaper); [(pid, status)]."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block and not reaped else os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def _wait_for(child: int | None, grace_s: float) -> None:
    """Reap until ``child`` has exited or ``grace_s`` seconds have passed."""
    deadline = time.monotonic() + grace_s
    while child is not None and time.monotonic() < deadline:
        if any(pid == child for pid, _ in _reap(block=False)):
            return
        time.sleep(0.05)


def _sweep() -> None:
    """End every descendant left: SIGTERM, a short grace, then SIGKILL until none is left."""
    me = os.getpid()
    kill_tree(me, signal.SIGTERM)
    deadline = time.monotonic() + _STRAY_GRACE_S
    while descendants(me) and time.monotonic() < deadline:
        _reap(block=False)
        time.sleep(0.05)
    for _ in range(500):  # a fork bomb cannot outrun this: each round kills every process it sees
        if not descendants(me):
            break
        kill_tree(me, signal.SIGKILL)
        time.sleep(0.01)
        _reap(block=False)
    _reap(block=False)


def _exit_like(status: int) -> None:
    """End this process as the command ended: its exit status, or death by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # a signal whose default is not death (SIGCHLD...) falls through
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The keeper's command line (:func:`command` writes it): ``--grace S --parent PID -- COMMAND...``."""
    parser = argparse.ArgumentParser(prog="perfscope.process.keeper", add_help=False)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--parent", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("missing COMMAND")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command as described in the module docstring; never returns."""
    args = _arguments(list(sys.argv[1:] if argv is None else argv))
    argv, grace_s, parent = args.command, args.grace, args.parent
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_stop)
    die_with_parent(signal.SIGTERM, parent)  # perfscope died before it was armed: start nothing
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    child = None
    try:
        try:
            # Its own process group: the keeper's signals reach it on purpose, never by accident.
            child = subprocess.Popen(argv, process_group=0)
        except OSError as e:  # the command cannot be started
            print(safe(f"perfscope: cannot run {argv[0]}: {e.strerror or e}"), file=sys.stderr)
            os._exit(127)
        while True:
            for pid, status in _reap(block=True):
                if pid == child.pid:
                    child.returncode = status  # reaped here; Popen must not wait for it again
                    _sweep()
                    _exit_like(status)
    except _Stop as stop_:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # one orderly shutdown; more signals must not cut it short
        if child is not None:
            try:
                os.killpg(child.pid, stop_.signum)
            except (ProcessLookupError, PermissionError):
                pass
        _wait_for(None if child is None or child.returncode is not None else child.pid, grace_s)
        _sweep()
        os._exit(128 + stop_.signum)


if __name__ == "__main__":
    main()
