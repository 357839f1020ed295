"""perfscope.process.orphan_guard: the launcher it becomes dies with the process that started it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT_S  # noqa: E402



def test_it_runs_the_module_with_its_arguments():
    r = subprocess.run([sys.executable, "-m", "perfscope.process.orphan_guard", "-m", "json.tool", "--compact"],
                       input='{"a": [1, 2]}', capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert r.returncode == 0 and r.stdout.strip() == '{"a":[1,2]}', r.stderr


def test_anything_but_a_module_is_one_usage_line():
    r = subprocess.run([sys.executable, "-m", "perfscope.process.orphan_guard", "script.py"], capture_output=True,
                       text=True, timeout=HANG_TIMEOUT_S)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "usage" in r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_launcher_dies_when_its_starter_is_killed(tmp_path):
    pid_file = tmp_path / "pid"
    # the starter: runs the guard over a module that sleeps, and is then killed with SIGKILL
    starter = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-m', 'perfscope.process.orphan_guard', '-m', 'http.server', "
        f"'--bind', '127.0.0.1', '0']);"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid));"
        "time.sleep(600)")])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the launcher never started"
            time.sleep(0.05)
        launcher = int(pid_file.read_text())
        # until the guard has become the module: its own command line names the module too, and
        # one read in the middle of the exec finds it empty
        while not _became_module(_cmdline(launcher)):
            assert time.monotonic() < deadline, f"the guard never exec'd the module ({_cmdline(launcher)!r})"
            time.sleep(0.05)
        starter.kill()
        starter.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(launcher):
            assert time.monotonic() < deadline, "the launcher outlived its starter"
            time.sleep(0.05)
    finally:
        starter.kill()


def _became_module(cmdline: bytes) -> bool:
    return b"http.server" in cmdline and b"orphan_guard" not in cmdline


def _cmdline(pid: int) -> bytes:
    """The process's command line (NUL-separated), empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def _alive(pid: int) -> bool:
    """Running, and not a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
