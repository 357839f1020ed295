"""Where a tuning study lives: ``perfscope tune --storage URL`` opened as an Optuna storage.

The URL forms (:func:`open_storage`):

``None`` (no ``--storage``)
    ``sqlite:///OUT/study.db``, a SQLite file in the output folder. Running the same command again
    resumes the study. One worker.
``journal:PATH``, or a path ending ``.log`` or ``.journal``
    Optuna's journal file storage (an append-only log with a file lock): several workers on
    **one machine** (or on a file system with working symbolic-link locks). The folder is created.
    A relative path is relative to the current directory; ``journal:///abs/path`` also works.
``sqlite:///PATH``
    A SQLite file (``sqlite:////abs/path.db`` for an absolute path). One machine; prefer
    ``journal:`` for several workers, since SQLite serializes every writer.
``postgresql://USER:PASS@HOST[:PORT]/DB`` (also ``postgresql+psycopg2://``, ``postgres://``)
    A PostgreSQL database: several workers on **several machines**. Needs ``psycopg2``
    (``pip install psycopg2-binary``, the ``postgres`` extra); plain ``postgresql://`` falls
    back to psycopg 3 when only that is installed.
``mysql://USER:PASS@HOST[:PORT]/DB`` (also ``mysql+pymysql://`` ...)
    A MySQL / MariaDB database, likewise. Needs the driver named after ``+`` (``mysqlclient`` for
    plain ``mysql://``).

Every SQL storage (``sqlite``, ``postgresql``, ``mysql``, the default included) runs with a
heartbeat: a running trial records a heartbeat every :data:`HEARTBEAT_INTERVAL` seconds, and a
trial whose heartbeat is older than :data:`GRACE_PERIOD` (its worker was killed, its machine lost)
is marked failed by the next worker that starts a trial, which then queues the same parameters
again once (:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`). Journal files have no
heartbeat in Optuna: a killed worker's trial stays ``RUNNING`` there.

Every failure to open a storage is a :class:`StorageError`, one line, with any password of the URL
replaced by ``***`` (:func:`describe_storage` gives the URL as it may be printed or recorded).
"""

from __future__ import annotations

import importlib.util
import os
import random
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalStorage

from perfscope.errors import PerfscopeError
from perfscope.redact import host_has_at, redact, url_secrets
from perfscope.tuner.storage_schema import foreign_tables
from perfscope.tuner.storage_text import db_reason, first_line, os_reason

HEARTBEAT_INTERVAL = 20
"""Seconds between two heartbeats of a running trial (SQL storages)."""
GRACE_PERIOD = 60
"""Seconds without a heartbeat after which a running trial is failed and queued again."""
MAX_RETRY = 1
"""How many times the parameters of a trial whose worker died are queued again."""
CONNECT_TIMEOUT = 10
"""Seconds a database server has to accept the connection (PostgreSQL and MySQL drivers)."""
DEFAULT_FILE = "study.db"
"""The default storage's file name in the output folder."""
JOURNAL_SUFFIXES = (".log", ".journal")
"""File name endings read as a journal file without the ``journal:`` prefix."""

ACCEPTED = (
    "sqlite:///PATH, postgresql://USER:PASS@HOST[:PORT]/DB, mysql://USER:PASS@HOST[:PORT]/DB, "
    "or journal:PATH (a path ending .log or .journal works too)"
)
_RDB_BACKENDS = ("sqlite", "postgresql", "mysql")
# The pip package of each database driver (DBAPI module) SQLAlchemy may import.
_DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "mariadb": "mariadb",
}
# SQLAlchemy's driver for a URL without ``+DRIVER``.
_DEFAULT_DRIVERS = {"postgresql": "psycopg2", "mysql": "mysqldb"}
# Drivers known to take a ``connect_timeout`` keyword (seconds).
_CONNECT_TIMEOUT_DRIVERS = ("psycopg2", "psycopg", "mysqldb", "pymysql")
# Attempts at creating the tables: two workers starting together may both try (SQLite; servers
# are serialized by a lock, below).
_INIT_ATTEMPTS = 3
# Key of the PostgreSQL advisory lock / name of the MySQL lock that serializes table creation.
_INIT_LOCK_KEY = 0x70657266  # "perf"
_INIT_LOCK_NAME = "perfscope_optuna_init"


