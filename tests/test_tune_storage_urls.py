"""The tuner's study storage (tuner/storage.py): every URL form (the default SQLite file, sqlite:,
journal files, PostgreSQL in three spellings) opens with the heartbeat settings and keeps a
study's trial, and a URL is described with its password hidden."""

from __future__ import annotations

import optuna
import pytest
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalStorage
from optuna.trial import TrialState
from storagekit import storage_url, study_name

from perfscope.tuner.storage import (
    GRACE_PERIOD,
    HEARTBEAT_INTERVAL,
    describe_storage,
    open_storage,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
# fail_stale_trials and the retry callback's helpers are "experimental" in Optuna since 2.x.
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


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
        "postgresql://***@db.example:5432/opt"
    )
    assert describe_storage("mysql+pymysql://u:s%40cr@t@h/db") == "mysql+pymysql://***@h/db"
    assert describe_storage("postgresql://u@h/db?password=secret&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    assert describe_storage("postgresql://h/db") == "postgresql://h/db"
    assert describe_storage("journal:/tmp/x.log") == "journal:/tmp/x.log"
    assert describe_storage(None, tmp_path) == f"sqlite:///{tmp_path.absolute() / 'study.db'}"


@pytest.mark.parametrize("url, shown, secret", [
    ("postgresql://u:pa ss\tword@h:5432/db", "postgresql://***@h:5432/db", "pa ss\tword"),  # \S* stopped at the space
    ("postgresql://u:x@h/db?sslpassword=key pass&sslmode=require",
     "postgresql://***@h/db?sslpassword=***&sslmode=require", "key pass"),
    ("postgresql://u@h/db?sslpassword=a%20b", "postgresql://u@h/db?sslpassword=***", "a b"),
    ("postgresql://u:p@h/pdb?application_name=p", "postgresql://***@h/pdb?application_name=***", None),  # "p" alone, not in "pdb"
    ("postgresql://u:pw@h/db?pass%77ord=topsecret9", "postgresql://***@h/db?pass%77ord=***", "topsecret9"),  # key encoded
])
def test_every_password_the_url_parser_finds_is_masked_whole(url, shown, secret):
    from perfscope.redact import redact, url_secrets

    assert describe_storage(url) == shown
    if secret is not None:  # a driver's message quoting the password, decoded
        said = f"connection failed for user u with {secret!s}: authentication failed"
        assert secret not in redact(said, secrets=url_secrets(url))


def test_a_connection_string_nested_in_a_parameter_is_masked():
    url = "mssql+pyodbc:///?odbc_connect=DRIVER%3D%7BODBC%7D%3BUID%3Du%3BPWD%3Dtopsecret9"
    assert "topsecret9" not in describe_storage(url)
    assert "topsecret9" not in describe_storage("postgresql://u@h/db?dsn=host%3Dh%20password%3Dtopsecret9")
