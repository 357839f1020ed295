"""Secrets out of text: the one masking function for URLs, storage URLs and the messages quoting them.

Whatever perfscope prints, records (``tune.json``, ``report.html``, a study's attributes) or quotes
from a driver goes through :func:`redact`. Its rules, stated in ``docs/guarantees.md``:

- **The whole userinfo of a URL** (``SCHEME://USER:PASS@HOST``) becomes ``***``: everything from the
  ``://`` to the *last* ``@`` before the end of the line or the next URL, so a password with spaces,
  ``%40``, an unencoded ``@``, quotes or slashes, and a user name that is itself encoded, are all
  masked without knowing how they were spelled (``postgresql://***@HOST/DB``). The grammar is
  SQLAlchemy's (``make_url``: a user name without ``:`` or ``/``, then ``:`` and a password); taking
  the last ``@`` rather than the first errs on the side of masking more.
- **Mistyped URLs** (``postgresql//U:P@H``, ``postgresql:/U:P@H``) and bare ``U:P@HOST`` words: the
  same, within the word.
- **Secret parameters**: the value of every ``KEY=VALUE`` whose key (URL-decoded) names a password,
  secret, token, DSN or nested connection string (``password=``, ``sslpassword=``, ``pass%77ord=``,
  ``odbc_connect=``).
- **Known secrets** (``secrets=``, from :func:`url_secrets` of the URL the text is about): every
  spelling, for a driver's message that quotes a password outside any URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus

MASK = "***"
SHORT_SECRET = 4
"""Known secrets shorter than this many characters are masked only where no letter or digit
touches them; longer ones wherever they occur."""

_SCHEME = re.compile(r"[A-Za-z][\w+.\-]*://")
# A user name by SQLAlchemy's grammar ([^:/]*), here also without whitespace or quotes, so that the
# ':' of "at 10:30" in the prose after a credential-free URL is not taken for a password's.
_USER = re.compile(r"[^:/\s'\"<>()\[\]]*")
# [SCHEME:/ or SCHEME// (typed wrong)]USER:PASS@HOST at the start of a word, no spaces or quotes in
# any part; PASS runs to the last '@' of the word and does not start with '/' (a scheme's "://").
_WORD_USERINFO = re.compile(r"(?:^|(?<=[\s'\"(<\[=,]))(?P<scheme>[A-Za-z][\w+.\-]*:/?|[A-Za-z][\w+.\-]*/+)?"
                            r"(?P<user>[^\s'\"()<>\[\]:/@]*):(?P<pw>(?!/)[^\s'\"<>]*)@(?=[^\s'\"<>@]*)")
# KEY=VALUE in a URL query or a libpq/ODBC connection string; the key is judged URL-decoded.
_PARAM = re.compile(r"(?P<key>[\w%.\-]+)=(?P<value>[^&#;\s'\"]*)")
# Keys that hold a secret: password=, passwd=, pwd= (libpq, MySQL), sslpassword= (libpq's client
# key), anything named a secret or token, and whole connection strings nested in one (pyodbc's
# odbc_connect=, a dsn=) whose own PWD= is encoded; not connect_timeout=.
_SECRET_KEY = re.compile(r"(?i)pass|pwd|secret|token|dsn|connect$")


def redact(text: str, *, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret it holds replaced by ``***`` (the module's rules).

    Args:
        text: Any text: a URL, an error message, a line of output, a whole log.
        secrets: Strings known to be secret (:func:`url_secrets` of the URL a message is about),
            replaced wherever they occur (see :data:`SHORT_SECRET`), longest first.

    Returns:
        The text with the secrets masked (unchanged when it holds none).
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        if len(secret) >= SHORT_SECRET:
            text = text.replace(secret, MASK)
        else:  # a short one only where it stands alone, or "p" would mask half of "postgresql"
            text = re.sub(rf"(?<![^\W_]){re.escape(secret)}(?![^\W_])", MASK, text)
    text = "\n".join(_mask_url_userinfo(line) for line in text.split("\n"))
    text = _WORD_USERINFO.sub(lambda m: f"{m['scheme'] or ''}{MASK}@", text)
    return _PARAM.sub(_mask_param, text)


def url_secrets(url: str | None) -> list[str]:
    """Every spelling of the secrets a URL holds, longest first, to pass as ``secrets=`` to
    :func:`redact` for messages that quote them outside the URL (a driver's error).

    The userinfo's password (everything between the user name's ``:`` and the last ``@``) and the
    value of every secret query parameter, each as written, URL-decoded (``%20`` and ``+``) and
    URL-encoded. Empty for ``None`` or a URL without secrets.
    """
    if not url:
        return []
    values: list[str] = []
    head, _, query = url.partition("?")
    found = _SCHEME.search(head)
    rest = head[found.end():] if found else head
    userinfo, at, _ = rest.rpartition("@")
    if at and ":" in userinfo:
        values.append(userinfo.split(":", 1)[1])
    for key, value in parse_qsl(query, keep_blank_values=False):
        if _SECRET_KEY.search(key):
            values.append(value)
    for part in query.split("&"):  # as written too: parse_qsl decoded them
        key, eq, value = part.partition("=")
        if eq and value and _SECRET_KEY.search(unquote_plus(key)):
            values.append(value)
    spelled: set[str] = set()
    for value in values:
        spelled |= {value, unquote(value), unquote_plus(value), quote(value, safe=""), quote_plus(value, safe="")}
    return sorted((s for s in spelled if s), key=len, reverse=True)


def host_has_at(url: str) -> bool:
    """Whether the host part of ``url`` holds an ``@``: a password with an unencoded ``@`` (the
    parser took what follows it for the host), which must be written ``%40``."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = rest.split("/", 1)[0]
    return authority.count("@") > 1


def _mask_url_userinfo(line: str) -> str:
    """``line`` with the userinfo of each ``SCHEME://USER:...@`` in it replaced by ``***``."""
    out: list[str] = []
    starts = [m.end() for m in _SCHEME.finditer(line)]
    pos = 0
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(line)
        span = line[start:end]
        at = span.rfind("@")
        user = _USER.match(span)
        if at > 0 and user is not None and user.end() < at and span[user.end()] == ":":
            out.append(line[pos:start] + MASK)
            pos = start + at
    out.append(line[pos:])
    return "".join(out)


def _mask_param(m: re.Match) -> str:
    if m["value"] and m["value"] != MASK and _SECRET_KEY.search(unquote_plus(m["key"])):
        return f"{m['key']}={MASK}"
    return m[0]
