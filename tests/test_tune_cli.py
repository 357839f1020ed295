"""`perfscope tune` end to end, through the real command in child processes: the io-bound example
gets a proven-faster configuration that `perfscope profile --config` then runs with; the comm-bound
example is searched over 2 ranks; a run killed outright or stopped by Ctrl-C leaves none of its
trial's processes running, and Ctrl-C writes what finished; bad input gets one line and exit
status 2. Every test runs a private copy of its script, so that nothing may be left running
afterwards. The study's flow (resuming, several workers, refusals) is tests/test_tune_flow.py's,
against a simulated runner."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess

import optuna
import pytest
from tunekit import (
    copy_script,
    logs,
    read_record,
    reap,
    run_perfscope,
    run_tune,
    start_tune,
    stderr_lines,
    wait_until,
)

from perfscope.runtime.config import load_config
from conftest import HANG_TIMEOUT_S  # noqa: E402

pytestmark = pytest.mark.slow

# Small budgets: every trial is a fresh Python process importing torch, on a 2-core machine. The
# measured window keeps its default target but ends after 3 s, and confirmation after 5 rounds.
BUDGET = ("--steps-per-trial", "4", "--warmup-steps", "2", "--confirm-top", "1", "--profile-steps", "0",
          "--measure-cap", "3", "--confirm-rounds", "5")
# 10 ms of "decoding" per sample (160 ms a batch) on the training thread, 5 ms of compute: 2 DataLoader
# workers double the throughput, far beyond the noise of step times on a shared machine (see
# tunekit.tune_env).
IO_ARGS = ("--", "--steps", "100", "--decode-ms", "10")
# For the tests of what a run keeps, resumes and refuses (not of how fast a configuration is): each
# trial measures exactly its K steps instead of going on (up to --measure-cap) until the
# throughput's error is small, which is most of a trial's time.
EXACT = ("--target-rse", "0")
RUN_TIMEOUT_S = 420
LEFT_S = 15.0  # DataLoader workers of a killed trial notice their parent is gone within 5 s

optuna.logging.set_verbosity(optuna.logging.WARNING)


def tune_args(script, out, *extra: str) -> tuple[str, ...]:
    return (str(script), *BUDGET, "--out", str(out), *extra)


def check_one_line_error(done: subprocess.CompletedProcess, *, status: int = 2) -> str:
    lines = stderr_lines(done.stderr)
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("perfscope: error: "), lines
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Finding and proving a faster configuration


def test_io_bound_gets_a_configuration_with_loader_workers_that_profile_runs_with(tmp_path):
    # How much faster it is, under what load, is measured in bench/bench_tune_busy.py (5 of 5 studies
    # at >= 4x beside two busy processes per core): a test asserts what the tuner does with it.
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    done = run_tune(*tune_args(script, out, "--trials", "4", "--confirm-rounds", "3"), *IO_ARGS,
                    timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    record = read_record(out)
    rec = record["recommendation"]
    assert rec["status"] in ("faster", "keep-current"), rec
    if rec["status"] != "faster":  # the load drowned the gain: the tuner says so, and keeps the settings
        assert "Keep your current settings" in done.stdout or rec["line"], done.stdout
        pytest.skip(f"the confirmation did not decide on this machine now: {rec['line']}")
    assert re.search(r"^\d+\.\d+x faster \(95% interval", done.stdout, re.MULTILINE), done.stdout

    best = load_config(out / "best.yaml")
    assert best is not None and best.num_workers and best.num_workers > 0, (out / "best.yaml").read_text()
    assert record["schema"] == "perfscope.tune" and record["schema_version"] == 1
    assert record["objective"]["unit"] == "samples/s"
    roles = {t["number"]: t["role"] for t in record["trials"]}
    assert roles[0] == "baseline" and roles[1] == "guess", roles
    assert list(roles.values()).count("baseline") == 1
    assert rec["ci_low"] > 1 and rec["ci_low"] <= rec["speedup"] <= rec["ci_high"], rec
    assert rec["config"]["num_workers"] == best.num_workers
    assert record["best_config"] == "best.yaml"
    for name in ("report.html", "baseline/summary.json", "best/summary.json", "diff.html", "study.db"):
        assert (out / name).is_file(), name
    assert record["after"]["summary"] == "best/summary.json" and record["after"]["diff"] == "diff.html"
    # Without the bar, each search trial says itself in a line; the diff is headed by the confirmed figure.
    assert re.search(r"^perfscope: trial \d+ \(\d+/\d+ done\): ", done.stdout, re.MULTILINE), done.stdout
    assert f"B is {rec['speedup']:.2f}x faster" in (out / "diff.html").read_text()
    assert not reap(script, LEFT_S)

    # The recommendation runs as it is: `perfscope profile --config best.yaml`.
    prof = run_perfscope("profile", "--config", str(out / "best.yaml"), "--out", str(tmp_path / "prof"),
                         str(script), "--", "--steps", "40", timeout=RUN_TIMEOUT_S)
    assert prof.returncode == 0, prof.stdout + prof.stderr
    summary = json.loads((tmp_path / "prof" / "summary.json").read_text())
    assert summary["run"]["config"]["num_workers"] == best.num_workers, summary["run"].get("config")
    assert not reap(script, LEFT_S)


def test_comm_bound_over_two_ranks_searches_the_communication_knobs(tmp_path):
    script = copy_script("examples/comm_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    done = run_tune(*tune_args(script, out, "--trials", "2", "--confirm-rounds", "2", "--nproc-per-node", "2", *EXACT),
                    "--", "--steps", "60", timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    record = read_record(out)
    assert record["nproc_per_node"] == 2
    searched = [k["name"] for k in record["space"]["searched"]]
    assert {"bucket_cap_mb", "grad_compression"} <= set(searched), record["space"]
    # 2 ranks on one node: nothing for a hierarchical all-reduce to gain, left out with the reason
    assert "one node" in record["space"]["excluded"]["hierarchical_allreduce"]
    assert "num_workers" in record["space"]["excluded"]  # no DataLoader
    assert record["objective"]["unit"] == "steps/s"
    assert record["baseline"]["value"] > 0
    ran = [t for t in record["trials"] if t["role"] != "baseline"]
    assert ran and all(t["failure"] is None for t in ran), ran  # every configuration ran on 2 ranks
    # Empty (keep current) or the changes of a searched knob.
    best = load_config(out / "best.yaml")
    assert best is not None and set(best.changes()) <= set(searched), best.changes()
    assert best.changes() == record["recommendation"]["config"]
    assert not reap(script, LEFT_S)


# ---------------------------------------------------------------------------------------------
# Stopping and resuming


def test_a_killed_run_leaves_no_trial_running(tmp_path):
    # What the study keeps and how a rerun resumes is tests/test_tune_flow.py's (a simulated runner);
    # here, that the trial's real processes die with the tuner.
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    proc = start_tune(*tune_args(script, out, *EXACT), *IO_ARGS, log_dir=tmp_path / "log")
    stepping = out / "trials" / "baseline" / "records" / "rank0.steps.jsonl"
    try:
        assert wait_until(stepping.is_file, RUN_TIMEOUT_S, proc=proc), logs(tmp_path / "log")
        os.kill(proc.pid, signal.SIGKILL)  # perfscope only: its trial must die with it
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not reap(script, LEFT_S), "the trial of a killed perfscope kept running"


def test_a_killed_run_over_two_ranks_leaves_no_launcher_or_rank_running(tmp_path):
    script = copy_script("examples/comm_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    # A baseline of 500 measured steps would run for minutes: it is killed while its ranks step.
    proc = start_tune(str(script), "--nproc-per-node", "2", "--steps-per-trial", "500", "--out", str(out),
                      "--", "--steps", "1000", log_dir=tmp_path / "log")
    stepping = out / "trials" / "baseline" / "records" / "rank1.steps.jsonl"
    try:
        assert wait_until(stepping.is_file, RUN_TIMEOUT_S, proc=proc), logs(tmp_path / "log")
        os.kill(proc.pid, signal.SIGKILL)  # perfscope only: torchrun and both ranks must die with it
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not reap(script, LEFT_S), "torchrun or a rank outlived the killed perfscope"


def ctrl_c(args: tuple[str, ...], log_dir, once, sig: int = signal.SIGINT) -> tuple[int, str, str]:
    """Start `perfscope tune ARGS`, send it ``sig`` (SIGINT: what Ctrl-C sends to the foreground
    process) once a file matching the glob ``once`` (a Path) exists; (exit status, stdout, stderr)."""
    proc = start_tune(*args, log_dir=log_dir)
    try:
        assert wait_until(lambda: bool(glob.glob(str(once))), RUN_TIMEOUT_S, proc=proc), logs(log_dir)
        os.kill(proc.pid, sig)
        status = proc.wait(timeout=HANG_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = logs(log_dir)
    assert status == (130 if sig == signal.SIGINT else 128 + sig), (status, stdout, stderr)
    lines = stderr_lines(stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert "resume" in lines[0] and "tune.json" in lines[0], lines
    return status, stdout, stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_trial_and_writes_what_finished(tmp_path, sig):
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    args = (*tune_args(script, out, "--trials", "4", "--confirm-rounds", "2", *EXACT), *IO_ARGS)
    # In the search: once trial 1 is stepping. Ctrl-C in the confirmation and the rerun that
    # resumes are tests/test_tune_flow.py's (a simulated runner).
    ctrl_c(args, tmp_path / "first", out / "trials" / "trial-1" / "records" / "rank0.steps.jsonl", sig)
    assert not reap(script, LEFT_S), "Ctrl-C left the trial running"
    record = read_record(out)
    assert any("interrupted" in note for note in record["notes"]), record["notes"]
    assert record["recommendation"] is None and record["decided_by"] == "interrupted"
    resume = record["resume"]  # the command as typed
    assert resume.startswith("perfscope tune ") and f" {script} " in resume and resume.endswith("--decode-ms 10")
    stopped = [t for t in record["trials"] if (t["failure"] or {}).get("kind") == "interrupted"]
    assert len(stopped) == 1 and stopped[0]["state"] == "failed", record["trials"]
    assert not (out / "best.yaml").exists()  # nothing was proven


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2


@pytest.mark.parametrize("case", ["missing-script", "unknown-storage", "unreachable-server", "one-round"])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, case):
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    extra: tuple[str, ...] = ()
    if case == "missing-script":
        script = tmp_path / "s" / "missing.py"
    elif case == "unknown-storage":
        extra = ("--storage", "bogus://x")
    elif case == "unreachable-server":
        extra = ("--storage", "postgresql://u:secret@127.0.0.1:1/db")
    else:
        extra = ("--confirm-rounds", "1")
    done = run_tune(str(script), "--out", str(out), *extra, "--", "--steps", "100", timeout=HANG_TIMEOUT_S)
    line = check_one_line_error(done)
    expected = {"missing-script": "missing.py", "unknown-storage": "bogus://x",
                "unreachable-server": "127.0.0.1", "one-round": "--confirm-rounds"}[case]
    assert expected in line, line
    assert "secret" not in done.stdout + done.stderr
    if case in ("missing-script", "one-round"):
        assert not out.exists()  # told before anything is created
    assert not reap(tmp_path / "s", LEFT_S)


def test_a_script_failing_before_any_step_and_a_study_of_another_command(tmp_path):
    script = copy_script("tests/scripts/tune_broken.py", tmp_path / "s")
    out = tmp_path / "out"
    done = run_tune(*tune_args(script, out, *EXACT), "--", "--steps", "100", timeout=RUN_TIMEOUT_S)
    assert done.returncode != 0
    line = check_one_line_error(done, status=done.returncode)
    assert "baseline run failed" in line and "missing.tfrecord" in line, line
    assert not reap(script, LEFT_S)

    # The failed baseline left no trial: the same folder takes corrected arguments (the baseline
    # runs again, and fails again: the script's data is missing whatever its arguments).
    done = run_tune(*tune_args(script, out, *EXACT), "--", "--steps", "120", timeout=RUN_TIMEOUT_S)
    assert "profiling the baseline" in done.stdout and done.returncode != 0, done.stdout + done.stderr
    assert "missing.tfrecord" in check_one_line_error(done, status=done.returncode)
    # A study that holds trials refusing another command: tests/test_tune_flow.py.
