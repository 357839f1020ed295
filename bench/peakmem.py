"""Helper of the benchmarks: the peak memory of a command and of the processes it starts.

Peak memory (:func:`measure`): the command runs as the child of a small wrapper process; its largest process's peak RSS
comes from the kernel (``wait4``), and the total of its whole process tree (worker processes
included) is sampled from ``/proc`` every ``interval`` seconds (RSS and PSS, the proportional
share that counts a page shared between processes once).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from perfscope.process.keeper import descendants

MiB = 1 << 20
GiB = 1 << 30

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_pss(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
    except OSError:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                rss = pss = int(f.read().split()[1]) * _PAGE
        except OSError:
            pass
    return rss, pss


@dataclass
class Measured:
    """One run of a command.

    Attributes:
        rc: Exit status (negative: killed by that signal).
        wall_s: Wall time from start to exit.
        max_rss: Peak RSS of its largest process (the kernel's figure for the command and the
            processes it waited for; 0 when the run was killed).
        tree_rss / tree_pss: Peak total RSS / PSS of the command and all its processes, sampled.
        processes: Most processes seen at once.
        stopped: Why the run was stopped (memory limit), else None.
        output: Its stdout and stderr.
    """

    rc: int
    wall_s: float
    max_rss: int
    tree_rss: int
    tree_pss: int
    processes: int
    stopped: str | None
    output: str

    @property
    def peak(self) -> int:
        """The peak to judge: the whole tree's sampled RSS total, or the kernel's figure for the
        largest process when that is higher (a short peak between two samples)."""
        return max(self.tree_rss, self.max_rss)


# Runs the command as its child and writes its exit status, wall time and the kernel's peak RSS of
# it and the processes it waited for. The wrapper is a small process of its own: a child's peak
# counts what it was forked from, so the command must not be forked from a large benchmark.
_WRAPPER = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    f.write("%d %.6f %d" % (rc, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
"""


def measure(cmd: list[str], *, env: dict | None = None, cwd: str | Path | None = None, interval: float = 0.05,
            mem_limit: int | None = None) -> Measured:
    """Run ``cmd`` to its end and measure its time and peak memory (module docstring). With
    ``mem_limit``, the command's process group is killed when its processes hold more RSS than that."""
    import sys

    with tempfile.TemporaryDirectory(prefix="measure-") as d:
        result, log = Path(d) / "result", Path(d) / "output"
        with open(log, "wb") as out:
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-c", _WRAPPER, str(result), *cmd], stdout=out,
                                 stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
            peak = {"rss": 0, "pss": 0, "n": 0, "stopped": None}
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    pids = descendants(p.pid)  # the command's processes, not the wrapper
                    rss = pss = 0
                    for q in pids:
                        r, s = _rss_pss(q)
                        rss, pss = rss + r, pss + s
                    peak["rss"], peak["pss"] = max(peak["rss"], rss), max(peak["pss"], pss)
                    peak["n"] = max(peak["n"], len(pids))
                    if mem_limit is not None and rss > mem_limit and peak["stopped"] is None:
                        peak["stopped"] = (f"stopped by the benchmark after {time.perf_counter() - t0:.0f} s: its "
                                           f"processes held {rss / GiB:.2f} GiB, over the limit of {mem_limit / GiB:.2f} GiB")
                        try:
                            os.killpg(p.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    done.wait(interval)

            th = threading.Thread(target=sample, daemon=True)
            th.start()
            _, status, _usage = os.wait4(p.pid, 0)
            wall = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
            done.set()
            th.join()
            try:  # what the command left running (its workers) goes with it
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        text = log.read_bytes().decode(errors="replace")
        rc, max_rss = p.returncode, 0
        if result.is_file():
            rc_s, wall_s, rss_s = result.read_text().split()
            rc, wall, max_rss = int(rc_s), float(wall_s), int(rss_s) * 1024
    return Measured(rc, wall, max_rss, peak["rss"], peak["pss"], peak["n"], peak["stopped"], text)
