"""Nothing perfscope starts outlives it: the keeper (launcher and trials) and the guardian (a script
run in perfscope's own process), whatever dies and however."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from perfscope.process import keeper
from conftest import HANG_TIMEOUT_S  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process control (/proc, prctl)")

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

# A grandchild the hostile way: its own session, an empty environment, orphaned at once (double
# fork), so neither a process group, nor an environment mark, nor the parent chain leads to it.
ESCAPER = """
import subprocess, sys, time
subprocess.Popen(["/bin/sh", "-c", "setsid {sleep} {tag} & exit 0"], env={{}}).wait()
open({ready!r}, "w").close()
{then}
"""


def _sleeper(tmp_path: pathlib.Path) -> tuple[str, str]:
    """A copy of sleep with a name unique to this test, so its processes can be counted."""
    tag = str(10_000 + os.getpid() % 50_000)
    path = tmp_path / f"sleep-{tag}"
    path.symlink_to("/bin/sleep")
    return str(path), tag


def _running(needle: str) -> list[int]:
    found = []
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != b"Z":
            found.append(int(proc.name))
    return found


def _seen(needle: str, within_s: float = 10.0) -> bool:
    """Whether a scan of /proc finds ``needle`` within ``within_s``: one scan can miss a chain of
    processes that each live for less time than the scan takes on a busy machine."""
    deadline = time.monotonic() + within_s
    while not _running(needle):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _gone(needle: str, within_s: float = 15.0, quiet_scans: int = 1) -> bool:
    """Whether ``needle`` is gone: ``quiet_scans`` scans in a row find nothing (several for a
    re-forking chain, which one scan can miss) before ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    quiet = 0
    while quiet < quiet_scans and time.monotonic() < deadline:
        quiet = 0 if _running(needle) else quiet + 1
        if quiet < quiet_scans:
            time.sleep(0.05 if quiet else 0.1)
    left = _running(needle)
    for pid in left:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    return not left


def _wait_for(path: pathlib.Path, proc: subprocess.Popen, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert proc.poll() is None, f"exited early with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.05)


def test_keeper_ends_an_escaped_grandchild_when_its_parent_is_killed(tmp_path):
    sleep, tag = _sleeper(tmp_path)
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER.format(sleep=sleep, tag=tag, ready=str(tmp_path / "ready"), then="time.sleep(1000)"))
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys
        from perfscope.process import keeper
        subprocess.Popen(keeper.command([sys.executable, {str(script)!r}], 3), start_new_session=True).wait()
        """)], env=ENV)
    try:
        _wait_for(tmp_path / "ready", parent)
        assert _running(f"{sleep} {tag}")
        parent.kill()  # SIGKILL: nothing of perfscope's runs after it
        parent.wait()
        assert _gone(f"{sleep} {tag}"), "the escaped grandchild survived its parent's SIGKILL"
        assert _gone(str(script))
    finally:
        parent.kill()


def test_keeper_sweeps_what_the_command_left_and_passes_its_status_on(tmp_path):
    sleep, tag = _sleeper(tmp_path)
    script = tmp_path / "leaver.py"
    script.write_text(ESCAPER.format(sleep=sleep, tag=tag, ready=str(tmp_path / "ready"), then="sys.exit(7)"))
    proc = subprocess.run(keeper.command([sys.executable, str(script)], 3), env=ENV, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == 7
    assert _gone(f"{sleep} {tag}", within_s=5), "a process the command left running survived it"


def test_keeper_reports_death_by_a_signal_as_the_command_died(tmp_path):
    proc = subprocess.run(keeper.command([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                                         3), env=ENV, timeout=HANG_TIMEOUT_S)
    assert proc.returncode == -signal.SIGTERM


def test_keeper_stop_ends_a_command_that_ignores_sigterm_after_its_grace(tmp_path):
    sleep, tag = _sleeper(tmp_path)
    script = tmp_path / "stubborn.py"
    script.write_text(ESCAPER.format(sleep=sleep, tag=tag, ready=str(tmp_path / "ready"),
                                     then="import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(1000)"))
    proc = subprocess.Popen(keeper.command([sys.executable, str(script)], 1), env=ENV, start_new_session=True)
    try:
        _wait_for(tmp_path / "ready", proc)
        started = time.monotonic()
        keeper.stop(proc, 1)
        assert time.monotonic() - started < 10
        assert _gone(str(script), within_s=2) and _gone(f"{sleep} {tag}", within_s=2)
    finally:
        if proc.poll() is None:
            proc.kill()


# Trains until killed, after starting {start} (a command list) with an empty environment; writes
# OUT/ready<RANK> after every step.
TRAIN_FOREVER = """
import os, subprocess, sys, time, torch
subprocess.Popen({start!r}, env={{}}).wait()
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    open(os.path.join({out!r}, "ready" + os.environ.get("RANK", "")), "w").close()
"""


@pytest.mark.parametrize("nproc", [None, 2], ids=["in-process", "nproc-per-node-2"])
def test_sigkill_of_perfscope_profile_leaves_nothing_running(tmp_path, nproc):
    sleep, tag = _sleeper(tmp_path)
    script = tmp_path / "forever.py"
    script.write_text(TRAIN_FOREVER.format(start=["/bin/sh", "-c", f"setsid {sleep} {tag} & exit 0"], out=str(tmp_path)))
    extra = [] if nproc is None else ["--nproc-per-node", str(nproc)]
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", "profile", str(script), "--out", str(tmp_path / "out"),
                             "--max-steps", "0", *extra], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for rank in ([""] if nproc is None else ["0", "1"]):
            _wait_for(tmp_path / f"ready{rank}", proc, within_s=180)
        assert _running(f"{sleep} {tag}")
        proc.kill()
        proc.wait()
        script_gone = _gone(str(script), within_s=20)
        sleeper_gone = _gone(f"{sleep} {tag}", within_s=5)
        assert script_gone, "the script (or a rank, or the launcher) survived perfscope"
        assert sleeper_gone, "a process the script started survived perfscope"
    finally:
        if proc.poll() is None:
            proc.kill()
        _gone(str(script), within_s=0)  # whatever the outcome, nothing is left to later tests
        _gone(f"{sleep} {tag}", within_s=0)


def test_a_trial_timeout_ends_a_grandchild_that_escaped_its_session_and_environment(tmp_path):
    from perfscope.tuner.trial import TrialSpec, run_trial

    sleep, tag = _sleeper(tmp_path)
    script = tmp_path / "trial.py"
    script.write_text(ESCAPER.format(sleep=sleep, tag=tag, ready=str(tmp_path / "ready"), then="time.sleep(1000)"))
    spec = TrialSpec(script=str(script), script_args=(), warmup_steps=1, measure_steps=1, profile_steps=0, timeout_s=12)
    outcome = run_trial(spec, None, tmp_path / "t")
    assert outcome.status == "timeout"
    assert (tmp_path / "ready").exists()
    assert _gone(f"{sleep} {tag}", within_s=5), "the trial's escaped grandchild survived the trial"


def test_what_a_script_cut_short_left_running_is_ended_but_a_script_that_ends_itself_keeps_it(tmp_path):
    sleep, tag = _sleeper(tmp_path)
    body = f"""
