"""The tuner's flow against a simulated runner (perfscope.testing.trials), in seconds: an io-bound
study finds, proves and profiles loader workers; a study whose tuner was killed, or stopped by
Ctrl-C in the search or in the confirmation, resumes keeping what finished; two workers share one
study on a real PostgreSQL server; a failing baseline and a study of another command are refused;
the time budgets count the runner's clock, and a second worker's wait for the setup an injected
one. The same flows through real child processes (what they leave running, the command's exit status
and words) are the end-to-end tests of tests/test_tune_cli.py."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from tunekit import ROOT, tune_env

from perfscope.tuner.attrs import BaselineRun
from perfscope.errors import PerfscopeError
from perfscope.runtime.config import load_config
from perfscope.testing.record import check_tune_record
from perfscope.testing.trials import SimulatedRunner, Workload, check_runner
from perfscope.tuner.command import CommandChanged
from perfscope.tuner.options import TuneOptions
from perfscope.tuner.storage import open_storage
from perfscope.tuner.trial import TrialSpec
from perfscope.tuner.tune import TuneError, tune

SIMULATED_TUNE = ROOT / "tests" / "scripts" / "simulated_tune.py"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def options(out: Path, *args: str, **changes) -> TuneOptions:
    """A small study of the simulated script ``train.py ARGS`` writing to ``out``."""
    fields = dict(script=str(out.parent / "train.py"), script_args=args or ("--steps", "100"), out_dir=out,
                  best_path=out / "best.yaml", study_name="tune-train", trials=4, warmup_steps=2, measure_steps=4,
                  profile_steps=0, confirm_top=1, confirm_rounds=4, progress=False)
    return TuneOptions(**{**fields, **changes})


def read_record(out: Path) -> dict:
    return json.loads((out / "tune.json").read_text())


def finished(record: dict) -> list[dict]:
    return [t for t in record["trials"] if t["state"] in ("complete", "pruned")]


def stop_at(predicate):
    """An ``on_run`` raising KeyboardInterrupt (what Ctrl-C raises) as the first run for which
    ``predicate(index, work_dir)`` holds starts."""
    def on_run(index: int, changes: dict, work_dir: Path) -> None:
        if predicate(index, work_dir):
            raise KeyboardInterrupt
    return on_run


def test_the_simulated_runner_keeps_the_runner_contract(tmp_path):
    spec = TrialSpec(script="train.py", script_args=(), warmup_steps=1, measure_steps=4, profile_steps=0)
    check_runner(SimulatedRunner(), spec, tmp_path)


def test_an_io_bound_study_finds_proves_and_profiles_loader_workers(tmp_path, capsys):
    out = tmp_path / "out"
    runner = SimulatedRunner()
    record = tune(options(out, trials=5), runner=runner)
    said = capsys.readouterr().out
    rec = record["recommendation"]
    assert rec["status"] == "faster", rec
    assert record["baseline"]["verdict"] == "io-bound", record["baseline"]
    best = load_config(out / "best.yaml")
    assert best is not None and best.num_workers and best.num_workers > 0
    assert rec["config"]["num_workers"] == best.num_workers and record["best_config"] == "best.yaml"
    assert record["schema"] == "perfscope.tune" and record["objective"]["unit"] == "samples/s"
    roles = {t["number"]: t["role"] for t in record["trials"]}
    assert roles[0] == "baseline" and roles[1] == "guess" and list(roles.values()).count("baseline") == 1, roles
    assert 1 < rec["ci_low"] <= rec["speedup"] <= rec["ci_high"], rec
    for name in ("report.html", "baseline/summary.json", "best/summary.json", "diff.html", "study.db"):
        assert (out / name).is_file(), name
    assert record["after"]["summary"] == "best/summary.json" and record["after"]["diff"] == "diff.html"
    assert record["after"]["verdict"] != "io-bound", record["after"]  # the workers took the input wait off
    assert re.search(r"^perfscope: trial \d+ \(\d+/\d+ done\): ", said, re.MULTILINE), said
    assert f"B is {rec['speedup']:.2f}x faster" in (out / "diff.html").read_text()
    # The baseline ran once in the search; every confirmation round ran both.
    assert [r.changes for r in runner.runs].count({}) == 1 + rec["rounds"]
    check_tune_record(read_record(out))  # what the tuner wrote is what tune_schema defines


def test_a_killed_tuner_resumes_keeping_its_finished_trials(tmp_path):
    out = tmp_path / "out"
    # Runs 0 (baseline), 1 (guess) and 2 finish; the tuner is killed as run 3 (trial 3) starts.
    first = subprocess.run([sys.executable, str(SIMULATED_TUNE), str(out), "--trials", "6", "--kill-at-run", "3"],
                           capture_output=True, text=True, timeout=300, env=tune_env())
    assert first.returncode == -9, first.stdout + first.stderr
    url = f"sqlite:///{out / 'study.db'}"
    trials = optuna.load_study(study_name="tune-train", storage=url).get_trials()
    complete = {t.number: t.value for t in trials if t.state in FINISHED}
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    assert sorted(complete) == [0, 1, 2] and running == [3], [(t.number, t.state) for t in trials]

    runner = SimulatedRunner()
    record = tune(options(out, trials=6), runner=runner)
    by_number = {t["number"]: t for t in record["trials"]}
    for number, value in complete.items():  # kept, not measured again
        assert by_number[number]["value"] == pytest.approx(value)
    killed = by_number[3]
    assert killed["state"] == "failed" and killed["failure"]["kind"] == "interrupted", killed
    assert any(t["params"] == killed["params"] and t["state"] in ("complete", "pruned")
               for n, t in by_number.items() if n > 3), record["trials"]  # its configuration ran again
    assert [t["role"] for t in record["trials"]].count("baseline") == 1
    assert len(finished(record)) == 6
    assert {} not in [r.changes for r in runner.runs[:3]]  # the rerun went on with the search, no baseline


def test_ctrl_c_in_the_search_then_in_the_confirmation_then_a_rerun_finishes(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # as trial 2 starts
        tune(options(out), runner=SimulatedRunner(on_run=stop_at(lambda i, work: work.name == "trial-2")))
    record = read_record(out)
    assert any("interrupted" in note for note in record["notes"]), record["notes"]
    assert record["recommendation"] is None and not (out / "best.yaml").exists()
    assert record["decided_by"] == "interrupted" and record["resume"] == "run the same command again"
    stopped = [t for t in record["trials"] if (t["failure"] or {}).get("kind") == "interrupted"]
    assert [t["number"] for t in stopped] == [2] and stopped[0]["state"] == "failed", record["trials"]

    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):  # as the confirmation's first run starts: the search had finished
        tune(options(out), runner=SimulatedRunner(on_run=stop_at(lambda i, work: "confirm-" in str(work))))
    assert "resuming" in capsys.readouterr().out
    record = read_record(out)
    assert len(finished(record)) == 4, record["trials"]
    assert any(t["params"] == stopped[0]["params"] and t["state"] in ("complete", "pruned")
               for t in record["trials"] if t["number"] > 2), record["trials"]  # queued again
    assert record["recommendation"] is None and any("interrupted" in note for note in record["notes"])
    assert not (out / "best.yaml").exists()

    runner = SimulatedRunner()
    record = tune(options(out), runner=runner)
    assert any("no new trial ran" in note for note in record["notes"]), record["notes"]
    assert record["recommendation"]["status"] == "faster"
    assert record["decided_by"] == "confirmation" and record["resume"] is None
    assert len(finished(record)) == 4 and [t["role"] for t in record["trials"]].count("baseline") == 1
    assert (out / "best.yaml").is_file()
    assert all("confirm-" in str(r.work_dir) or r.work_dir.name.startswith("best-") for r in runner.runs)


def test_two_workers_share_one_study_on_postgresql(tmp_path, postgres_url):
    name = f"shared-{tmp_path.name}"
    # Each run takes 1 s of real time, so that the two workers' trials overlap: the search's five
    # trials outlast the second worker's poll for the setup (every 2 s) several times over.
    procs = [subprocess.Popen([sys.executable, str(SIMULATED_TUNE), str(tmp_path / f"out{i}"), "--trials", "6",
                               "--storage", postgres_url, "--study-name", name, "--pace", "1.0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=tune_env())
             for i in (0, 1)]
    try:
        said = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, (i, said[i])
        assert postgres_url.split("@")[0].split(":")[-1] not in said[i]  # no password shown
    study = optuna.load_study(study_name=name, storage=open_storage(postgres_url, tmp_path))
    trials = study.get_trials(deepcopy=False)
    assert [t.user_attrs.get("role") for t in trials].count("baseline") == 1
    assert len({t.number for t in trials}) == len(trials)
    # --trials is the study's total; a worker whose trial was running when it was reached finishes it.
    assert 6 <= len([t for t in trials if t.state in FINISHED]) <= 7, [(t.number, t.state) for t in trials]
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    pids = {(t.user_attrs.get("worker") or {}).get("pid") for t in trials if t.user_attrs.get("role") != "baseline"}
    assert pids >= {p.pid for p in procs}, (pids, [p.pid for p in procs])
    for i in (0, 1):
        record = read_record(tmp_path / f"out{i}")
        assert "***" in record["study"]["storage"] and record["study"]["name"] == name
        assert not (tmp_path / f"out{i}" / "study.db").exists()  # the study lives in the server only


def test_a_failing_baseline_is_refused_and_leaves_the_folder_for_corrected_arguments(tmp_path):
    out = tmp_path / "out"

    def missing_data(changes: dict):
        return "crash", "FileNotFoundError: [Errno 2] No such file or directory: 'missing.tfrecord'"

    runner = SimulatedRunner(fail=missing_data)
    with pytest.raises(TuneError, match=r"baseline run failed \(crash\).*missing\.tfrecord"):
        tune(options(out), runner=runner)
    # No trial was left: the same folder takes corrected arguments, whose baseline runs (and fails) again.
    with pytest.raises(TuneError, match="missing.tfrecord"):
        tune(options(out, "--steps", "120"), runner=runner)
    assert [r.changes for r in runner.runs] == [{}, {}]


def test_a_study_that_holds_trials_refuses_another_command_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    tune(options(out, "--steps", "60", trials=2, confirm_rounds=2), runner=SimulatedRunner())
    runner = SimulatedRunner()
    with pytest.raises(CommandChanged) as caught:
        tune(options(out, "--steps", "70", trials=2, confirm_rounds=2), runner=runner)
    line = str(caught.value)
    assert "--steps 60" in line and "--steps 70" in line and "--study-name" in line, line
    assert runner.runs == []  # no baseline was profiled


def test_a_workload_without_an_input_wait_keeps_the_current_settings(tmp_path):
    # Compute only: loader workers change nothing, and the confirmation says so.
    record = tune(options(tmp_path / "out", trials=4), runner=SimulatedRunner(Workload(io_s=0.0, compute_s=0.005)))
    check_tune_record(read_record(tmp_path / "out"))
    assert record["baseline"]["verdict"] == "compute-bound", record["baseline"]
    assert record["recommendation"]["status"] == "keep-current", record["recommendation"]
    kept = load_config(tmp_path / "out" / "best.yaml")
    assert kept is None or kept.changes() == {}, (tmp_path / "out" / "best.yaml").read_text()


def test_the_time_budget_starts_no_trial_once_spent_on_the_runners_clock(tmp_path):
    # Each run spends 10 simulated seconds starting: the budget of 35 s is spent during trial 3.
    started_at = []
    runner = SimulatedRunner(start_s=10.0, on_run=lambda i, changes, work: started_at.append((work, runner.now)))
    record = tune(options(tmp_path / "out", trials=20, time_budget_s=35.0), runner=runner)
    search = [(work.name, at) for work, at in started_at if work.parent.name == "trials" and work.name.startswith("trial-")]
    assert search and all(at < 35.0 for _, at in search), started_at  # none started once it was spent
    assert len(finished(record)) == 1 + len(search) < 20, record["trials"]
    assert record["recommendation"] is not None  # the confirmation still ran


def test_a_search_the_time_budget_cut_short_says_so_in_its_last_line(tmp_path):
    # Each run spends 10 simulated seconds starting: a budget of 5 s is spent by the baseline.
    record = tune(options(tmp_path / "out", trials=8, time_budget_s=5.0), runner=SimulatedRunner(start_s=10.0))
    line = record["recommendation"]["line"]
    assert line.startswith("keep your current settings for now: no trial of the search ran, and the search was cut "
                           "short: 1 of 8 trials (the baseline included) ran before the time budget of 5 s "
                           "(knobs never tried: num_workers, "), line
    assert "raise --time-budget to about 90 s for all 8 (about 10 s a trial)" in line
    assert "no feasible trial beat the baseline" not in line
    # a budget that lets two trials of the search run: a found speed-up is still proven, and the note says
    # what the budget left out
    record = tune(options(tmp_path / "out2", trials=8, time_budget_s=25.0), runner=SimulatedRunner(start_s=10.0))
    assert record["recommendation"]["status"] == "faster"
    assert any(n.startswith("3 of 8 trials (the baseline included) ran before the time budget of 25 s")
               for n in record["notes"]), record["notes"]


def test_a_confirmation_a_budget_ended_is_undecided_with_its_candidate(tmp_path):
    record = tune(options(tmp_path / "out", trials=3, confirm_rounds=8, confirm_min_rounds=2, confirm_budget_s=25.0),
                  runner=SimulatedRunner(Workload(noise=0.2), start_s=10.0))
    rec = record["recommendation"]
    (entry,) = record["confirmation"]["candidates"]
    assert entry["decided_by"] == "time budget" and entry["speedup"] > 2
    assert rec["status"] == "undecided" and rec["config"] == {} and rec["candidate"]["trial"] == entry["trial"]
    assert rec["candidate"]["config"] == entry["config"] != {}
    assert rec["line"] == (f"undecided: trial {entry['trial']} measured {entry['speedup']:.2f}x in 2 rounds, too few "
                           "rounds to bound it, when the confirmation's time budget ended it before the interval "
                           "cleared 1.02x; keep your current settings for now, or run the same command again with a "
                           "larger --confirm-budget to decide it (the study keeps every trial)")
    assert "differ 1x" not in rec["line"] and "e+" not in rec["line"]
    kept = load_config(tmp_path / "out" / "best.yaml")  # the candidate is not the answer
    assert kept is None or kept.changes() == {}
    check_tune_record(read_record(tmp_path / "out"))
    from perfscope.reports.sections.tuning_headline import headline
    from perfscope.reports.sections.tuning_record import read

    assert headline(read(read_record(tmp_path / "out"))).startswith(
        f"Undecided, keep your current settings for now: trial {entry['trial']} measured")


def test_the_confirmation_budget_ends_its_rounds_on_the_runners_clock(tmp_path):
    runner = SimulatedRunner(start_s=10.0)
    record = tune(options(tmp_path / "out", trials=3, confirm_rounds=8, confirm_min_rounds=2, confirm_budget_s=25.0),
                  runner=runner)
    confirmation = record["confirmation"]
    # Round 1 (baseline and candidate: about 20 s) and round 2 start within the budget; no third.
    assert confirmation["rounds"] == 2 and confirmation["budget_s"] == 25.0, confirmation
    assert sum("confirm-" in str(r.work_dir) for r in runner.runs) == 4


def test_a_second_worker_waits_for_the_setup_on_an_injected_clock(tmp_path):
    from perfscope.testing.trials import CPU_FACTS
    from perfscope.tuner.space import build_space
    from perfscope.tuner.study import TuningStudy

    study = optuna.create_study(direction="maximize")
    session = TuningStudy(study, TrialSpec(script="train.py", script_args=()), tmp_path / "trials")
    now, polls = [0.0], []

    def sleep(seconds: float) -> None:  # no real waiting: the clock moves by what is slept
        polls.append(seconds)
        now[0] += seconds

    assert not session.wait_for_setup(10.0, 2.0, clock=lambda: now[0], sleep=sleep)
    assert polls == [2.0] * 5  # until the 10 s were spent, then one last look

    def set_up_by_the_other_worker(seconds: float) -> None:
        sleep(seconds)
        if len(polls) == 7:  # the other worker stores its setup during the second poll
            owner = TuningStudy(study, TrialSpec(script="train.py", script_args=()), tmp_path / "other")
            owner.store_setup(build_space(CPU_FACTS, {"io": 0.8, "compute": 0.2}, "io-bound"),
                              BaselineRun(value=100.0, unit="samples/s", step_values=[100.0], losses=[],
                               verdict="io-bound", fractions={}, facts=CPU_FACTS), guess=None)

    assert session.wait_for_setup(10.0, 2.0, clock=lambda: now[0], sleep=set_up_by_the_other_worker)
    assert len(polls) == 7 and session.space is not None


class _AfterProfileRunner(SimulatedRunner):
    """A simulated runner that records the spec of the recommendation's profile, and can make that
    run leave no trace (a script whose steps ran out)."""

    def __init__(self, *, no_trace: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.no_trace, self.after_specs = no_trace, []

    def run(self, spec, config, work_dir, **kwargs):
        outcome = super().run(spec, config, work_dir, **kwargs)
        if Path(work_dir).name.startswith("best-"):
            self.after_specs.append(spec)
            if self.no_trace:
                return dataclasses.replace(outcome, trace_files=[])
        return outcome


def test_the_recommendation_is_profiled_on_the_least_window_and_a_missing_profile_is_said(tmp_path):
    runner = _AfterProfileRunner()
    record = tune(options(tmp_path / "out", trials=4, target_rse=0.02), runner=runner)
    assert record["recommendation"]["status"] == "faster" and record["after"] is not None
    (spec,) = runner.after_specs
    assert spec.target_rse is None  # a many-times-faster run must leave steps for its profile
    runner = _AfterProfileRunner(no_trace=True)
    record = tune(options(tmp_path / "out2", trials=4), runner=runner)
    assert record["recommendation"]["status"] == "faster" and record["after"] is None
    assert any(n.startswith("the recommendation was not profiled, so there is no before/after comparison: its run "
                            "left no step to profile after 2 warm-up and 4 measured steps") for n in record["notes"])


def test_the_plan_is_told_up_front_at_the_baselines_pace(tmp_path, capsys):
    tune(options(tmp_path / "out", trials=4, confirm_rounds=6, confirm_min_rounds=3), runner=SimulatedRunner())
    lines = [line for line in capsys.readouterr().out.splitlines() if "the plan at the baseline's pace" in line]
    assert len(lines) == 1, lines
    assert re.fullmatch(r"perfscope: the plan at the baseline's pace \(\d+ s a run\): 3 more trial\(s\), about "
                        r"[\d.]+ min, then 3 to 6 confirmation rounds, about [\d.]+ to [\d.]+ min \(a busy machine "
                        r"takes longer\)", lines[0]), lines[0]


def test_a_cost_objective_proves_its_winner_cheaper_by_the_same_interval(tmp_path):
    out = tmp_path / "out"
    record = tune(options(out, trials=5, objective="cost", price_per_hour=4.0), runner=SimulatedRunner())
    rec, cost = record["recommendation"], record["cost"]
    assert rec["status"] == "faster" and record["objective"]["name"] == "cost"
    base = record["baseline"]["value"]  # samples/s; the simulated run is on a CPU: one machine priced
    assert cost["devices"] == 1 and cost["per"] == "1000 samples"
    assert cost["baseline"] == pytest.approx(4.0 / 3600 / base * 1000)
    assert cost["best"] == pytest.approx(cost["baseline"] / rec["speedup"])
    # the proof of the speed-up is the proof of the saving: 1 - 1/speed-up at each end of its interval
    assert cost["saving_low"] == pytest.approx(1 - 1 / rec["ci_low"]) and cost["saving_low"] > 0
    assert cost["saving_high"] == pytest.approx(1 - 1 / rec["ci_high"])
    from perfscope.tuner.objective import cost_line

    assert cost_line(cost).startswith("cost per 1,000 samples at $4.00/h x 1: ") and "saves" in cost_line(cost)
    check_tune_record(record)


def test_a_cost_objective_needs_a_price():
    with pytest.raises(ValueError, match="--objective cost needs --price-per-hour"):
        options(Path("/tmp/x/out"), objective="cost")
    with pytest.raises(ValueError, match="--objective must be one of time, cost, energy"):
        options(Path("/tmp/x/out"), objective="money")


def test_an_energy_objective_ranks_and_proves_by_samples_per_joule(tmp_path):
    # The simulated workload: every worker ends more of the wait but burns power of its own, so
    # the fewest joules a sample come at 4 workers, while time is as good at 4 as at 16.
    from perfscope.testing.trials import Workload

    work = Workload()
    assert min(range(1, 17), key=lambda n: work.step_joules({"num_workers": n})) == 4
    out = tmp_path / "out"
    record = tune(options(out, trials=8, objective="energy"), runner=SimulatedRunner())
    rec = record["recommendation"]
    assert record["objective"]["name"] == "energy" and record["objective"]["unit"] == "samples/J"
    base = record["baseline"]["value"]
    assert base == pytest.approx(16 / work.step_joules({}), rel=0.05)  # samples per joule of the baseline
    assert rec["status"] == "faster", rec
    winner = rec["config"]["num_workers"]
    assert rec["speedup"] == pytest.approx(work.step_joules({}) / work.step_joules({"num_workers": winner}), rel=0.05)
    assert "x more work per joule (" in rec["line"] and "faster" not in rec["line"]
    check_tune_record(record)


def test_an_energy_objective_without_a_counter_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFSCOPE_POWERCAP", str(tmp_path / "no-powercap"))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(PerfscopeError, match="--objective energy needs an energy counter.*no RAPL package"):
        tune(options(tmp_path / "out", objective="energy"))
