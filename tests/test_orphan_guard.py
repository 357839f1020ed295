"""perfscope.process.orphan_guard: the launcher it becomes dies with the process that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest



def test_it_runs_the_module_with_its_arguments():
    r = subprocess.run([sys.executable, "-m", "perfscope.process.orphan_guard", "-m", "json.tool", "--compact"],
                       input='{"a": [1, 2]}', capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == '{"a":[1,2]}', r.stderr


def test_anything_but_a_module_is_one_usage_line():
    r = subprocess.run([sys.executable, "-m", "perfscope.process.orphan_guard", "script.py"], capture_output=True,
                       text=True, timeout=60)
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
        time.sleep(1.0)  # past the guard's request, into the exec'd module
        os.kill(launcher, 0)  # running
        starter.kill()
        starter.wait(timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                os.kill(launcher, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{launcher}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":  # a zombie: dead, waiting to be reaped
                    break
            assert time.monotonic() < deadline, "the launcher outlived its starter"
            time.sleep(0.05)
    finally:
        starter.kill()