import subprocess, torch
from torch.utils.data import DataLoader, TensorDataset
subprocess.Popen([{sleep!r}, "{tag}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # not our pipes
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8, num_workers=1, persistent_workers=True)
for _ in range({{epochs}}):
    for (x,) in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
"""
    options = ["--skip-first", "1", "--warmup", "1", "--active", "2"]
    try:
        for epochs, extra, left in ((100, [], False), (3, ["--max-steps", "0"], True)):
            script = tmp_path / f"cut{epochs}.py"
            script.write_text(body.format(epochs=epochs))
            done = subprocess.run([sys.executable, "-m", "perfscope", "profile", str(script), "--out",
                                   str(tmp_path / f"out{epochs}"), *options, *extra],
                                  env=ENV, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stderr
            assert "DataLoader worker" not in done.stderr  # its workers were not killed under it
            assert bool(_running(f"{sleep} {tag}")) == left, (epochs, done.stderr)
    finally:
        _gone(f"{sleep} {tag}", within_s=0)


def test_a_process_that_keeps_forking_does_not_outlive_perfscope(tmp_path):
    # Each generation lives 0.1 s: faster than any scan of /proc, but they all stay in one group.
    forker = tmp_path / "forker.py"
    forker.write_text("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nos.setsid()\n"
                      "while True:\n    if os.fork():\n        os._exit(0)\n    time.sleep(0.1)\n")
    script = tmp_path / "reforker.py"
    script.write_text(TRAIN_FOREVER.format(start=[sys.executable, str(forker)], out=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", "profile", str(script), "--out", str(tmp_path / "out"),
                             "--max-steps", "0"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    needle = str(forker)
    try:
        _wait_for(tmp_path / "ready", proc)
        time.sleep(1.0)
        assert _seen(needle)
        proc.kill()
        proc.wait()
        assert _gone(needle, within_s=5, quiet_scans=10), "the re-forking process survived perfscope"
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_group_of(needle)


def _kill_group_of(needle: str) -> None:
    for pid in _running(needle):
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            pass
