"""The tuner's study storage (tuner/storage.py) shared by worker processes: two workers on one
study (journal file and a real PostgreSQL server), several processes opening an empty storage at
once, and the trial of a killed worker failed through the heartbeat and queued again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from storagekit import storage_url, study_name

from perfscope.tuner.storage import open_storage

ROOT = Path(__file__).resolve().parents[1]
WORKER_TIMEOUT_S = 120

optuna.logging.set_verbosity(optuna.logging.WARNING)
# fail_stale_trials and the retry callback's helpers are "experimental" in Optuna since 2.x.
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


# ---------------------------------------------------------------------------------------------
# Several workers on one study

WORKER = r"""
import os, sys, time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from perfscope.tuner.storage import open_storage

url, name, n_trials, barrier, parties = sys.argv[1:6]
optuna.logging.set_verbosity(optuna.logging.WARNING)
barrier = Path(barrier)
storage = open_storage(url, barrier)
study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)

# Start the search together: a worker that comes up late could find the study already finished.
(barrier / f"ready-{os.getpid()}").touch()
deadline = time.monotonic() + 60
while len(list(barrier.glob("ready-*"))) < int(parties):
    if time.monotonic() > deadline:
        sys.exit("the other workers never came up")
    time.sleep(0.005)


def objective(trial):
    x = trial.suggest_int("x", 0, 100)
    trial.set_user_attr("pid", os.getpid())
    time.sleep(0.02)
    return (x - 42) ** 2


study.optimize(
    objective,
    callbacks=[optuna.study.MaxTrialsCallback(int(n_trials), states=(TrialState.COMPLETE,))],
)
"""


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("kind", ["postgresql", "journal"])
def test_two_workers_share_one_study(kind, tmp_path, request):
    url = storage_url(kind, tmp_path, request)
    name, n_trials, workers = study_name(), 20, 2
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, name, str(n_trials), str(barrier), str(workers)],
            cwd=tmp_path, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=WORKER_TIMEOUT_S)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    trials = optuna.load_study(storage=open_storage(url, tmp_path), study_name=name).trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # MaxTrialsCallback stops a worker after the trial that reaches the target, so each other
    # worker may finish the one trial it was running: at most workers - 1 extra.
    assert n_trials <= len(complete) <= n_trials + workers - 1
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    numbers = [t.number for t in trials]
    assert len(set(numbers)) == len(numbers)
    assert sorted(numbers) == list(range(len(numbers)))
    assert {t.user_attrs["pid"] for t in complete} == {proc.pid for proc in procs}


OPENER = r"""
import os, sys, time
from pathlib import Path

from perfscope.tuner.storage import open_storage

url, barrier, parties = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
(barrier / f"ready-{os.getpid()}").touch()
deadline = time.monotonic() + 60
while len(list(barrier.glob("ready-*"))) < parties:  # all imported: open at the same moment
    if time.monotonic() > deadline:
        sys.exit("the other processes never came up")
    time.sleep(0.001)