class StorageError(PerfscopeError, ValueError):
    """The study storage cannot be opened: unknown URL form, missing driver, unreachable server,
    refused login, unwritable folder. The message is one line and never holds a password."""


def default_url(out_dir: Path) -> str:
    """``sqlite:///<out_dir>/study.db`` with ``out_dir`` made absolute."""
    return "sqlite:///" + str(Path(out_dir).expanduser().absolute() / DEFAULT_FILE)


def describe_storage(url: str | None, out_dir: Path | None = None) -> str:
    """The storage URL as it may be printed or written to ``tune.json``: its whole userinfo
    (``USER:PASS@``) and any secret query parameter replaced by ``***``
    (:func:`perfscope.redact.redact`).

    ``None`` (no ``--storage``) gives the default URL of ``out_dir`` (see :func:`default_url`), or
    ``sqlite:///study.db`` when no folder is given.
    """
    if url is None:
        return default_url(out_dir) if out_dir is not None else "sqlite:///" + DEFAULT_FILE
    return redact(url, secrets=url_secrets(url))  # a journal path too: it may be a mistyped database URL


def open_storage(
    url: str | None,
    out_dir: Path,
    *,
    heartbeat_interval: int = HEARTBEAT_INTERVAL,
    grace_period: int = GRACE_PERIOD,
) -> BaseStorage:
    """Open (creating it if needed) the study storage named by ``url``.

    Args:
        url: ``None`` for the default ``sqlite:///<out_dir>/study.db``, else one of the forms in
            this module's documentation: ``journal:PATH`` or a ``*.log`` / ``*.journal`` path,
            ``sqlite:///PATH``, ``postgresql://USER:PASS@HOST[:PORT]/DB``,
            ``mysql://USER:PASS@HOST[:PORT]/DB`` (``postgresql+DRIVER://`` and ``mysql+DRIVER://``
            pick a driver; ``postgres://`` is read as ``postgresql://``).
        out_dir: The output folder; holds the default storage (created when needed). Not used
            with an explicit ``url``.
        heartbeat_interval, grace_period: Seconds between heartbeats of a running trial, and
            without one before the trial counts as abandoned (SQL storages). Shorter values are
            for tests.

    Returns:
        A :class:`optuna.storages.RDBStorage` with heartbeat and one retry of an abandoned trial,
        or a :class:`optuna.storages.journal.JournalStorage` on a journal file.

    Raises:
        StorageError: an unknown URL form (the message lists the accepted ones); a database
            driver that is not installed (``postgresql needs psycopg2: pip install
            psycopg2-binary``); a server that cannot be reached or refuses the login
            (``cannot open study storage postgresql://***@host/db: <the driver's
            message>``); a folder that cannot be created or written (SQLite, journal); a database
            whose tables are not Optuna's or are of a newer Optuna.
    """
    if url is None:
        url = default_url(out_dir)
    journal = _journal_path(url)
    if journal is not None:
        return _open_journal(url, journal)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    backend = scheme.split("+", 1)[0].lower()
    if backend == "postgres":  # the alias Heroku and libpq accept; SQLAlchemy does not
        url = "postgresql" + url[len("postgres") :]
        backend = "postgresql"
    if backend not in _RDB_BACKENDS:
        raise StorageError(_unknown_message(url))
    return _open_rdb(url, heartbeat_interval, grace_period)


# ---------------------------------------------------------------------------------------------
# Journal files


