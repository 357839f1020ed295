"""`perfscope profile` on each shipped example gives the class the example is built to show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.analysis.optimizer_step import MIN_SHARE
from conftest import HANG_TIMEOUT_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _out_of(folder: Path) -> Path:
    """The output directory of the last :func:`profile_counted` attempt in ``folder``."""
    return sorted(folder.glob("try*/out"))[-1]


def profile(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "perfscope", "profile", "--out", str(out), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "verdict:" in proc.stdout  # the terminal table was printed
    assert (out / "report.html").is_file()
    traces = sorted((out / "traces").glob("*.pt.trace.json.gz"))
    assert traces, "no trace written"
    return json.loads((out / "summary.json").read_text())


MIN_COUNTED = 3  # of the 5 profiled steps
PLANNED = 5  # the default --active


def _cut_by_the_scripts_end(summary: dict, step: dict) -> bool:
    """A step left out because the script ended inside it: the window's last step, which the end
    of profiling cuts (on a busy machine the window grew, ``run.window_extension``, until the
    script's last step; on any machine the host record may stop before the last step ends)."""
    ext = summary["run"].get("window_extension") or {}
    reason = step["status_reason"] or ""
    last = step["step"] == max(s["step"] or 0 for s in summary["steps"])
    if step["status"] != "incomplete":
        return False
    if reason.startswith("cut off by the end of profiling"):
        return ext.get("reason") == "script ended" or last
    return last and reason.endswith("the script ended inside it")


def recorded_steps(summary: dict) -> range:
    """How many steps the summary may hold: the planned window on a quiet machine; on a busy one
    the steps the longer window recorded (and a last one cut off when the script ended in it)."""
    ext = summary["run"].get("window_extension")
    return range(PLANNED, PLANNED + 1) if ext is None else range(PLANNED + 1, ext["recorded"] + 2)


def profile_counted(tmp_path: Path, *args: str, attempts: int = 3) -> dict:
    """Profile until at least :data:`MIN_COUNTED` steps are counted in the verdict.

    On a loaded machine perfscope marks steps whose training thread waited for a core as
    host-contended and leaves them out (that is the product working); the run is tried again in
    a quieter moment. If the machine starves it every time, the last run's verdict -- over the
    fewer clean steps, or provisional (the steps classified with their waits for a core taken
    out): the product's answer on a busy machine -- is what the caller checks; without one the
    test is skipped, saying why. Any other reason to leave a step out is a failure.
    """
    for k in range(attempts):
        summary = profile(tmp_path / f"try{k}", *args)
        left_out = [s for s in summary["steps"] if s["status"] not in ("ok", "host-contended")]
        assert all(_cut_by_the_scripts_end(summary, s) for s in left_out), [s["status_reason"] for s in left_out]
        if summary["overall"]["steps_counted"] >= MIN_COUNTED:
            return summary
    if summary["overall"]["verdict"] is not None:
        return summary
    pytest.skip(f"the machine starved the training thread in {attempts} runs (steps host-contended: "
                f"{summary['overall']['steps_by_status']}); the example's verdict needs a quieter machine")


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, verdict",
    [
        ("examples/io_bound.py", "io-bound"),
        ("examples/compute_bound.py", "compute-bound"),
        ("examples/launch_bound.py", "launch-bound"),
    ],
)
def test_single_process_examples(tmp_path, script, verdict):
    summary = profile_counted(tmp_path, script)
    assert summary["overall"]["verdict"] == verdict
    assert summary["run"]["script"].endswith(script.split("/")[-1])
    assert summary["run"]["world_size"] == 1
    assert summary["overall"]["steps_total"] in recorded_steps(summary)


@pytest.mark.slow
def test_comm_example_two_ranks(tmp_path):
    summary = profile_counted(tmp_path, "--nproc-per-node", "2", "examples/comm_bound.py")
    assert summary["overall"]["verdict"] == "comm-bound"
    assert sorted({s["rank"] for s in summary["steps"]}) == [0, 1]
    assert summary["run"]["world_size"] == 2


