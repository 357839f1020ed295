"""Trials in isolation: measured throughput, failures recorded as infeasible, nothing left running."""

from __future__ import annotations

import optuna
import pytest

from tunekit import copy_script, wait_no_processes
from perfscope.tuner.attrs import BaselineRun
from perfscope.testing.trials import check_runner
from perfscope.tuner.runner import ProcessRunner
from perfscope.tuner.space import build_space
from perfscope.tuner.study import CATCH, TuningStudy
from perfscope.tuner.trial import Pruned, TrialSpec, run_trial

pytestmark = pytest.mark.slow

FACTS = {"cuda": False, "cpu_count": 2, "world_size": 1, "local_world_size": 1, "ddp": None,
         "dataloader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False},
         "accelerate": {"called": False}}


def test_a_trial_measures_samples_per_second_and_its_verdict(tmp_path):
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    spec = TrialSpec(script=str(script), script_args=("--steps", "30", "--decode-ms", "2"), warmup_steps=2,
                     measure_steps=4, target_rse=None, profile_steps=2, timeout_s=120)
    seen = []
    outcome = run_trial(spec, None, tmp_path / "t", on_step=lambda i, v: seen.append((i, v)))
    assert outcome.ok, outcome.reason
    assert outcome.unit == "samples/s" and len(outcome.step_values) == 4
    assert [i for i, _ in seen] == [0, 1, 2, 3]  # intermediate values arrive while it runs
    # 16 samples per step, at least 2 ms of decoding each: at most 500 samples/s.
    assert 0 < outcome.value < 500
    assert outcome.trace_files and outcome.facts["dataloader"]["num_workers"] == 0
    assert all(v is not None for v in outcome.losses)
    assert not wait_no_processes(script)


def test_the_process_runner_keeps_the_runner_contract(tmp_path):
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    spec = TrialSpec(script=str(script), script_args=("--steps", "40", "--decode-ms", "2"), warmup_steps=1,
                     measure_steps=4, target_rse=None, profile_steps=0, timeout_s=120)
    check_runner(ProcessRunner(), spec, tmp_path / "runs")
    assert not wait_no_processes(script)


def test_pruned_trial_is_stopped_with_its_processes(tmp_path):
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    spec = TrialSpec(script=str(script), script_args=("--steps", "200", "--num-workers", "2"), warmup_steps=1,
                     measure_steps=100, profile_steps=0, timeout_s=120)

    def prune(index, value):
        if index == 1:
            raise Pruned

    outcome = run_trial(spec, None, tmp_path / "t", on_step=prune)
    assert outcome.status == "pruned" and len(outcome.step_values) == 2
    assert not wait_no_processes(script), "the pruned trial or its DataLoader workers are still running"


def test_oom_and_hang_trials_are_infeasible_and_the_study_completes(tmp_path):
    script = copy_script("tests/scripts/tune_failing.py", tmp_path / "s")
    # The hanging trial waits out the whole timeout; the fine one must finish within it however busy
    # the machine is (its start-up alone, torch's import, took over 15 s at a load of 5): 60 s.
    spec = TrialSpec(script=str(script), script_args=("--steps", "40"), warmup_steps=2, measure_steps=3,
                     profile_steps=0, timeout_s=60)
    space = build_space(FACTS, {"io": 0.5, "compute": 0.5}, "io-bound")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    session = TuningStudy(study, spec, tmp_path / "trials")
    session.store_setup(space, BaselineRun(value=100.0, unit="samples/s", step_values=[100.0], losses=[],
                                verdict="io-bound", fractions={}, facts=FACTS), guess=None)
    study.enqueue_trial({"num_workers": 2, "prefetch_factor": 8})  # allocates too much
    study.enqueue_trial({"num_workers": 1, "prefetch_factor": 2})  # hangs
    study.enqueue_trial({"num_workers": 2, "prefetch_factor": 2})  # fine
    study.optimize(session.objective, n_trials=3, catch=CATCH)

    trials = {t.number: t for t in study.get_trials()}
    oom, hang, fine = trials[1], trials[2], trials[3]
    # A failure is stored failed, with its reason, never with a value the sampler would learn from.
    assert oom.state == hang.state == optuna.trial.TrialState.FAIL and fine.state == optuna.trial.TrialState.COMPLETE
    assert session.finished_count() == 4  # failures used runs of the budget
    assert oom.user_attrs["failure"]["kind"] == "oom", oom.user_attrs["failure"]
    assert "allocate" in oom.user_attrs["failure"]["reason"]
    assert hang.user_attrs["failure"]["kind"] == "timeout"
    for t in (oom, hang):
        assert t.user_attrs["feasible"] is False and t.value is None
    assert fine.user_attrs["feasible"] is True and fine.value > 0 and fine.user_attrs["failure"] is None
    assert fine.constraints == {"infeasible": 0.0}
    assert not wait_no_processes(script), "a failed trial left processes behind"