def _journal_path(url: str) -> Path | None:
    """The journal file of ``url``, or None when ``url`` is not a journal form."""
    if url.startswith("journal:"):
        # journal:///abs/path and journal://relative/path, file-URL style, work too.
        rest = url.removeprefix("journal:").removeprefix("//")
        return Path(rest).expanduser() if rest else Path()
    if "://" not in url and url.lower().endswith(JOURNAL_SUFFIXES):
        return Path(url).expanduser()
    return None


def _open_journal(url: str, path: Path) -> BaseStorage:
    shown = describe_storage(url)
    if str(path) in ("", "."):
        raise StorageError(f"study storage {shown!r} names no file: use journal:PATH")
    # The lock is a symbolic link made next to the file, so the folder itself must be writable.
    _check_file_place(path, shown)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return JournalStorage(JournalFileBackend(str(path)))
    except OSError as e:
        raise StorageError(f"cannot open study storage {shown}: {os_reason(e)}") from None
    except (ValueError, KeyError) as e:
        raise StorageError(
            f"cannot read study storage {shown}: not an Optuna journal file ({first_line(e)})"
        ) from None


# ---------------------------------------------------------------------------------------------
# SQL databases


def _open_rdb(url: str, heartbeat_interval: int, grace_period: int) -> RDBStorage:
    shown = describe_storage(url)
    if url.lower().startswith("postgresql://"):
        url = _pick_postgresql_driver(url)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        # SQLAlchemy's message repeats the URL, password included: not shown.
        raise StorageError(f"cannot parse study storage URL {shown}: expected {ACCEPTED}") from None
    secrets = url_secrets(url)
    if "@" in (parsed.host or "") or host_has_at(url):
        # The parser took what follows the password's first "@" for the host name: the driver's
        # "could not translate host name" would print the rest of the password.
        raise StorageError(f"cannot use study storage {shown}: its password holds an unencoded '@'; "
                           "URL-encode it as %40 (and any other reserved character, e.g. with urllib.parse.quote)")
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        _check_sqlite_file(parsed.database, shown)

    engine_kwargs: dict = {}
    driver = parsed.drivername.partition("+")[2] or _DEFAULT_DRIVERS.get(backend)
    # A timeout given in the URL's query wins.
    if driver in _CONNECT_TIMEOUT_DRIVERS and "connect_timeout" not in parsed.query:
        engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT}

    # Connect once first, so that a missing driver, an unreachable server or a refused login is
    # told as such (and not retried), then create Optuna's tables under a lock.
    try:
        engine = sqlalchemy.create_engine(url, **engine_kwargs)
    except ImportError as e:
        raise StorageError(_driver_message(backend, e)) from None
    except sqlalchemy.exc.ArgumentError as e:  # an unknown driver name, a bad argument
        raise StorageError(
            f"cannot use study storage {shown}: {redact(first_line(e), secrets=secrets)}"
        ) from None
    try:
        with engine.connect() as connection, _init_lock(connection, backend):
            foreign = foreign_tables(connection)
            if foreign:
                raise StorageError(f"cannot use study storage {shown}: its tables are not Optuna's "
                                   f"({'; '.join(foreign)}): use another database or file")
            return _make_rdb_storage(
                url, backend, engine_kwargs, heartbeat_interval, grace_period, shown, secrets
            )
    except sqlalchemy.exc.SQLAlchemyError as e:
        reason = db_reason(e, secrets)
        raise StorageError(f"cannot open study storage {shown}: {reason}") from None
    finally:
        engine.dispose()


