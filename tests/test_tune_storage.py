"""The tuner's study storage (tuner/storage.py): every URL form opens, errors are one line without
passwords, two worker processes share one study (journal file and a real PostgreSQL server), and
the trial of a killed worker is failed and queued again through the heartbeat."""

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
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalStorage
from optuna.trial import TrialState

import tuner.storage
from perfscope.errors import PerfscopeError
from tuner.storage import (
    GRACE_PERIOD,
    HEARTBEAT_INTERVAL,
    StorageError,
    describe_storage,
    open_storage,
)

ROOT = Path(__file__).resolve().parents[1]
WORKER_TIMEOUT_S = 120

optuna.logging.set_verbosity(optuna.logging.WARNING)
# fail_stale_trials and the retry callback's helpers are "experimental" in Optuna since 2.x.
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def study_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def storage_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str | None:
    """The URL of each form for the storage of ``kind`` (None: the default in ``tmp_path/out``)."""
    if kind == "default":
        return None
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'study.db'}"
    if kind == "journal":
        return f"journal:{tmp_path / 'new-folder' / 'study'}"
    if kind == "journal-suffix":
        return str(tmp_path / "study.journal")
    url = request.getfixturevalue("postgres_url")
    if kind == "postgresql+psycopg2":
        return url.replace("postgresql://", "postgresql+psycopg2://", 1)
    if kind == "postgres":  # the libpq / Heroku spelling
        return url.replace("postgresql://", "postgres://", 1)
    assert kind == "postgresql"
    return url


def one_line_storage_error(url: str | None, out_dir: Path) -> str:
    with pytest.raises(StorageError) as info:
        open_storage(url, out_dir)
    message = str(info.value)
    assert isinstance(info.value, PerfscopeError)
    assert message and "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------
# Every URL form opens and keeps a study


@pytest.mark.parametrize(
    "kind",
    ["default", "sqlite", "journal", "journal-suffix", "postgresql", "postgresql+psycopg2",
     "postgres"],
)
def test_each_url_form_round_trips_a_trial(kind, tmp_path, request):
    url = storage_url(kind, tmp_path, request)
    out = tmp_path / "out"
    name = study_name()
    storage = open_storage(url, out)
    if kind.startswith("journal"):
        assert isinstance(storage, JournalStorage)
    else:
        assert isinstance(storage, RDBStorage)
        assert storage.heartbeat_interval == HEARTBEAT_INTERVAL
        assert storage.grace_period == GRACE_PERIOD
        assert isinstance(storage.heartbeat_stale_trial_callback, RetryHeartbeatStaleTrialCallback)
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize")

    def objective(trial):
        trial.set_user_attr("role", "search")
        return trial.suggest_int("x", 3, 3) * 1.5

    study.optimize(objective, n_trials=1)

    again = optuna.load_study(storage=open_storage(url, out), study_name=name)
    (trial,) = again.trials
    assert trial.state == TrialState.COMPLETE
    assert trial.params == {"x": 3} and trial.value == 4.5
    assert trial.user_attrs == {"role": "search"}
    if kind == "default":
        assert (out / "study.db").is_file()
    if kind == "journal":
        assert (tmp_path / "new-folder" / "study").is_file()


def test_open_storage_accepts_short_heartbeat_for_tests(tmp_path):
    storage = open_storage(None, tmp_path, heartbeat_interval=1, grace_period=2)
    assert (storage.heartbeat_interval, storage.grace_period) == (1, 2)


