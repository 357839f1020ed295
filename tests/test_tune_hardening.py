"""`perfscope tune` against hostile scripts, folders, storages and options: a trial's output is
bounded and its failure named, a second tuner on one folder is refused, earlier results are never
silently replaced, passwords stay out of messages, a storage that is not Optuna's, a changed
measurement and a dead worker's trial are told, and every numeric option has a range."""

from __future__ import annotations

import builtins
import errno
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState
from storagekit import study_name
from tunekit import ROOT, copy_script, read_record, run_tune, stderr_lines, wait_no_processes, wait_until

from perfscope.tuner.attrs import BaselineRun
from perfscope.tuner import failure as tuner_failure
from perfscope.runtime.config import load_config
from perfscope.tuner.command import check_same_command
from perfscope.tuner.failure import failure_line, seconds_text
from perfscope.outlock import FolderBusy, FolderLock
from perfscope.tuner.output import OutputLog
from perfscope.tuner.record import trial_entry
from perfscope.tuner.results import RunOutputs
from perfscope.tuner.storage import open_storage
from perfscope.tuner.study import CATCH, SPACE_ATTR
from perfscope.tuner.trial import TrialSpec, run_trial
from perfscope.tuner.tune import _note_outputs, _note_stale
from conftest import HANG_TIMEOUT_S  # noqa: E402

CHATTY = ROOT / "tests" / "scripts" / "tune_chatty.py"
SMALL_LOG = {"output_keep_bytes": 64 * 1024, "output_limit_bytes": 1024 * 1024}

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def chatty_spec(tmp_path: Path, *args: str, **kwargs) -> TrialSpec:
    """A trial of a private copy of tune_chatty.py (its processes can be told apart) with a small log."""
    script = copy_script(CHATTY, tmp_path / "s")
    return TrialSpec(script=str(script), script_args=args, warmup_steps=1, measure_steps=1, profile_steps=0,
                     timeout_s=kwargs.pop("timeout_s", 60), **{**SMALL_LOG, **kwargs})


FACTS = {"cuda": False, "cpu_count": 2, "world_size": 1, "local_world_size": 1, "ddp": None,
         "dataloader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False},
         "accelerate": {"called": False}}


def chatty_study(tmp_path: Path, *args: str, storage=None):
    """(study, TuningStudy) set up as after a baseline, whose trials run tune_chatty.py ARGS."""
    from perfscope.tuner.space import build_space
    from perfscope.tuner.study import TuningStudy

    study = optuna.create_study(storage=storage, study_name=study_name(), direction="maximize")
    session = TuningStudy(study, chatty_spec(tmp_path, *args), tmp_path / "trials", storage=storage)
    session.store_setup(build_space(FACTS, {"io": 0.5, "compute": 0.5}, "io-bound"),
                        BaselineRun(value=100.0, unit="samples/s", step_values=[100.0], losses=[],
                         verdict="io-bound", fractions={}, facts=FACTS), guess=None)
    return study, session


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = stderr_lines(done.stderr)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("perfscope: error: "), lines
    return lines[0]


# ---------------------------------------------------------------------------------------------
# 1. A trial's output is bounded


def test_a_flooding_trial_is_stopped_and_failed_with_its_log_bounded(tmp_path):
    outcome = run_trial(chatty_spec(tmp_path, "flood"), None, tmp_path / "t")
    assert outcome.status == "output", (outcome.status, outcome.reason)
    assert "more than 1 MB of output" in outcome.reason
    log = tmp_path / "t" / "output.log"
    assert log.stat().st_size <= 64 * 1024 + 200  # the kept part and its header line
    assert log.read_text().startswith("[perfscope: the script wrote ")
    assert not (tmp_path / "t" / "output.log.1").exists()
    assert not wait_no_processes(tmp_path / "s")