def _make_rdb_storage(
    url: str,
    backend: str,
    engine_kwargs: dict,
    heartbeat_interval: int,
    grace_period: int,
    shown: str,
    secrets: list[str],
) -> RDBStorage:
    for attempt in range(_INIT_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                # heartbeat_interval has been "experimental" in Optuna since 2.9.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                        max_retry=MAX_RETRY
                    ),
                )
        except ImportError as e:
            raise StorageError(_driver_message(backend, e)) from None
        except sqlalchemy.exc.SQLAlchemyError as e:
            # Another worker creating the same tables at the same moment: try again.
            if attempt + 1 == _INIT_ATTEMPTS:
                raise StorageError(
                    f"cannot open study storage {shown}: {db_reason(e, secrets)}"
                ) from None
            time.sleep(random.uniform(0.1, 0.5))
        except optuna.exceptions.StorageInternalError as e:  # e.g. a table it could not read
            raise StorageError(f"cannot use study storage {shown}: {redact(first_line(e), secrets=secrets)}") from None
        except RuntimeError as e:  # Optuna: the tables were written by another Optuna version
            raise StorageError(
                f"cannot use study storage {shown}: {redact(first_line(e), secrets=secrets)}"
            ) from None
    raise AssertionError("unreachable")


@contextmanager
def _init_lock(connection: sqlalchemy.engine.Connection, backend: str) -> Iterator[None]:
    """Hold a server-side lock while Optuna creates its tables, so that workers starting together
    on an empty database do not race (``CREATE TABLE`` twice, the schema version stamped twice).
    SQLite has none: :func:`_make_rdb_storage` tries again instead."""
    if backend == "postgresql":
        connection.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({_INIT_LOCK_KEY})"))
        connection.commit()
        try:
            yield
        finally:
            connection.execute(sqlalchemy.text(f"SELECT pg_advisory_unlock({_INIT_LOCK_KEY})"))
            connection.commit()
    elif backend == "mysql":
        connection.execute(sqlalchemy.text(f"SELECT GET_LOCK('{_INIT_LOCK_NAME}', 60)"))
        try:
            yield
        finally:
            connection.execute(sqlalchemy.text(f"SELECT RELEASE_LOCK('{_INIT_LOCK_NAME}')"))
    else:
        yield


def _pick_postgresql_driver(url: str) -> str:
    """``postgresql://`` with the driver that is installed: psycopg2 (the ``tune`` extra's), else
    psycopg 3. SQLAlchemy's own default changed from one to the other in 2.1."""
    for module in ("psycopg2", "psycopg"):
        if _importable(module):
            return f"postgresql+{module}" + url[len("postgresql") :]
    raise StorageError("postgresql needs psycopg2: pip install psycopg2-binary")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (blocked)
        return False


def _check_sqlite_file(database: str | None, shown: str) -> None:
    """Create the folder of a SQLite file and check that it can be written (SQLite writes its
    journal next to the file, so the folder must be writable too)."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return  # in memory, or a SQLite URI left to SQLite
    path = Path(database).expanduser()
    _check_file_place(path, shown)
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise StorageError(f"cannot open study storage {shown}: {path} is not writable")


def _driver_message(backend: str, error: ImportError) -> str:
    missing = error
    while missing is not None and not isinstance(missing, ModuleNotFoundError):
        missing = missing.__cause__ or missing.__context__
    if isinstance(missing, ModuleNotFoundError) and missing.name:
        module = missing.name.split(".")[0]
        package = _DRIVER_PACKAGES.get(module, module)
        return f"{backend} needs {module}: pip install {package}"
    return f"cannot load the {backend} database driver: {first_line(error)}"


# ---------------------------------------------------------------------------------------------
# Messages


def _unknown_message(url: str) -> str:
    shown = describe_storage(url)
    hint = ""
    if "://" not in url and url.lower().endswith((".db", ".sqlite", ".sqlite3")):
        hint = f" (did you mean sqlite:///{url}?)"
    return f"unknown study storage {shown!r}{hint}: use {ACCEPTED}"


def _check_file_place(path: Path, shown: str) -> None:
    """The storage file is not a folder, and its folder exists (created) and is writable."""
    if path.is_dir():
        raise StorageError(f"cannot open study storage {shown}: {path} is a folder, not a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create the folder of study storage {shown}: {os_reason(e)}") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise StorageError(f"cannot open study storage {shown}: folder {path.parent} is not writable")