open_storage(url, None)
"""


def fresh_database(postgres_url: str) -> str:
    """A new, empty database on the test server; its URL."""
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(
        postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1),
        isolation_level="AUTOCOMMIT",
    )
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    finally:
        engine.dispose()
    return postgres_url.rsplit("/", 1)[0] + "/" + name


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_workers_opening_an_empty_storage_together(kind, tmp_path, request):
    """Optuna's RDBStorage alone, started by three processes at the same moment on an empty
    database, fails for some of them (tables created twice, the schema version stamped twice);
    open_storage serializes that (a server lock; retries for SQLite)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"))
    script = tmp_path / "opener.py"
    script.write_text(OPENER)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen([sys.executable, str(script), url, str(barrier), "3"], cwd=tmp_path,
                         env=worker_env(), stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [proc.communicate(timeout=WORKER_TIMEOUT_S)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], "\n".join(errors)
    study = optuna.create_study(storage=open_storage(url, tmp_path))
    study.optimize(lambda t: t.suggest_int("x", 0, 1), n_trials=1)


# ---------------------------------------------------------------------------------------------
# A killed worker's trial is failed after the grace period and queued again

HANGING_WORKER = r"""
import sys, time
from pathlib import Path

import optuna

from perfscope.tuner.storage import open_storage

url, name, out, started = sys.argv[1:5]
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = open_storage(None if url == "-" else url, Path(out), heartbeat_interval=1,
                       grace_period=GRACE)
study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)


def objective(trial):
    trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    trial.suggest_categorical("amp", ["off", "bf16"])
    Path(started).write_text(str(trial.number))
    time.sleep(600)  # until killed
    return 0.0


study.optimize(objective, n_trials=1)
"""
GRACE_S = 3


def _killed_worker(url, tmp_path, name, out) -> float:
    """A worker killed inside its trial; returns when (monotonic)."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING_WORKER.replace("GRACE", str(GRACE_S)))
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [sys.executable, str(script), url or "-", name, str(out), str(started)],
        cwd=tmp_path, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while not started.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the worker never started its trial"
            time.sleep(0.05)
        time.sleep(0.2)  # past the trial's first heartbeat
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    return time.monotonic()


@pytest.mark.parametrize("kind", ["default", "postgresql"])
def test_a_worker_ending_inside_a_dead_workers_grace_fails_its_trial(kind, tmp_path, request):
    # The other worker ends its search right after the kill, well inside the grace period: its
    # last check found nothing stale, and the trial stayed RUNNING with no worker left.
    from perfscope.tuner.record import trial_entry
    from perfscope.tuner.study import TuningStudy

    url = storage_url(kind, tmp_path, request)
    out, name = tmp_path / "out", study_name()
    _killed_worker(url, tmp_path, name, out)
    storage = open_storage(url, out, heartbeat_interval=1, grace_period=GRACE_S)
    study = optuna.load_study(storage=storage, study_name=name)
    session = TuningStudy(study, None, tmp_path / "trials", storage=storage)
    said = []
    failed = session.settle_running_trials(say=said.append)
    assert [t.state for t in study.trials][:1] == [TrialState.FAIL]
    assert failed == [0] and trial_entry(study.trials[0], retried=True)["failure"]["kind"] == "lost"
    assert said and "waiting up to 4 s" in said[0]


@pytest.mark.parametrize("kind", ["default", "postgresql"])
def test_killed_workers_trial_is_failed_and_queued_again(kind, tmp_path, request):
    url = storage_url(kind, tmp_path, request)
    out, name = tmp_path / "out", study_name()
    killed_at = _killed_worker(url, tmp_path, name, out)

    storage = open_storage(url, out, heartbeat_interval=1, grace_period=GRACE_S)
    study = optuna.load_study(storage=storage, study_name=name)
    (trial,) = study.trials
    assert trial.state == TrialState.RUNNING
    optuna.storages.fail_stale_trials(study)
    if time.monotonic() - killed_at < 1.0:  # (a machine slow enough would be past the grace)
        assert study.trials[0].state == TrialState.RUNNING, "failed within the grace period"

    deadline = killed_at + GRACE_S + 30
    while study.trials[0].state == TrialState.RUNNING:
        assert time.monotonic() < deadline, "the stale trial was never failed"
        time.sleep(0.5)
        optuna.storages.fail_stale_trials(study)
    failed, retry = study.trials
    assert failed.state == TrialState.FAIL
    assert retry.state == TrialState.WAITING
    assert retry.params == failed.params
    assert RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == failed.number

    # The next worker runs the queued parameters.
    seen = []

    def objective(t):
        seen.append({"lr": t.suggest_float("lr", 1e-4, 1e-1, log=True),
                     "amp": t.suggest_categorical("amp", ["off", "bf16"])})
        return 1.0

    study.optimize(objective, n_trials=1)
    assert seen == [failed.params]
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