def test_the_last_part_of_a_long_output_is_kept(tmp_path):
    outcome = run_trial(chatty_spec(tmp_path, "lines", "3000"), None, tmp_path / "t")  # 300 kB, exit status 3
    assert outcome.status == "crash" and "line 000002999" in outcome.reason, outcome.reason
    text = (tmp_path / "t" / "output.log").read_text()
    assert text.splitlines()[-1].startswith("line 000002999")
    assert "line 000000000" not in text and len(text) <= 64 * 1024 + 200


@pytest.mark.parametrize("where", ["writing", "creating"])
def test_a_log_that_cannot_be_written_fails_the_trial_and_the_study_goes_on(tmp_path, monkeypatch, where):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(OutputLog, "_write" if where == "writing" else "start", disk_full)
    study, session = chatty_study(tmp_path, "lines", "10")
    study.enqueue_trial({"num_workers": 1, "prefetch_factor": 2})
    study.enqueue_trial({"num_workers": 2, "prefetch_factor": 2})
    study.optimize(session.objective, n_trials=2, catch=CATCH)  # each trial failed on its own
    for t in study.get_trials()[1:]:
        assert t.state == TrialState.FAIL and t.value is None and t.user_attrs["feasible"] is False, t.state
        assert t.user_attrs["failure"]["kind"] == "output", t.user_attrs["failure"]
        assert "No space left on device" in t.user_attrs["failure"]["reason"]


def test_the_failure_reason_reads_only_the_end_of_the_log(tmp_path, monkeypatch):
    log = tmp_path / "output.log"
    with open(log, "wb") as f:
        f.truncate(8 * 1024**3)  # 8 GB, sparse
        f.seek(0, os.SEEK_END)
        f.write(b"\nRuntimeError: boom\n")
    read = []
    real_open = builtins.open

    def counting_open(*args, **kwargs):
        f = real_open(*args, **kwargs)
        real_read = f.read

        def read_some(n=-1):
            data = real_read(n)
            read.append(len(data))
            return data

        f.read = read_some
        return f

    monkeypatch.setattr(tuner_failure, "open", counting_open, raising=False)
    assert failure_line(log) == "RuntimeError: boom"
    assert sum(read) <= tuner_failure.TAIL_BYTES


# ---------------------------------------------------------------------------------------------
# 12. The failure reason is the error, and a kill from outside is named


@pytest.mark.parametrize("text, expected", [
    # a warning after the error: its source line is not the reason
    ("error: shard 7 is corrupt\n/x/y.py:3: UserWarning: deprecated\n  warnings.warn('deprecated')\n",
     "error: shard 7 is corrupt"),
    # the exception line of the last traceback, not the warning printed after it
    ("Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n    f()\nValueError: bad shape\n"
     "/x/y.py:3: UserWarning: leaked semaphore\n  warnings.warn('leaked')\n", "ValueError: bad shape"),
    ("Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'x'\n\nDuring handling of the above "
     "exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"b.py\", line 2\n"
     "RuntimeError: while loading\n[W1201 torch] some C++ warning\n", "RuntimeError: while loading"),
    ("epoch 1 loss 0.3\nepoch 2 loss 0.2\nW1201 12:00:00 warning from torch\n", "epoch 2 loss 0.2"),
])
def test_the_failure_reason_is_the_error_line(tmp_path, text, expected):
    log = tmp_path / "output.log"
    log.write_text(text)
    assert failure_line(log) == expected


def test_a_warning_after_the_error_does_not_become_the_reason(tmp_path):
    outcome = run_trial(chatty_spec(tmp_path, "warn-after-error"), None, tmp_path / "t")
    assert outcome.status == "crash"
    assert outcome.reason == "error: the dataset shard /data/shard-7 is corrupt", outcome.reason


def test_a_trial_killed_from_outside_is_killed_possibly_out_of_memory(tmp_path):
    outcome = run_trial(chatty_spec(tmp_path, "sigkill"), None, tmp_path / "t")
    assert outcome.status == "killed", (outcome.status, outcome.reason)
    assert "SIGKILL" in outcome.reason and "out-of-memory" in outcome.reason


