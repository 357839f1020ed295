"""Helpers of the tuner tests: processes still running a script, and running `perfscope tune`."""

from __future__ import annotations

import os
import signal
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


def reap(path: str | os.PathLike, timeout_s: float = 15.0) -> list[int]:
    """PIDs still running ``path`` after ``timeout_s`` (see :func:`wait_no_processes`), killed so that
    a failing test leaves nothing behind either (only processes of the test's private script copy)."""
    left = wait_no_processes(path, timeout_s)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return left


def tune_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "perfscope", "tune", "--no-progress", *args]


def run_tune(*args: str, timeout: float = 600, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``perfscope tune ARGS`` in a child process; output captured as text."""
    return run_perfscope("tune", "--no-progress", *args, timeout=timeout, cwd=cwd)


def run_perfscope(*args: str, timeout: float = 600, cwd: str | os.PathLike | None = None,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``perfscope ARGS`` in a child process (``env``: variables added to its environment);
    output captured as text."""
    return subprocess.run([sys.executable, "-m", "perfscope", *args], check=False, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env={**tune_env(), **(env or {})})


def copy_script(src: str | os.PathLike, folder: Path) -> Path:
    """A private copy of an example or test script (so its processes can be told apart)."""
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / Path(src).name
    dst.write_text((ROOT / src).read_text())
    return dst


def tune_env() -> dict[str, str]:
    """The environment of a ``perfscope`` child: this checkout importable, no inherited config, and
    one OpenMP thread per process. On a small machine shared with other jobs a 2-thread OpenMP
    region waits for a descheduled thread at every operator: step times then swing by hundreds of
    milliseconds and no speed-up can be proven; with one thread they stay within a few percent."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("PERFSCOPE_CONFIG", None)
    return env


def start_tune(*args: str, log_dir: Path, cwd: str | os.PathLike | None = None) -> subprocess.Popen:
    """``perfscope tune ARGS`` started in the background; its stdout and stderr go to
    ``log_dir/stdout.txt`` and ``log_dir/stderr.txt`` (files: a pipe nobody reads would fill)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "stdout.txt", "w") as out, open(log_dir / "stderr.txt", "w") as err:
        return subprocess.Popen(tune_command(*args), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                text=True, cwd=cwd or ROOT, env=tune_env(), preexec_fn=_ctrl_c_works)


def _ctrl_c_works() -> None:
    """In the child before exec: SIGINT's default action, whatever the test runner was started
    with (a shell's background job ignores SIGINT, and Python keeps an ignored SIGINT ignored, so
    the Ctrl-C tests would see a tune that cannot be interrupted)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def logs(log_dir: Path) -> tuple[str, str]:
    """(stdout, stderr) of a command started with :func:`start_tune`."""
    return (log_dir / "stdout.txt").read_text(), (log_dir / "stderr.txt").read_text()


def wait_until(predicate, timeout_s: float, *, proc: subprocess.Popen | None = None, poll_s: float = 0.2) -> bool:
    """Poll ``predicate()`` until it is true (True), ``timeout_s`` passes or ``proc`` exits (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return bool(predicate())
        time.sleep(poll_s)
    return bool(predicate())


def read_record(out: Path) -> dict:
    """``OUT/tune.json``."""
    import json

    return json.loads((out / "tune.json").read_text())


def stderr_lines(text: str) -> list[str]:
    """The non-empty lines of a command's stderr."""
    return [line for line in text.splitlines() if line.strip()]
