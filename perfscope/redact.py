"""Passwords out of text: the userinfo of anything that looks like a URL, and ``password=`` values.

Works on any text -- a URL as typed (mistyped too: ``postgresql//u:pw@h/db``,
``postgresql:/u:pw@h``), an error message that quotes one, a log line -- so that whatever perfscope
prints or records never holds a password. A password with an unencoded ``@`` is masked up to the
last ``@`` of its word (``u:p@ss@host`` -> ``u:***@host``).
"""

from __future__ import annotations

import re

MASK = "***"

# [SCHEME:/ or SCHEME// (typed right or not)]USER:PASS@HOST at the start of a word. PASS runs to the
# last `@` of the word (an unencoded `@` in it included) and does not start with `/` (that is a
# scheme's `://`); no spaces or quotes in any part.
_USERINFO = re.compile(r"(?:^|(?<=[\s'\"(<\[=,]))(?P<scheme>[A-Za-z][\w+.\-]*:/*|[A-Za-z][\w+.\-]*/+)?"
                       r"(?P<user>[^\s'\"()<>\[\]:/@]*):(?P<pw>(?!/)[^\s'\"<>]*)@(?P<host>[^\s'\"<>@]*)")
# password=, passwd= and pwd= parameters (URL queries, libpq's key=value strings).
_PASSWORD_PARAM = re.compile(r"(?i)(\b(?:password|passwd|pwd)=)([^&#\s'\"]*)")


# A URL written right (SCHEME://USER:PASS@HOST): here PASS may be anything but whitespace, up to the
# last `@` of the word -- a leading `/`, quotes and brackets included, which SQLAlchemy accepts.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][\w+.\-]*://)(?P<user>[^\s/@:]*):(?P<pw>\S*)@(?P<host>[^\s@/]*)")


def redact(text: str) -> str:
    """``text`` with every password in URL userinfo (``USER:PASS@``) and every ``password=`` value
    replaced by ``***``.

    Args:
        text: Any text: a URL, an error message, a line of output.

    Returns:
        The text with the passwords masked (unchanged when it holds none).
    """
    masked = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@{m['host']}", text)
    masked = _USERINFO.sub(lambda m: f"{m['scheme'] or ''}{m['user']}:{MASK}@{m['host']}", masked)
    return _PASSWORD_PARAM.sub(lambda m: m[1] + MASK if m[2] else m[0], masked)


def host_has_at(url: str) -> bool:
    """Whether the host part of ``url`` holds an ``@``: a password with an unencoded ``@`` (the
    parser took what follows it for the host), which must be written ``%40``."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = rest.split("/", 1)[0]
    return authority.count("@") > 1