def test_durations_never_round_to_zero():
    assert seconds_text(0.001) == "0.001 s" and seconds_text(1.5) == "1.5 s" and seconds_text(900.2) == "900 s"


# ---------------------------------------------------------------------------------------------
# 14. Every numeric option has a range; empty --out and --study-name are refused


@pytest.mark.parametrize("option, value, allowed", [
    ("--trials", "0", "2 to 10,000"), ("--trials", "-5", "2 to 10,000"), ("--trials", "1", "2 to 10,000"),
    ("--trials", str(10**30), "2 to 10,000"), ("--steps-per-trial", "1e23", "1 to 100,000"),
    ("--steps-per-trial", "0", "1 to 100,000"), ("--warmup-steps", str(10**12), "0 to 100,000"),
    ("--profile-steps", "100000", "0 to 100"), ("--nproc-per-node", "100000", "1 to 1,024"),
    ("--confirm-top", "0", "1 to 100"), ("--confirm-rounds", "1", "2 to 1,000"),
    ("--seed", str(2**32), "0 to 4,294,967,295"), ("--trial-timeout", "0.001", "seconds from 1 to 604800"),
    ("--trial-timeout", "inf", "seconds from 1 to 604800"), ("--time-budget", "nan", "seconds from 1 to 2.592e+06"),
    ("--min-gain", "-0.1", "fraction"), ("--min-gain", "10", "below 10"),
])
def test_numeric_options_are_bounded_in_one_line(tmp_path, option, value, allowed):
    done = run_tune(str(ROOT / "examples" / "io_bound.py"), "--out", str(tmp_path / "out"), option, value,
                    timeout=HANG_TIMEOUT_S)
    line = one_error_line(done)
    assert f"argument {option}: must be " in line and allowed in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", ["--out", "--study-name"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_out_or_study_name_is_refused(tmp_path, option, value):
    done = run_tune(str(ROOT / "examples" / "io_bound.py"), option, value, timeout=HANG_TIMEOUT_S, cwd=tmp_path)
    line = one_error_line(done)
    assert f"argument {option}: must not be empty" in line, line
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder


# ---------------------------------------------------------------------------------------------
# 6. Passwords stay out of messages


@pytest.mark.parametrize("url", ["postgresql//user:s3cretpw@127.0.0.1:1/db", "postgresql:/user:s3cretpw@127.0.0.1:1/db",
                                 "postgresql://user:s3cret@pw@127.0.0.1:1/db", "mysql://user:s3cret@pw@host.invalid/db",
                                 "postgresql://user:s3cret@pw@host.invalid/db"])
def test_a_mistyped_storage_url_never_shows_its_password(tmp_path, url):
    done = run_tune(str(ROOT / "examples" / "io_bound.py"), "--out", str(tmp_path / "out"), "--storage", url,
                    timeout=HANG_TIMEOUT_S)
    line = one_error_line(done)
    assert "s3cret" not in done.stdout + done.stderr and "pw@" not in line, line
    assert "//***@" in line or ":/***@" in line, line
    if url.count("@") > 1:
        assert "%40" in line and "host name" not in line, line


