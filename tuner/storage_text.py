"""What a storage URL and a storage error may say: passwords replaced by ``***``, one line.

A study URL (``postgresql://user:PASS@host/db``, ``...?password=PASS``, ``...?sslpassword=PASS``) is printed, written to
``tune.json`` and quoted in error messages; a database driver's own message can quote it too. These
functions keep every spelling of the password (as given, URL-decoded, URL-encoded) out of them.
"""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus, unquote, unquote_plus

import sqlalchemy
import sqlalchemy.exc

from perfscope.redact import MASK, redact

# Query parameters that hold a secret: password=, passwd=, pwd= (libpq, MySQL drivers),
# sslpassword= (libpq's client key), anything named a secret or token, and whole connection
# strings nested in one (pyodbc's odbc_connect=, a dsn=) whose own PWD= is encoded.
_SECRET_KEY = re.compile(r"(?i)pass|pwd|secret|token|connect|dsn")


def mask_password(url: str) -> str:
    """``url`` with every password in it as ``***``: the userinfo's and every password-like query
    parameter's, found by parsing the URL (so a password with spaces, tabs or quotes is masked
    whole), then whatever :func:`perfscope.redact.redact` finds in text that does not parse
    (``postgresql//USER:PASS@HOST``)."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        return redact(url)
    masked = url
    # where the parser found them: USER:PASS@ and KEY=VALUE, each in the spellings it may have
    if parsed.password:
        for spelling in _spellings(str(parsed.password)):
            masked = masked.replace(f"{parsed.username or ''}:{spelling}@", f"{parsed.username or ''}:{MASK}@")
    base, sep, query = masked.partition("?")
    if sep:  # every KEY=VALUE of the query as written, its key decoded (pass%77ord is password)
        def mask(pair: str) -> str:
            key, eq, value = pair.partition("=")
            return f"{key}={MASK}" if value and _SECRET_KEY.search(unquote_plus(key)) else pair

        masked = base + sep + "&".join(mask(pair) for pair in query.split("&"))
    return redact(masked)


def url_secrets(url: str | None) -> list[str]:
    """:func:`secrets_of` a URL as given (none where it does not parse as a database URL)."""
    try:
        return secrets_of(url, sqlalchemy.engine.make_url(url)) if url else []
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        return []


def secrets_of(url: str, parsed: sqlalchemy.engine.URL) -> list[str]:
    """Every spelling (as given, URL-decoded, URL-encoded with ``%20`` or ``+``) of the URL's
    passwords, longest first, to scrub them from text that quotes it (a driver's message)."""
    values = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if _SECRET_KEY.search(key):
            values += [value] if isinstance(value, str) else list(value)
    spelled = set()
    for value in map(str, values):
        spelled |= set(_spellings(value))
    return sorted(spelled, key=len, reverse=True)


def _spellings(value: str) -> list[str]:
    """``value`` as given, URL-decoded, and URL-encoded with ``%20`` or ``+``, longest first."""
    spelled = {value, unquote(value), unquote_plus(value), quote(value, safe=""), quote_plus(value, safe="")}
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
