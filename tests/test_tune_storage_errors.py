"""The tuner's study storage (tuner/storage.py) when it cannot open: unknown schemes, unreachable
or refusing servers, missing drivers, folders that cannot be created or written; each a one-line
StorageError that never shows the password."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import optuna
import pytest

from perfscope.tuner import storage as tuner_storage
from perfscope.errors import PerfscopeError
from perfscope.tuner.storage import StorageError, open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
# fail_stale_trials and the retry callback's helpers are "experimental" in Optuna since 2.x.
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def one_line_storage_error(url: str | None, out_dir: Path) -> str:
    with pytest.raises(StorageError) as info:
        open_storage(url, out_dir)
    message = str(info.value)
    assert isinstance(info.value, PerfscopeError)
    assert message and "\n" not in message, message
    return message


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
    assert message.startswith("cannot open study storage postgresql://***@127.0.0.1:1/db: ")
    assert "Connection refused" in message or "connection" in message.lower()
    assert "secret" not in message


def test_password_in_the_query_is_hidden_too(tmp_path):
    message = one_line_storage_error("postgresql://u@127.0.0.1:1/db?password=secret", tmp_path)
    assert "password=***" in message and "secret" not in message


def test_unparsable_url_keeps_the_password_out(tmp_path):
    message = one_line_storage_error("postgresql://u:secret@host:notaport/db", tmp_path)
    assert message.startswith("cannot parse study storage URL postgresql://***@host:notaport/db")
    assert "secret" not in message


def test_refused_login_on_a_real_server(postgres_url, tmp_path):
    real_password = postgres_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    wrong = postgres_url.replace(f":{real_password}@", ":wrongsecret@")
    message = one_line_storage_error(wrong, tmp_path)
    assert message.startswith("cannot open study storage postgresql://***@127.0.0.1:")
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
            tuner_storage.os, "access",
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


def test_a_table_named_like_optunas_with_other_columns_is_named(tmp_path):
    import sqlalchemy

    from perfscope.tuner.storage_schema import foreign_tables

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE trials (a INTEGER)")
        connection.exec_driver_sql("CREATE TABLE invoices (b INTEGER)")  # not Optuna's name: left alone
    with engine.connect() as connection:
        assert foreign_tables(connection) == ["table trials has no column trial_id"]
    engine.dispose()


def test_optunas_own_tables_and_an_empty_database_are_no_foreign_tables(tmp_path):
    import sqlalchemy

    from perfscope.tuner.storage_schema import foreign_tables

    url = f"sqlite:///{tmp_path / 'study.db'}"
    for made in (False, True):
        if made:
            optuna.storages.RDBStorage(url).engine.dispose()
        engine = sqlalchemy.create_engine(url)
        with engine.connect() as connection:
            assert foreign_tables(connection) == []
        engine.dispose()
