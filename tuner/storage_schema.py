"""Whether a database's tables can hold an Optuna study: a table named like one of Optuna's but
made by something else (another tool's ``studies`` table, a foreign ``version_info``) is told as a
storage error before Optuna writes into it and fails with an internal one."""

from __future__ import annotations

import sqlalchemy
from optuna.storages._rdb import models


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
    for name, table in models.BaseModel.metadata.tables.items():
        if name not in existing:
            continue
        have = {column["name"] for column in inspector.get_columns(name)}
        missing = [column.name for column in table.columns if column.name not in have]
        if missing:
            found.append(f"table {name} has no column {missing[0]}")
    return found