@pytest.mark.parametrize("text, expected", [
    ("postgresql://u:pw@h/db", "postgresql://***@h/db"),
    ("postgresql//u:pw@h/db", "postgresql//***@h/db"),
    ("could not connect to 'mysql+pymysql://u:p@ss:w/rd@h:3306/db' (timeout)",
     "could not connect to 'mysql+pymysql://***@h:3306/db' (timeout)"),
    ("dsn: host=h password=pw dbname=x", "dsn: host=h password=*** dbname=x"),
    ("postgresql://u@h/db?password=pw&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
    ("no password here: postgresql://h/db at 10:30, mail me@example.com", None),
    # Passwords SQLAlchemy accepts unencoded: a leading slash, quotes, brackets.
    ("cannot open postgresql://u:/pw5secret@127.0.0.1:1/db: refused", "cannot open postgresql://***@127.0.0.1:1/db: refused"),
    ("postgresql://u:pw'x\"y<z@h/db", "postgresql://***@h/db"),
])
def test_redact_masks_userinfo_in_any_text(text, expected):
    from perfscope.redact import redact

    assert redact(text) == (text if expected is None else expected)


def test_a_password_the_script_prints_stays_out_of_the_failure_reason(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("Traceback (most recent call last):\n  File \"t.py\", line 1\n"
                   "OperationalError: cannot reach postgresql://app:hunter2@db/x\n")
    assert failure_line(log) == "OperationalError: cannot reach postgresql://***@db/x"


# ---------------------------------------------------------------------------------------------
# 3. One tuner per output folder; a run's outputs are one unit


def test_a_second_tuner_on_one_output_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    with FolderLock(out):  # as a running tuner holds it
        for target in (out, out / "tuned.yaml"):  # the folder, or a YAML file in it
            done = run_tune(str(ROOT / "examples" / "io_bound.py"), "--out", str(target), timeout=HANG_TIMEOUT_S)
            line = one_error_line(done)
            assert f"output folder {out} is in use by another perfscope run (PID {os.getpid()})" in line, line
        assert not (out / "study.db").exists()  # refused before the study is opened
    with FolderLock(out):  # released when its holder ends
        pass


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    with FolderLock(tmp_path), pytest.raises(FolderBusy, match=f"PID {os.getpid()}"):
        FolderLock(tmp_path).acquire()


def earlier_proven_run(out: Path) -> None:
    """The outputs of an earlier run that proved num_workers=4 (best/, diff.html included)."""
    from tunereportkit import realistic

    from perfscope.tuner import record as tune_record

    out.mkdir(parents=True, exist_ok=True)
    (out / "best.yaml").write_text("# perfscope tune train.py: 9.56x faster\nnum_workers: 4\n")
    tune_record.write_outputs(out, realistic(), best=out / "best.yaml")
    (out / "diff.html").write_text("<html>B is 9.56x faster</html>")
    (out / "best").mkdir()
    (out / "best" / "summary.json").write_text("{}")


def keep_current_record() -> tuple[dict, dict]:
    from tunereportkit import keep_current

    record = keep_current()
    return record, record["recommendation"]


def test_a_keep_current_run_never_silently_replaces_a_proven_best_yaml(tmp_path):
    out = tmp_path / "out"
    earlier_proven_run(out)
    record, recommendation = keep_current_record()
    outputs, notes = RunOutputs(out, out / "best.yaml"), []
    _note_outputs(outputs, recommendation, notes)
    record["notes"] = notes
    outputs.write(record, recommendation, comment="keep your current settings")

    # This run's unit only: its tune.json and report, an empty best.yaml, no diff or best profile of another run.
    assert load_config(out / "best.yaml").changes() == {}
    assert read_record(out)["recommendation"]["status"] == "keep-current"
    assert not (out / "diff.html").exists() and not (out / "best").exists()
    # The earlier run's unit, whole, in previous/.
    previous = out / "previous"
    assert load_config(previous / "best.yaml").num_workers == 4
    assert (previous / "diff.html").read_text() == "<html>B is 9.56x faster</html>"
    assert read_record(previous)["recommendation"]["status"] == "faster"
    assert (previous / "best" / "summary.json").is_file() and (previous / "report.html").is_file()
    said = " ".join(read_record(out)["notes"])
    assert "num_workers=4" in said and str(previous) in said and "did not confirm" in said, said


def test_an_interrupted_run_leaves_no_mix_and_a_later_answer_says_where_the_proven_one_is(tmp_path):
    out = tmp_path / "out"
    earlier_proven_run(out)
    record, _ = keep_current_record()
    record["recommendation"] = None  # interrupted before the confirmation ended
    RunOutputs(out, out / "best.yaml").write(record, None)
    assert not (out / "best.yaml").exists() and not (out / "diff.html").exists()
    assert "best_config" not in read_record(out)
    assert load_config(out / "previous" / "best.yaml").num_workers == 4

    record, recommendation = keep_current_record()  # the resumed run ends with "keep"
    outputs, notes = RunOutputs(out, out / "best.yaml"), []
    _note_outputs(outputs, recommendation, notes)
    outputs.write(record, recommendation)
    assert load_config(out / "previous" / "best.yaml").num_workers == 4  # still there
    assert any("num_workers=4" in n and "previous" in n for n in notes), notes


# ---------------------------------------------------------------------------------------------
# 12. A storage that is not Optuna's; a resumed study measured otherwise; a dead worker's trial


@pytest.mark.parametrize("table", ["CREATE TABLE studies (a INTEGER)", "CREATE TABLE version_info (a TEXT)"])
def test_a_foreign_table_in_study_db_is_a_storage_error(tmp_path, table):
    out = tmp_path / "out"
    out.mkdir()
    with sqlite3.connect(out / "study.db") as db:
        db.execute(table)
    done = run_tune(str(ROOT / "examples" / "io_bound.py"), "--out", str(out), timeout=HANG_TIMEOUT_S)
    line = one_error_line(done)
    assert "cannot use study storage sqlite:///" in line and "not Optuna's" in line, line
    assert "internal error" not in line


@pytest.mark.parametrize("option, value", [("--steps-per-trial", "4"), ("--warmup-steps", "1"), ("--seed", "7"),
                                           ("--target-rse", "0.1")])
def test_resuming_with_another_measurement_is_refused(tmp_path, option, value):
    script = copy_script(CHATTY, tmp_path / "s")
    out = tmp_path / "out"
    out.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name="tune-tune_chatty",
                                direction="maximize")
    made = SimpleNamespace(script=str(script), script_args=("lines", "10"), nproc_per_node=None, warmup_steps=3,
                           measure_steps=8, seed=0, target_rse=0.05, measure_cap_s=20.0,
                           study_name="tune-tune_chatty")
    check_same_command(study, made, space_attr=SPACE_ATTR)
    study.add_trial(optuna.trial.create_trial(value=1.0))  # it holds a measured trial
    done = run_tune(str(script), "--out", str(out), option, value, "--", "lines", "10", timeout=HANG_TIMEOUT_S)
    line = one_error_line(done)
    default = {"--steps-per-trial": "8", "--warmup-steps": "3", "--seed": "0", "--target-rse": "0.05"}[option]
    assert f"measures its trials with {option} {default}, not {value}" in line, line
    assert not (out / "trials").exists()  # nothing ran


@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask() stands in for a worker
def test_a_dead_workers_trial_is_failed_and_queued_again_before_the_end(postgres_url, tmp_path):
    storage = open_storage(postgres_url, tmp_path, heartbeat_interval=1, grace_period=2)
    study, session = chatty_study(tmp_path, "lines", "1", storage=storage)
    # A worker that started a trial and was killed: the trial is RUNNING, its heartbeat stopped.
    trial = study.ask()
    params = session.space.suggest(trial)
    trial.set_user_attr("config", session.space.to_config(params).changes())
    study_id = storage.get_study_id_from_name(study.study_name)
    storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))
    time.sleep(2 + 1)  # past the grace period (2 s), with a margin: the trial is stale

    notes: list[str] = []
    _note_stale(session, notes)
    dead = study.get_trials()[trial.number]
    assert dead.state == TrialState.FAIL, dead.state
    failure = trial_entry(dead, retried=True)["failure"]
    assert failure["kind"] == "lost" and "heartbeats" in failure["reason"], failure
    (again,) = study.get_trials(states=(TrialState.WAITING,))
    assert again.params == dead.params
    assert notes and f"trial(s) {trial.number}" in notes[0] and "heartbeats" in notes[0], notes
    assert not study.get_trials(states=(TrialState.RUNNING,))
    # No longer a "twin" of new proposals (the baseline may be one, where the sampler drew its settings).
    assert session.same_config_trial(-1, dead.user_attrs["config"]) in (None, 0)