@pytest.mark.slow
def test_diff_of_two_io_runs(tmp_path):
    """`perfscope diff` on the io example with num_workers 0 and 2: the before/after the tuner uses."""
    before = profile_counted(tmp_path / "w0", "examples/io_bound.py")
    after = profile_counted(tmp_path / "w2", "examples/io_bound.py", "--", "--num-workers", "2")
    a_out, b_out = _out_of(tmp_path / "w0"), _out_of(tmp_path / "w2")
    proc = subprocess.run(
        [sys.executable, "-m", "perfscope", "diff", str(a_out), str(b_out),
         "--out", str(tmp_path / "diff.html")],
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    # The diff states the ratio of the two summaries (how much faster is a measurement between
    # separate runs: bench/bench_io_workers.py).
    ratio = after["overall"]["step_time_us"] / before["overall"]["step_time_us"]  # B/A, as the diff states it
    assert f"{ratio:.2f}" in proc.stdout or f"{ratio:.1f}" in proc.stdout, proc.stdout
    html = (tmp_path / "diff.html").read_text()
    assert "io-bound" in html and "Content-Security-Policy" in html


@pytest.mark.slow
def test_swin_example_advises_the_fused_operator_and_runs_it_under_config(tmp_path):
    summary = profile_counted(tmp_path / "plain", "examples/swin.py", "--", "--steps", "12")
    assert summary["overall"]["verdict"] in ("compute-bound", "launch-bound")
    found = summary["details"]["facts"]["window_attention"]
    assert found["calls_per_step"] == 4  # two block pairs
    assert 0 < found["step_time_without_us"] < found["step_time_us"]
    assert "fused_ops: true" in summary["overall"]["advice"]
    config = tmp_path / "fused.yaml"
    config.write_text("fused_ops: true\n")
    # what the config did and which operators ran: no verdict needed, so one run whatever the load
    fused = profile(tmp_path / "fused", "--config", str(config), "examples/swin.py", "--", "--steps", "12")
    applied = fused["run"]["config_applied"]["applied"]["fused_ops"]
    assert "4 module(s)" in applied
    assert fused["details"]["facts"]["window_attention"] is None  # one operator now, not the pattern
    ops = {o["name"] for o in fused["details"]["top_operators"]}
    assert "fused_ops::window_attention_fwd" in ops


@pytest.mark.slow
def test_many_tensors_example_advises_the_fused_optimizer_step_and_runs_it_under_config(tmp_path):
    # One run each, whatever the load: the advice lines are built for every class, so they do
    # not wait on the verdict; the step's share is the trace's, not a speed-up.
    plain = profile(tmp_path / "plain", "examples/many_tensors.py", "--", "--steps", "12")
    found = plain["details"]["facts"]["optimizer_step"]
    assert found["classes"] == ["AdamW"] and found["implementation"] == "for-loop"
    assert found["operators_per_step"] > 386  # several operators for each of its 386 parameter tensors
    # About half of a quiet step (docs/runtime.md). On a machine loaded enough to stretch the steps
    # a hundredfold (seen in CI: 0.17-8.5 s against 40 ms) the share falls under the advice's line;
    # the advice itself is pinned by tests/test_trace_cases_optimizer.py.
    assert ("optimizer_impl: fused" in plain["details"]["advice"]["launch"]) == (found["share"] >= MIN_SHARE)
    config = tmp_path / "fused.yaml"
    config.write_text("optimizer_impl: fused\n")
    fused = profile(tmp_path / "fused", "--config", str(config), "examples/many_tensors.py", "--", "--steps", "12")
    applied = fused["run"]["config_applied"]["applied"]["optimizer_impl"]
    assert applied == "AdamW: fused step in place of for-loop (386 parameter tensors)"
    assert fused["details"]["facts"]["optimizer_step"]["implementation"] == "fused"
    assert "optimizer_impl" not in fused["details"]["advice"]["launch"]
