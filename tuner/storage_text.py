"""What a storage error may say: one line, its secrets masked by :func:`perfscope.redact.redact`."""

from __future__ import annotations

import sqlalchemy
import sqlalchemy.exc

from perfscope.redact import redact


def first_line(error: BaseException) -> str:
    """The first non-empty line of an error's message (its type's name when it has none)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def db_reason(error: sqlalchemy.exc.SQLAlchemyError, secrets: list[str]) -> str:
    """The first line of the driver's own message (SQLAlchemy's wrapping adds the SQL statement
    and a link), its secrets masked (``secrets``: :func:`perfscope.redact.url_secrets` of the URL)."""
    orig = getattr(error, "orig", None)
    reason = first_line(orig) if orig is not None else first_line(error)
    return redact(reason, secrets=secrets)


def os_reason(error: OSError) -> str:
    """``Permission denied: /path`` rather than Python's ``[Errno 13] ...`` form."""
    if error.strerror and error.filename:
        return f"{error.strerror}: {error.filename}"
    return str(error)