def test_a_configuration_whose_loss_departs_is_unsafe_and_not_feasible(tmp_path):
    script = copy_script("tests/scripts/tune_precision.py", tmp_path / "s")
    spec = TrialSpec(script=str(script), script_args=("--steps", "30"), warmup_steps=2, measure_steps=4,
                     profile_steps=0, timeout_s=120)
    base = run_trial(spec, None, tmp_path / "base")
    assert base.ok and base.facts["accelerate"]["called"]
    facts = dict(base.facts)
    space = build_space(facts, {"compute": 0.9, "io": 0.1}, "compute-bound")
    assert "amp_level" in [k.name for k in space.knobs]
    study = optuna.create_study(direction="maximize")
    session = TuningStudy(study, spec, tmp_path / "trials")
    session.store_setup(space, BaselineRun(value=base.value, unit=base.unit, step_values=base.step_values,
                                losses=base.losses, verdict="compute-bound", fractions={}, facts=facts),
                        guess=None)
    study.enqueue_trial(dict(space.baseline_params, amp_level="O1"))
    study.optimize(session.objective, n_trials=1)
    trial = study.get_trials()[-1]
    assert trial.user_attrs["numerics"]["status"] == "unsafe", trial.user_attrs["numerics"]
    assert trial.user_attrs["failure"]["kind"] == "unsafe" and trial.user_attrs["feasible"] is False
    assert trial.constraints == {"infeasible": 1.0}
    assert trial.value > 0  # it ran: its speed is kept, but it can never be recommended
    assert session.feasible_trials()[0].user_attrs["role"] == "baseline"


def test_a_process_the_script_starts_in_its_own_session_is_stopped_too(tmp_path):
    script = copy_script("tests/scripts/tune_spawner.py", tmp_path / "s")
    marker = f"spawned-helper-{tmp_path.name}"
    spec = TrialSpec(script=str(script), script_args=(marker,), warmup_steps=2, measure_steps=3, profile_steps=0,
                     timeout_s=60)
    outcome = run_trial(spec, None, tmp_path / "t")
    assert outcome.ok, outcome.reason
    assert not wait_no_processes(marker), "the helper process the script started in its own session survived"


def test_ctrl_c_after_the_run_marks_the_trial_interrupted_and_it_is_queued_again(tmp_path, monkeypatch):
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    spec = TrialSpec(script=str(script), script_args=("--steps", "30", "--decode-ms", "1"), warmup_steps=1,
                     measure_steps=2, profile_steps=0, timeout_s=120)
    space = build_space(FACTS, {"io": 0.5, "compute": 0.5}, "io-bound")
    study = optuna.create_study(direction="maximize")
    session = TuningStudy(study, spec, tmp_path / "trials")
    session.store_setup(space, BaselineRun(value=100.0, unit="samples/s", step_values=[100.0], losses=[],
                                verdict="io-bound", fractions={}, facts=FACTS), guess=None)
    study.enqueue_trial({"num_workers": 1, "prefetch_factor": 2})

    def ctrl_c(outcome):  # Ctrl-C lands while the finished run is analysed, outside the run itself
        raise KeyboardInterrupt

    monkeypatch.setattr("perfscope.tuner.study.trial_verdict", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        study.optimize(session.objective, n_trials=1)
    stopped = study.get_trials()[1]
    assert stopped.state == optuna.trial.TrialState.FAIL
    assert stopped.user_attrs["failure"]["kind"] == "interrupted", stopped.user_attrs
    assert session.requeue_lost_trials() == [1]
    assert [t.number for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))] == [2]
    assert not wait_no_processes(script)


def test_a_long_trial_says_it_is_still_running(tmp_path, monkeypatch):
    # The Swin baseline ran 81 s with no line at all.
    import perfscope.tuner.watch as watch_mod

    monkeypatch.setattr(watch_mod, "PROGRESS_S", 0.5)
    said = []
    script = copy_script("examples/io_bound.py", tmp_path / "s")
    spec = TrialSpec(script=str(script), script_args=("--steps", "30", "--decode-ms", "2"), warmup_steps=2,
                     measure_steps=8, target_rse=None, profile_steps=0, timeout_s=300)
    outcome = run_trial(spec, None, tmp_path / "t", on_progress=lambda s, n: said.append((s, n)))
    assert outcome.ok, outcome.reason
    assert said and all(s >= 0.5 for s, _ in said)

