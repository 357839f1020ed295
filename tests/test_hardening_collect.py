"""`perfscope profile` against scripts that fork, exit oddly, profile themselves or train in a
thread, and against absurd option values: one clear outcome each, never a crash or a hang."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from perfscope.measure.argv import UsageError, parse_argv
from perfscope.measure.hooks import Recorder
from perfscope.collect.script import exit_status
from collectkit import profiler_steps, trace_events, write_script
from conftest import HANG_TIMEOUT_S  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

HEAD = """
import os, sys, threading, torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train(n):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
"""


def profile(tmp_path, body: str, *options: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """``perfscope profile`` of ``body`` with a window of exactly steps 3-5: ``--extend-s 0``, since
    on a busy machine the window would otherwise grow (tests/test_collect_window_extend.py)."""
    script = write_script(tmp_path, HEAD + body)
    return subprocess.run([sys.executable, "-m", "perfscope", "profile", str(script), "--out", str(tmp_path / "out"),
                           "--skip-first", "1", "--warmup", "1", "--active", "3", "--extend-s", "0", *options],
                          env=ENV, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def summary(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "summary.json").read_text())


def test_a_forked_child_that_exits_ends_only_itself(tmp_path):
    # The child used to run perfscope's shutdown: stop the profiler, write its own 2-step outputs
    # over the parent's, and hang the parent waiting on it.
    result = profile(tmp_path, """
train(2)
pid = os.fork()
if pid == 0:
    train(1)
    print("child out", flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
train(20)
""", timeout=HANG_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("wrote ") == 1 and "child out" in result.stdout
    assert [s["step"] for s in summary(tmp_path)["steps"]] == [3, 4, 5]
    assert len(profiler_steps(trace_events(tmp_path / "out" / "traces" / "rank0.pt.trace.json.gz"))) == 3


@pytest.mark.parametrize(("code", "status"), [(2**70, 255), (256, 0), (257, 1), (-1, 255), (2**32 + 3, 3)])
def test_exit_codes_are_reduced_as_the_operating_system_does(code, status):
    assert exit_status(code) == status
    assert exit_status(code) == subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code})"]).returncode


def test_a_huge_exit_code_still_writes_the_summary(tmp_path):
    result = profile(tmp_path, "train(10)\nsys.exit(2**70)\n", "--max-steps", "0")
    assert result.returncode == 255, result.stderr
    assert "internal error" not in result.stderr
    assert summary(tmp_path)["run"]["exit_code"] == 255


def test_exit_256_is_a_clean_exit(tmp_path):
    result = profile(tmp_path, "train(10)\nsys.exit(256)\n", "--max-steps", "0")
    assert result.returncode == 0, result.stderr
    assert "error" not in summary(tmp_path)["run"]
    assert "failed" not in result.stderr


def test_a_script_with_its_own_profiler_is_stopped_with_one_line(tmp_path):
    result = profile(tmp_path, """
with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2)) as prof:
    for _ in range(20):
        train(1)
        prof.step()
""")
    assert result.returncode == 2, result.stderr  # it used to end in a segmentation fault (-11)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "profiler of its own" in lines[0], result.stderr


def test_a_training_loop_in_a_thread_is_profiled(tmp_path):
    result = profile(tmp_path, """
