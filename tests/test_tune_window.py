"""A trial's measured window as the tuner sees it: the runner's options, noise, failures that hold
no value (stored failed, never as a number), and what a too-short script is told."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from test_tune_hardening import one_error_line
from tunekit import run_tune
from perfscope.tuner.attrs import BaselineRun
from perfscope.tuner.space import build_space
from perfscope.tuner.study import CATCH, TuningStudy
from perfscope.tuner.runner import TrialRunner
from perfscope.tuner.trial import TrialOutcome, TrialSpec, _read_results, measure_command, noise_text
from perfscope.tuner.window import steps_needed
from conftest import HANG_TIMEOUT_S  # noqa: E402

FACTS = {"cuda": False, "cpu_count": 2, "world_size": 1, "local_world_size": 1, "ddp": None,
         "dataloader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False,
                        "batch_size": 16},
         "accelerate": {"called": False}}


def test_one_process_trials_measure_until_the_target_and_ranks_a_fixed_window(tmp_path):
    spec = TrialSpec(script="s.py", script_args=())
    one = measure_command(spec, tmp_path, None, 0)
    assert one[one.index("--target-rse") + 1] == "0.05" and one[one.index("--measure-cap") + 1] == "20.0"
    ranks = measure_command(TrialSpec(script="s.py", script_args=(), nproc_per_node=2), tmp_path, None, 0)
    assert "--target-rse" not in ranks  # ranks must stop at the same step
    fixed = measure_command(TrialSpec(script="s.py", script_args=(), target_rse=None), tmp_path, None, 0)
    assert "--target-rse" not in fixed


def _records(tmp_path: Path, result: dict, steps: list[dict]) -> Path:
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    (record_dir / "rank0.json").write_text(json.dumps(result))
    (record_dir / "rank0.steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return record_dir


def test_a_window_of_samples_drawn_before_it_is_a_failure_not_a_zero(tmp_path):
    # Two measured steps of 16 samples, both taken from batches ready before the window (the ready
    # count fell by 2): nothing the workers produced in the window, so nothing measured.
    steps = [{"step": 1, "seconds": 0.1, "samples": 16, "measured": False, "ready": 4},
             {"step": 2, "seconds": 0.01, "samples": 16, "measured": True, "ready": 4},
             {"step": 3, "seconds": 0.01, "samples": 16, "measured": True, "ready": 3},
             {"step": 4, "seconds": 0.01, "samples": 16, "measured": False, "ready": 2}]
    record_dir = _records(tmp_path, {"exit_code": 0, "steps_seen": 4, "facts": FACTS,
                                     "window": {"rse": None, "ended_by": "script ended"}}, steps)
    outcome = TrialOutcome(status="ok", step_values=[1600.0, 1600.0], step_samples=[16, 16],
                           step_seconds=[0.01, 0.01], exit_code=0)
    _read_results(outcome, record_dir, 1, tmp_path / "output.log", TrialSpec(script="s", script_args=(),
                                                                               measure_steps=2))
    assert outcome.status == "unmeasured" and outcome.value == 0
    assert "held no samples of their own" in outcome.reason and "32 were drawn" in outcome.reason


def test_a_script_too_short_for_the_warm_up_is_told_how_many_steps_it_needs(tmp_path):
    steps = [{"step": s, "seconds": 0.1, "samples": 16, "measured": False, "warmup": True} for s in range(1, 20)]
    record_dir = _records(tmp_path, {"exit_code": 0, "steps_seen": 19, "warmup_steps_used": 19, "facts": FACTS},
                          steps)
    outcome = TrialOutcome(status="ok", exit_code=0)
    _read_results(outcome, record_dir, 1, tmp_path / "output.log", TrialSpec(script="s", script_args=(),
                                                                               measure_steps=8))
    assert outcome.status == "too-few-steps"
    assert f"give the script at least {steps_needed(19, 8)} steps" in outcome.reason
    assert steps_needed(19, 8) >= 19 + 8 + 1


def test_noise_is_said_with_the_window():
    o = TrialOutcome(status="ok", step_seconds=[0.1] * 24, window={"rse": 0.021, "ended_by": "target"})
    assert o.noise == pytest.approx(0.021) and noise_text(o) == "±2.1% over 24 steps"
    capped = TrialOutcome(status="ok", step_seconds=[0.1] * 9, window={"rse": 0.2, "ended_by": "time cap"})
    assert noise_text(capped) == "±20.0% over 9 steps, time cap reached"
    assert noise_text(TrialOutcome(status="ok", step_seconds=[0.1] * 3)) == "3 steps"


def test_a_trial_that_measured_nothing_is_stored_failed_counted_and_not_measured_again(tmp_path, monkeypatch):
    space = build_space(FACTS, {"io": 0.5, "compute": 0.5}, "io-bound")
    study = optuna.create_study(direction="maximize")
    runs = []

    class Unmeasured(TrialRunner):
        def run(self, spec, config, work_dir, **kwargs):
            runs.append(config.changes())
            return TrialOutcome(status="unmeasured", reason="the 2 measured steps held no samples of their own",
                                step_samples=[16, 16], step_seconds=[0.01, 0.01], drawn_samples=32)

    session = TuningStudy(study, TrialSpec(script="s.py", script_args=(), runner=Unmeasured()), tmp_path / "trials")
    session.store_setup(space, BaselineRun(value=100.0, unit="samples/s", step_values=[100.0], losses=[],
                                verdict="io-bound", fractions={}, facts=FACTS), guess=None)
    params = dict(space.baseline_params, num_workers=2)
    study.enqueue_trial(params)
    study.enqueue_trial(params)  # proposed again: not run a second time
    study.optimize(session.objective, n_trials=2, catch=CATCH)
    failed, again = study.get_trials()[1:3]
    assert failed.state == optuna.trial.TrialState.FAIL and failed.value is None
    assert failed.user_attrs["failure"]["kind"] == "unmeasured"
    assert again.user_attrs["failure"]["kind"] == "duplicate" and len(runs) == 1
    assert session.finished_count() == 2  # the baseline and the failed run; the duplicate ran nothing


def test_confirm_min_rounds_above_the_rounds_is_refused(tmp_path):
    done = run_tune(str(Path(__file__).resolve().parents[1] / "examples" / "io_bound.py"), "--out", str(tmp_path / "o"),
                    "--confirm-rounds", "3", "--confirm-min-rounds", "5", timeout=HANG_TIMEOUT_S)
    assert done.returncode != 0
    assert "--confirm-min-rounds 5 is above --confirm-rounds 3" in one_error_line(done)
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- the watch, on a fake clock
class _Running:
    returncode = None

    def poll(self):
        return None


class _Log:
    problem = None


def test_a_trial_that_never_ends_times_out_with_progress_lines_on_a_fake_clock(tmp_path):
    from perfscope.measure.records import StepReader
    from perfscope.tuner.trial import TrialSpec
    from perfscope.tuner.watch import PROGRESS_S, Measured, watch

    now = [100.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += 1.0

    progress = []
    spec = TrialSpec(script="train.py", script_args=(), timeout_s=35.0)
    measured = Measured([StepReader(tmp_path / "rank0.steps.jsonl")], 1, None)
    status, reason = watch(_Running(), measured, _Log(), spec, lambda s, n: progress.append((s, n)), 100.0,
                            clock=lambda: now[0], sleep=sleep)
    assert status == "timeout" and "35 s" in reason, reason
    assert [s for s, _ in progress] == [PROGRESS_S * k for k in (1, 2, 3)] and len(slept) == 36  # past the limit, not at it
