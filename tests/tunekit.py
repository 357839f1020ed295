"""Helpers of the tuner tests: processes still running a script, and running `perfscope tune`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def processes_running(path: str | os.PathLike) -> list[int]:
    """PIDs whose command line mentions ``path`` (a script copied to a unique folder per test)."""
    needle = str(path).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_no_processes(path: str | os.PathLike, timeout_s: float = 10.0) -> list[int]:
    """PIDs still running ``path`` after waiting up to ``timeout_s`` for them to go."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_running(path)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def tune_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "perfscope", "tune", "--no-progress", *args]


def run_tune(*args: str, timeout: float = 600, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``perfscope tune ARGS`` in a child process; output captured as text."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(tune_command(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or ROOT, env=env)


def copy_script(src: str | os.PathLike, folder: Path) -> Path:
    """A private copy of an example or test script (so its processes can be told apart)."""
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / Path(src).name
    dst.write_text((ROOT / src).read_text())
    return dst