def test_describe_storage_hides_passwords(tmp_path):
    assert describe_storage("postgresql://u:secret@db.example:5432/opt") == (
        "postgresql://u:***@db.example:5432/opt"
    )
    assert describe_storage("mysql+pymysql://u:s%40cr@t@h/db") == "mysql+pymysql://u:***@h/db"
    assert describe_storage("postgresql://u@h/db?password=secret&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    assert describe_storage("postgresql://h/db") == "postgresql://h/db"
    assert describe_storage("journal:/tmp/x.log") == "journal:/tmp/x.log"
    assert describe_storage(None, tmp_path) == f"sqlite:///{tmp_path.absolute() / 'study.db'}"


# ---------------------------------------------------------------------------------------------
# Errors: one line, no password


@pytest.mark.parametrize("url", ["redis://u:secret@localhost/0", "ftp://x/y", "mongodb+srv://u:secret@h"])
def test_unknown_scheme_lists_the_accepted_forms(url, tmp_path):
    message = one_line_storage_error(url, tmp_path)
    assert "unknown study storage" in message
    for form in ("sqlite:///", "postgresql://", "mysql://", "journal:PATH", ".log", ".journal"):
        assert form in message
    assert "secret" not in message


def test_a_bare_database_file_gets_a_hint(tmp_path):
    message = one_line_storage_error("study.db", tmp_path)
    assert "did you mean sqlite:///study.db?" in message


def test_unreachable_server_names_the_url_without_password(tmp_path):
    message = one_line_storage_error("postgresql://u:secret@127.0.0.1:1/db", tmp_path)
    assert message.startswith("cannot open study storage postgresql://u:***@127.0.0.1:1/db: ")
    assert "Connection refused" in message or "connection" in message.lower()
    assert "secret" not in message


def test_password_in_the_query_is_hidden_too(tmp_path):
    message = one_line_storage_error("postgresql://u@127.0.0.1:1/db?password=secret", tmp_path)
    assert "password=***" in message and "secret" not in message


def test_unparsable_url_keeps_the_password_out(tmp_path):
    message = one_line_storage_error("postgresql://u:secret@host:notaport/db", tmp_path)
    assert message.startswith("cannot parse study storage URL postgresql://u:***@host:notaport/db")
    assert "secret" not in message


def test_refused_login_on_a_real_server(postgres_url, tmp_path):
    real_password = postgres_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    wrong = postgres_url.replace(f":{real_password}@", ":wrongsecret@")
    message = one_line_storage_error(wrong, tmp_path)
    assert message.startswith("cannot open study storage postgresql://perfscope:***@127.0.0.1:")
    assert "password authentication failed" in message
    assert "wrongsecret" not in message and real_password not in message


@pytest.mark.parametrize("url", ["postgresql://u:secret@127.0.0.1:1/db",
                                 "postgresql+psycopg2://u:secret@127.0.0.1:1/db"])
def test_missing_postgresql_driver_says_what_to_install(url, tmp_path, monkeypatch):
    # None in sys.modules makes `import psycopg2` raise ModuleNotFoundError, as if not installed.
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    message = one_line_storage_error(url, tmp_path)
    assert message == "postgresql needs psycopg2: pip install psycopg2-binary"


def test_missing_mysql_driver_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    message = one_line_storage_error("mysql://u:secret@127.0.0.1:1/db", tmp_path)
    assert message == "mysql needs MySQLdb: pip install mysqlclient"


@pytest.mark.parametrize("form", ["default", "sqlite", "journal"])
def test_folder_that_cannot_be_created(form, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    folder = blocker / "out"
    url = {"default": None, "sqlite": f"sqlite:///{folder / 'study.db'}",
           "journal": f"journal:{folder / 'study.log'}"}[form]
    message = one_line_storage_error(url, folder)
    assert message.startswith("cannot create the folder of study storage sqlite:///"
                              if form != "journal" else "cannot create the folder of study storage journal:")
    assert str(blocker) in message


@pytest.mark.parametrize("form", ["default", "journal"])
def test_folder_that_cannot_be_written(form, tmp_path, monkeypatch):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: make the check see what another user would
        real_access = os.access
        monkeypatch.setattr(
            tuner.storage.os, "access",
            lambda path, mode: real_access(path, mode) and not (
                Path(path) == folder and mode & os.W_OK),
        )
    try:
        url = None if form == "default" else f"journal:{folder / 'study.log'}"
        message = one_line_storage_error(url, folder)
        assert f"folder {folder} is not writable" in message
    finally:
        folder.chmod(0o700)


def test_a_folder_is_not_a_storage_file(tmp_path):
    message = one_line_storage_error(f"sqlite:///{tmp_path}", tmp_path)
    assert "is a folder, not a file" in message


# ---------------------------------------------------------------------------------------------
# Several workers on one study

WORKER = r"""
import os, sys, time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.storage import open_storage

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

from tuner.storage import open_storage

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

from tuner.storage import open_storage

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


@pytest.mark.parametrize("kind", ["default", "postgresql"])
def test_killed_workers_trial_is_failed_and_queued_again(kind, tmp_path, request):
    url = storage_url(kind, tmp_path, request)
    out, name = tmp_path / "out", study_name()
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
    killed_at = time.monotonic()

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
