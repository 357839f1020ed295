"""The steady-state measured window: batch-means RSE, when the window goes on and why it ends, and
the runner's record of it (``perfscope/measure/window.py``)."""

from __future__ import annotations

import math

import pytest

from perfscope.measure.window import MIN_BATCHES, SteadyWindow, window_rse


# --------------------------------------------------------------------------- batch means
def test_rse_of_a_constant_window_is_zero():
    assert window_rse([4] * 8, [0.1] * 8) == 0.0


def test_rse_needs_min_batches_of_whole_rounds():
    assert window_rse([4] * (MIN_BATCHES - 1), [0.1] * (MIN_BATCHES - 1)) is None
    # 7 steps in rounds of 2: 3 whole rounds, the 7th step is left out
    assert window_rse([4] * 7, [0.1] * 7, round_steps=2) is None
    assert window_rse([4] * 8, [0.1] * 8, round_steps=2) == 0.0


def test_rse_is_the_standard_error_of_batch_throughputs_over_the_window_throughput():
    seconds = [0.1, 0.2, 0.1, 0.2]
    rates = [40.0, 20.0, 40.0, 20.0]
    mean = sum(rates) / 4
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / 3)
    overall = 16 / 0.6
    assert window_rse([4] * 4, seconds) == pytest.approx(sd / 2 / overall)


def test_bursts_within_a_round_are_not_noise():
    # 2 workers: a ready batch (fast step) then a wait (slow step), every round alike
    seconds = [0.01, 0.19] * 6
    assert window_rse([4] * 12, seconds, round_steps=1) > 0.3
    assert window_rse([4] * 12, seconds, round_steps=2) == pytest.approx(0.0, abs=1e-12)


def test_unknown_samples_count_steps():
    assert window_rse([None, 4, 4, 4], [0.1, 0.1, 0.1, 0.1]) == 0.0
    assert window_rse([4, 4, 4, 4], [0.0, 0.0, 0.0, 0.0]) is None


# --------------------------------------------------------------------------- decisions
def _run(window, seconds_of, round_steps=1, start=4, limit=1000):
    """Feed ``window`` steps until it stops extending; returns the measured step count."""
    seconds = [seconds_of(i) for i in range(start)]
    while window.extends([4] * len(seconds), seconds, round_steps) and len(seconds) < limit:
        seconds.append(seconds_of(len(seconds)))
    return len(seconds)


def test_a_steady_window_ends_at_once_on_the_target():
    w = SteadyWindow(target_rse=0.05, cap_s=60, max_steps=1000)
    assert _run(w, lambda i: 0.1) == 4
    assert w.ended_by == "target" and w.extra == 0 and w.rse == 0.0


def test_a_noisy_window_goes_on_until_the_target():
    # alternating 0.05 / 0.15 s steps: the batch throughputs differ until batches of 2 average them,
    # here with rounds of 1 the RSE falls as 1/sqrt(n)
    w = SteadyWindow(target_rse=0.1, cap_s=600, max_steps=10_000)
    n = _run(w, lambda i: 0.05 if i % 2 else 0.15)
    assert w.ended_by == "target" and n > 4 and w.rse <= 0.1
    assert window_rse([4] * (n - 1), [0.05 if i % 2 else 0.15 for i in range(n - 1)]) > 0.1


def test_time_and_step_caps_end_a_window_that_never_settles():
    w = SteadyWindow(target_rse=1e-6, cap_s=2.0, max_steps=10_000)
    n = _run(w, lambda i: 0.05 if i % 2 else 0.15)
    assert w.ended_by == "time cap" and 0.1 * (n - 1) < 2.0 + 0.15
    w = SteadyWindow(target_rse=1e-6, cap_s=1e9, max_steps=30)
    assert _run(w, lambda i: 0.05 if i % 2 else 0.15) == 30 and w.ended_by == "step cap"


def test_the_window_holds_whole_rounds():
    w = SteadyWindow(target_rse=1e-6, cap_s=1.0, max_steps=10_000)
    n = _run(w, lambda i: 0.05 if i % 6 < 3 else 0.3, round_steps=3, start=5)
    assert n % 3 == 0 and w.ended_by == "time cap"


def test_summary_says_the_script_ended_an_open_window():
    w = SteadyWindow(target_rse=0.01, cap_s=60, max_steps=100)
    assert w.extends([4] * 4, [0.1, 0.3, 0.1, 0.3], 1)
    s = w.summary([4] * 5, [0.1, 0.3, 0.1, 0.3, 0.1])
    assert s["ended_by"] == "script ended" and s["steps"] == 5 and s["seconds"] == pytest.approx(0.9)
    assert s["rse"] == pytest.approx(window_rse([4] * 5, [0.1, 0.3, 0.1, 0.3, 0.1]))


@pytest.mark.parametrize(("rse", "cap"), [(0, 1), (0.1, 0), (-1, 1), (float("nan"), 1)])
def test_bad_targets_are_refused(rse, cap):
    with pytest.raises(ValueError):
        SteadyWindow(target_rse=rse, cap_s=cap, max_steps=10)


# --------------------------------------------------------------------------- the runner
pytest.importorskip("torch")
from measurekit import LOOP, no_config_from_env, result, run_cli, step_lines  # noqa: E402, F401


def test_runner_measures_a_noisy_script_until_the_cap_and_records_the_window(tmp_path):
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "4", "--target-rse", "0.0001",
                   "--measure-cap", "0.6", script=LOOP, args=["--steps", 200, "--sleep-ms", "5,60"])
    assert proc.returncode == 0, proc.stderr
    w = result(out)["window"]
    measured = [r for r in step_lines(out) if r["measured"]]
    assert w["ended_by"] == "time cap" and w["steps"] == len(measured) > 4
    assert w["seconds"] == pytest.approx(sum(r["seconds"] for r in measured))
    assert w["seconds"] >= 0.6 and w["rse"] > 0.0001
    assert result(out)["steps_seen"] < 200  # ended by perfscope once the window closed


def test_runner_stops_at_k_steps_when_the_target_is_met(tmp_path):
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "6", "--target-rse", "0.5",
                   "--measure-cap", "60", script=LOOP, args=["--steps", 200, "--sleep-ms", "20"])
    assert proc.returncode == 0, proc.stderr
    w = result(out)["window"]
    assert w["ended_by"] == "target" and w["steps"] == 6 and w["extra_steps"] == 0
    assert sum(r["measured"] for r in step_lines(out)) == 6


def test_runner_records_a_window_the_script_ended(tmp_path):
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "4", "--target-rse", "0.0001",
                   "--measure-cap", "600", script=LOOP, args=["--steps", 12, "--sleep-ms", "1,30"])
    assert proc.returncode == 0, proc.stderr
    w = result(out)["window"]
    assert w["ended_by"] == "script ended" and w["steps"] == 11  # 12 fetches: 1 warm-up + 11 measured


@pytest.mark.parametrize(("options", "message"), [
    (["--target-rse", "0.05"], "go together"),
    (["--target-rse", "0", "--measure-cap", "5"], "--target-rse must be above 0"),
    (["--target-rse", "x", "--measure-cap", "5"], "must be a number"),
    (["--target-rse", "0.05", "--measure-cap", "nan"], "--measure-cap must be above 0"),
])
def test_runner_refuses_bad_window_options(tmp_path, options, message):
    proc = run_cli(tmp_path / "rec", "--warmup-steps", "1", "--measure-steps", "2", *options, script=LOOP)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
