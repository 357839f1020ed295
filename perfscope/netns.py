"""The network namespaces an emulated cluster (:mod:`perfscope.emulate`) makes: the ``ip`` calls,
their names (``<prefix>-<pid>-<net>-n<i>`` and ``...-sw``), and the removal of those a killed run
left behind. Only names of that form are ever deleted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

from perfscope.errors import PerfscopeError
from perfscope.process.keeper import pid_alive

PREFIX = "pscl"


class ClusterError(PerfscopeError, RuntimeError):
    """The emulated cluster cannot be built here (not root, no ``ip``/``tc``, a queueing
    discipline the kernel lacks), or a command inside it failed."""


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``ip [-n NETNS] ARGS``, its output captured.

    Raises:
        ClusterError: it failed and ``check`` is set (the command and its error in the message).
    """
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode:
        raise ClusterError(f"{' '.join(cmd)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc


def namespaces(prefix: str = PREFIX) -> list[str]:
    """The network namespaces whose names start with ``prefix-``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.split()]
    return [n for n in names if n.startswith(prefix + "-")]


def made_by(ns: str, prefix: str) -> int | None:
    """The pid of the cluster that made ``ns``, where ``ns`` is a name :class:`EmulatedCluster`
    makes (``<prefix>-<pid>-<net>-n<i>`` or ``...-sw``); None for any other name."""
    m = re.fullmatch(re.escape(prefix) + r"-([1-9]\d{0,9})-([1-9]\d{0,2})-(?:n\d{1,3}|sw)", ns)
    return int(m.group(1)) if m else None


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces a killed run left: names of the form :class:`EmulatedCluster` makes
    whose creating process (the pid in the name) is gone; any other name is left alone. Returns
    the names deleted. The pid is looked up in this process's pid namespace: clusters made from
    another container that shares the network namespaces' folder look gone from here."""
    removed = []
    for ns in namespaces(prefix):
        pid = made_by(ns, prefix)
        if pid is None or pid_alive(pid):
            continue
        kill_namespace_processes(ns)
        ip("netns", "del", ns, check=False)
        removed.append(ns)
    return removed


def kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process inside namespace ``ns``."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


# Removes a cluster whose maker died: reads the namespaces the maker made, one a line, until its
# stdin closes; unless the last line is "done", kills every process in them (twice: one may have
# forked meanwhile) and deletes them. Only subprocess and os: nothing of perfscope's is imported.
SWEEPER = """
import os, signal, subprocess, sys
lines = sys.stdin.buffer.read().decode(errors="replace").split()
if lines[-1:] != ["done"]:
    for ns in lines:
        for _ in range(2):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
"""
