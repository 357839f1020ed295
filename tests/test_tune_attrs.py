"""What the tuner keeps in its study is read once into structs: a trial's user attributes
leniently (a damaged attribute reads as absent, the trial is still written), the baseline and the
space strictly (a damaged one stops the run with one line, before any trial compares with it);
the command it was made for is named so that the user sees what differs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import msgspec
import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from perfscope.errors import PerfscopeError
from perfscope.tuner.command import CommandChanged, check_same_command
from perfscope.tuner.attrs import BaselineRun, BaselineUnreadable, Failure, baseline_run, trial_attrs, worker_of
from perfscope.tuner.record import trial_entry
from perfscope.tuner.study import BASELINE_ATTR, SPACE_ATTR, TuningStudy, counts_as_finished
from perfscope.tuner.space import SearchSpace, SpaceUnreadable, build_space

FACTS = {"dataloader": {"num_workers": 0, "batch_size": 8}, "device": "cpu"}


def _trial(state=TrialState.COMPLETE, value=10.0, **attrs):
    return optuna.trial.create_trial(state=state, value=value if state == TrialState.COMPLETE else None,
                                     params={"w": 1}, distributions={"w": IntDistribution(0, 4)}, user_attrs=attrs)


def test_trial_attributes_of_the_wrong_type_read_as_absent_and_the_rest_is_kept():
    t = _trial(role="search", config={"num_workers": 2}, failure="oom", memory=[1, 2], window="x",
               threads={"cores": 2}, duration_s="12", step_values=[1.0, "x", 2], feasible=1, worker={"pid": "7"})
    attrs = trial_attrs(t)
    assert attrs.failure is None and attrs.memory is None and attrs.window is None and attrs.duration_s is None
    assert attrs.feasible is None and attrs.worker == worker_of({"pid": "7"})
    assert attrs.changes == {"num_workers": 2} and attrs.threads == {"cores": 2}
    assert attrs.step_values == [1.0, 2]
    entry = trial_entry(t)
    assert entry["failure"] is None and entry["memory"] is None and entry["window"] is None
    assert entry["config"] == {"num_workers": 2} and entry["step_values"] == [1.0, 2.0]
    assert entry["feasible"] is False  # not stated as feasible: never taken for it


def test_numbers_are_written_as_they_were_stored():
    memory = {"kind": "host", "peak_bytes": 123_456_789, "capacity_bytes": 8 * 2**30, "headroom_share": 0.98,
              "near_limit": False}
    entry = trial_entry(_trial(memory=memory, failure={"kind": "unsafe", "reason": "loss"}, feasible=False))
    assert entry["memory"] == memory and type(entry["memory"]["peak_bytes"]) is int
    assert entry["failure"] == {"kind": "unsafe", "reason": "loss"} and entry["value"] == 10.0


def test_a_failed_trial_without_its_reason_reads_as_lost_and_a_failure_kind_decides_what_counts():
    lost = _trial(state=TrialState.FAIL)
    assert trial_entry(lost, retried=True)["failure"]["kind"] == "lost"
    assert "queued again" in trial_entry(lost, retried=True)["failure"]["reason"]
    assert not counts_as_finished(_trial(state=TrialState.FAIL, failure={"kind": "interrupted", "reason": "^C"}))
    assert counts_as_finished(_trial(state=TrialState.FAIL, failure={"kind": "oom", "reason": "out of memory"}))
    assert not counts_as_finished(_trial(state=TrialState.FAIL, failure={"reason": "a kind is missing"}))
    assert trial_attrs(_trial(failure={"kind": "oom"})).failure == Failure(kind="oom", reason=None)


def test_the_stored_baseline_reads_back_as_it_was_stored(tmp_path: Path):
    study = optuna.create_study(direction="maximize")
    session = TuningStudy(study, None, tmp_path)
    base = BaselineRun(value=120.5, unit="samples/s", step_values=[120.0, 121.0], losses=[2.5, None, 2.4],
                       verdict="io-bound", fractions={"io": 0.7, "compute": 0.3}, facts=FACTS, duration_s=3.25,
                       summary="baseline/summary.json")
    session.store_setup(build_space(FACTS, {"io": 0.7, "compute": 0.3}, "io-bound"), base, guess=None)
    again = TuningStudy(study, None, tmp_path)
    assert again.load_setup()
    assert again.baseline == base  # the losses keep their gaps: they are compared step by step
    assert trial_attrs(study.trials[0]).role == "baseline" and trial_attrs(study.trials[0]).feasible is True


@pytest.mark.parametrize("stored", [{"unit": "samples/s"}, {"value": "fast"}, {"value": 1.0, "losses": "x"}, [1, 2]])
def test_a_damaged_baseline_stops_the_run_with_one_line(tmp_path: Path, stored):
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(SPACE_ATTR, build_space(FACTS, {"io": 1.0}, "io-bound").to_json())
    study.set_user_attr(BASELINE_ATTR, stored)
    with pytest.raises(BaselineUnreadable) as e:
        TuningStudy(study, None, tmp_path).load_setup()
    assert isinstance(e.value, PerfscopeError)
    assert "\n" not in str(e.value) and "--study-name" in str(e.value)


def test_what_is_stored_is_plain_data():
    stored = msgspec.to_builtins(BaselineRun(value=1.0, facts=FACTS))
    assert baseline_run(stored) == BaselineRun(value=1.0, facts=FACTS)


@pytest.mark.parametrize("attr, stored", [(BASELINE_ATTR, {"unit": "samples/s"}), (SPACE_ATTR, '{"knobs": 3}')])
def test_resuming_a_study_whose_setup_is_damaged_says_so_in_one_line(tmp_path: Path, attr, stored):
    from tunekit import copy_script, run_tune, stderr_lines

    script = copy_script("examples/io_bound.py", tmp_path / "s")
    out = tmp_path / "out"
    out.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name="tune-io_bound",
                                direction="maximize")
    study.set_user_attr(SPACE_ATTR, build_space(FACTS, {"io": 1.0}, "io-bound").to_json())
    study.set_user_attr(BASELINE_ATTR, {"value": 10.0})
    study.set_user_attr(attr, stored)
    done = run_tune(str(script), "--out", str(out), "--trials", "2", timeout=120)
    (line,) = stderr_lines(done.stderr)
    assert done.returncode != 0 and "unreadable" in line and "--study-name" in line and "Traceback" not in done.stderr
    assert not (out / "trials").exists()  # nothing ran


@pytest.mark.parametrize("text", ["", "[]", '{"verdict": "io-bound", "order": [], "excluded": {}, "knobs": [{"name": 1}]}',
                                  '{"verdict": "io-bound", "order": [], "excluded": {}, "knobs": '
                                  '[{"name": "num_workers", "distribution": "{}"}]}'])
def test_a_damaged_stored_space_is_refused_by_name(text):
    with pytest.raises(SpaceUnreadable, match="stored search space is unreadable"):
        SearchSpace.from_json(text)


def test_a_script_of_the_same_name_in_another_folder_is_named_in_full(tmp_path):
    study = optuna.create_study(direction="maximize")
    made = SimpleNamespace(script="/a/train.py", script_args=(), nproc_per_node=None, warmup_steps=3,
                           measure_steps=8, seed=0, target_rse=0.05, measure_cap_s=20.0, study_name="s")
    check_same_command(study, made, space_attr=SPACE_ATTR)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    with pytest.raises(CommandChanged, match="made for `perfscope tune /a/train.py`, not `perfscope tune /b/train.py`"):
        check_same_command(study, SimpleNamespace(**{**vars(made), "script": "/b/train.py"}), space_attr=SPACE_ATTR)
    with pytest.raises(CommandChanged, match="made for `perfscope tune train.py`, not `perfscope tune train.py -- x`"):
        check_same_command(study, SimpleNamespace(**{**vars(made), "script_args": ("x",)}), space_attr=SPACE_ATTR)


@pytest.mark.parametrize("stored", ["train.py", {"script": 3, "args": "x"}, {"script": "/a/train.py", "nnodes": "2"}])
def test_a_damaged_stored_command_is_named_not_a_crash(stored):
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("perfscope.command", stored)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    made = SimpleNamespace(script="/a/train.py", script_args=(), nproc_per_node=None, warmup_steps=3,
                           measure_steps=8, seed=0, target_rse=0.05, measure_cap_s=20.0, study_name="s")
    with pytest.raises(CommandChanged, match=r"was made for `perfscope tune .*`, not `perfscope tune (/a/)?train.py`"):
        check_same_command(study, made, space_attr=SPACE_ATTR)
