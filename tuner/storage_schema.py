"""Whether a database's tables can hold an Optuna study: a table named like one of Optuna's but
made by something else (another tool's ``studies`` table, a foreign ``version_info``) is told as a
storage error before Optuna writes into it and fails with an internal one."""

from __future__ import annotations

import functools
import warnings

import optuna
import sqlalchemy


@functools.cache
def optuna_tables() -> dict[str, tuple[str, ...]]:
    """Optuna's tables and their columns, parents before the tables that refer to them, as its
    public :class:`optuna.storages.RDBStorage` makes them in a database of its own (SQLite in
    memory, read through the storage's ``engine``; checked against Optuna 5.1.0). Alembic's
    ``alembic_version`` is left out: any application migrated with Alembic has one of the same shape.
    A fraction of a second, once a process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental" options and the like: none are used here
        storage = optuna.storages.RDBStorage("sqlite:///:memory:", skip_compatibility_check=True)
    try:
        inspector = sqlalchemy.inspect(storage.engine)
        return {name: tuple(column["name"] for column in inspector.get_columns(name))
                for name, _ in inspector.get_sorted_table_and_fkc_names() if name and name != "alembic_version"}
    finally:
        storage.engine.dispose()


def foreign_tables(connection: sqlalchemy.engine.Connection) -> list[str]:
    """The tables of the database that Optuna would use but whose columns are not Optuna's.

    Args:
        connection: An open connection to the database.

    Returns:
        ``"table <name> has no column <column>"`` for each such table, in Optuna's table order; ``[]`` when
        the database is empty, holds only other tables, or holds Optuna's tables.
    """
    inspector = sqlalchemy.inspect(connection)
    existing = set(inspector.get_table_names())
    found = []
    for name, columns in optuna_tables().items():
        if name not in existing:
            continue
        have = {column["name"] for column in inspector.get_columns(name)}
        missing = [column for column in columns if column not in have]
        if missing:
            found.append(f"table {name} has no column {missing[0]}")
    return found