t = threading.Thread(target=train, args=(30,))
t.start()
t.join()
print("after the thread")
""")
    assert result.returncode == 0, result.stderr
    assert [s["step"] for s in summary(tmp_path)["steps"]] == [3, 4, 5]
    assert "Exception in thread" not in result.stderr and "warning" not in result.stderr


def test_a_script_that_exits_before_training_gives_its_own_status(tmp_path):
    script = write_script(tmp_path, "import argparse\nargparse.ArgumentParser().parse_args()\n" + HEAD + "train(20)\n")
    result = subprocess.run([sys.executable, "-m", "perfscope", "profile", str(script), "--", "--help"],
                            env=ENV, capture_output=True, text=True, timeout=HANG_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    assert "before its first training step" in result.stderr and "error" not in result.stderr
    assert not (tmp_path / "perfscope-out").exists() or not any((tmp_path / "perfscope-out").iterdir())


@pytest.mark.parametrize("options", [
    ["--warmup", str(10**23)], ["--skip-first", str(10**12)], ["--active", "100000"], ["--max-steps", str(10**30)],
    ["--rank-wait", "nan"], ["--rank-wait", "-1"], ["--rank-wait", "inf"], ["--nproc-per-node", str(10**9)],
    ["--out", ""],
], ids=lambda o: " ".join(o) or "empty")
def test_absurd_option_values_are_refused_with_one_line(tmp_path, options):
    script = write_script(tmp_path, HEAD + "train(20)\n")
    result = subprocess.run([sys.executable, "-m", "perfscope", "profile", str(script), *options],
                            env=ENV, capture_output=True, text=True, timeout=HANG_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 2
    assert options[0] in result.stderr.splitlines()[-1] and "Traceback" not in result.stderr
    assert not (tmp_path / "perfscope-out").exists()


@pytest.mark.parametrize("command", [["analyze", "x.json"], ["report", "x"], ["diff", "a", "b"]])
def test_an_empty_out_is_refused(tmp_path, command):
    result = subprocess.run([sys.executable, "-m", "perfscope", *command, "--out", ""],
                            env=ENV, capture_output=True, text=True, timeout=HANG_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 2 and "--out" in result.stderr


@pytest.mark.parametrize("option", ["--warmup-steps", "--measure-steps", "--profile-steps"])
def test_measurement_options_are_bounded(option):
    options = {"--record-dir": "r", "--warmup-steps": "1", "--measure-steps": "1", option: str(10**23)}
    argv = [*(x for pair in options.items() for x in pair), "--", "s.py"]
    with pytest.raises(UsageError, match=option):
        parse_argv(argv)


def test_per_step_state_grows_with_the_steps_run_not_the_steps_asked_for(tmp_path):
    with open(tmp_path / "steps.jsonl", "wb") as f:
        recorder = Recorder(warmup_steps=10**9, measure_steps=10**9, last_step=2 * 10**9, steps_file=f)
        for now in range(5):
            recorder.boundary(float(now))
    assert len(recorder.buckets) <= 5


def test_training_in_spawned_processes_is_named_as_the_reason_for_no_steps(tmp_path):
    script = write_script(tmp_path, """
import torch, torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

def train(rank):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()

if __name__ == "__main__":
    for _ in DataLoader(TensorDataset(torch.randn(8, 4)), num_workers=1):  # a loader worker is not training
        pass
    mp.spawn(train, nprocs=2)
""")
    result = subprocess.run([sys.executable, "-m", "perfscope", "profile", str(script)],
                            env=ENV, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert "started 2 other process(es)" in line and "--nproc-per-node" in line


def test_a_password_in_the_scripts_error_is_masked_in_what_perfscope_prints_and_writes(tmp_path):
    result = profile(tmp_path, "train(10)\nraise RuntimeError('cannot reach postgresql://app:hunter2@db/x')\n",
                     "--max-steps", "0")
    perfscope_lines = [line for line in result.stderr.splitlines() if line.startswith("perfscope:")]
    assert perfscope_lines and not any("hunter2" in line for line in perfscope_lines), result.stderr
    assert "hunter2" not in (tmp_path / "out" / "summary.json").read_text()
    assert "hunter2" not in (tmp_path / "out" / "report.html").read_text()


def test_a_main_thread_that_returns_while_its_training_thread_runs_is_waited_for(tmp_path):
    result = profile(tmp_path, "threading.Thread(target=train, args=(30,)).start()\n")
    assert result.returncode == 0, result.stderr
    assert [s["step"] for s in summary(tmp_path)["steps"]] == [3, 4, 5]


def test_exit_with_an_exception_instance_has_a_message(tmp_path):
    result = profile(tmp_path, "train(10)\nsys.exit(KeyboardInterrupt())\n", "--max-steps", "0")
    assert result.returncode == 1
    assert "exited: KeyboardInterrupt" in summary(tmp_path)["run"]["error"]


def test_a_second_profile_of_one_output_directory_is_refused(tmp_path):
    from perfscope.outlock import FolderLock

    with FolderLock(tmp_path / "out", "perfscope profile", pid_file=False):  # as a running profile holds it
        result = profile(tmp_path, "train(10)\n")
    assert result.returncode == 2
    assert "is in use by another perfscope run" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out" / "summary.json").exists()
