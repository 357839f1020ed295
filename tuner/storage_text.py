"""What a storage URL and a storage error may say: passwords replaced by ``***``, one line.

A study URL (``postgresql://user:PASS@host/db``, ``...?password=PASS``) is printed, written to
``tune.json`` and quoted in error messages; a database driver's own message can quote it too. These
functions keep every spelling of the password (as given, URL-decoded, URL-encoded) out of them.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

import sqlalchemy
import sqlalchemy.exc

from perfscope.redact import redact

# password=, passwd= and pwd= query parameters, the spellings libpq and MySQL drivers accept.
_PASSWORD_QUERY = re.compile(r"(?i)([?&](?:password|passwd|pwd)=)([^&#]*)")


def mask_password(url: str) -> str:
    """``url`` with the password of ``USER:PASS@`` and of a ``password=`` parameter as ``***``
    (also in a mistyped URL, ``postgresql//USER:PASS@HOST``: :func:`perfscope.redact.redact`)."""
    return redact(url)


def secrets_of(url: str, parsed: sqlalchemy.engine.URL) -> list[str]:
    """Every spelling of the URL's passwords, longest first, to scrub them from a driver's message."""
    values = [parsed.password] if parsed.password else []
    values += [m.group(2) for m in _PASSWORD_QUERY.finditer(url) if m.group(2)]
    spelled = set()
    for value in map(str, values):
        spelled |= {value, unquote(value), quote(value, safe="")}
    return sorted((s for s in spelled if s), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``, and any URL's password masked."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return redact(text)


def first_line(error: BaseException) -> str:
    """The first non-empty line of an error's message (its type's name when it has none)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def db_reason(error: sqlalchemy.exc.SQLAlchemyError, secrets: list[str]) -> str:
    """The first line of the driver's own message (SQLAlchemy's wrapping adds the SQL statement
    and a link), without passwords."""
    orig = getattr(error, "orig", None)
    reason = first_line(orig) if orig is not None else first_line(error)
    return scrub(reason, secrets)


def os_reason(error: OSError) -> str:
    """``Permission denied: /path`` rather than Python's ``[Errno 13] ...`` form."""
    if error.strerror and error.filename:
        return f"{error.strerror}: {error.filename}"
    return str(error)
