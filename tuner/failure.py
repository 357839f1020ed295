"""Why a trial failed, in one line: the error the script printed, a kill from outside, a duration.

A trial's ``output.log`` ends with whatever the script printed last, which is often not its error:
a warning's source line (``  warnings.warn(...)``), a progress bar, a launcher's summary. The
reason is the exception line of the last traceback when there is one, else the last line that
reads as an error (``error: ...``, ``SomeError: ...``), else the last line that is not a warning.
Only the end of the log is read (:data:`TAIL_BYTES`): a log may be large.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from perfscope.redact import redact

TAIL_BYTES = 256 * 1024
"""How much of the end of a trial's log is read for its failure reason (bytes)."""
REASON_CHARS = 300
"""Longest failure reason kept (characters)."""

_TRACEBACK = "Traceback (most recent call last):"
# ``path.py:12: UserWarning: text`` (Python's warnings), ``[W ...]``/``W1201 ...`` (torch's C++ log).
_WARNING = re.compile(r"^(\S.*:\d+: )?[A-Za-z_][\w.]*Warning: |^\[W[ \d]|^W\d{4} ")
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:|$)|\berror\b\s*:", re.IGNORECASE)
_NOISE = ("USDT:",)
# torch.distributed.run's report of a rank killed by a signal (``exitcode : -9``, ``Signal 9 (SIGKILL)``).
_RANK_KILLED = re.compile(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)")


def seconds_text(seconds: float) -> str:
    """A duration for people that never rounds to 0 (``900 s``, ``1.5 s``, ``0.001 s``)."""
    if seconds >= 10:
        return f"{seconds:.0f} s"
    return f"{seconds:.2g} s"


def read_tail(log: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``log`` as text ("" when it cannot be read); never the whole file."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if len(data) == limit and size > limit:
        text = text.partition("\n")[2]  # the first line is cut
    return text


def failure_line(log: Path) -> str | None:
    """The line of the script's output that says why it failed (see the module's docstring)."""
    lines = [line.rstrip() for line in read_tail(log).splitlines()]
    found = _exception_line(lines) or _last_error_line(lines)
    return _cut(found.strip()) if found else None


def _exception_line(lines: list[str]) -> str | None:
    """The last traceback's exception line: the first one after its frames that is not indented
    (and not a warning)."""
    last_traceback = max((i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)), default=None)
    if last_traceback is None:
        return None
    return next((line for line in lines[last_traceback + 1:]
                 if line and not line[0].isspace() and not _WARNING.search(line)), None)


def _last_error_line(lines: list[str]) -> str | None:
    """Without a traceback: the last line that reads as an error, else the last plain line
    (noise, warnings and a warning's source line passed over)."""
    warning_source = False  # the indented line Python prints after a warning: its source code
    error = plain = None
    for line in lines:
        after_warning, warning_source = warning_source, False
        if not line.strip() or line.startswith(_NOISE) or line.startswith(_TRACEBACK):
            continue
        if _WARNING.search(line):
            warning_source = True
        elif not (after_warning and line[0].isspace()):
            plain = line
            error = line if _ERROR.search(line) else error
    return error or plain


def killed_reason(exit_code: int | None, log: Path) -> str | None:
    """The reason of a trial killed by SIGKILL that perfscope did not send, else None.

    Nothing in the trial sends SIGKILL to itself; the usual sender is the kernel's out-of-memory
    killer (``dmesg`` tells), so the reason says so rather than calling it a crash.
    """
    if exit_code == -signal.SIGKILL or (exit_code and _RANK_KILLED.search(read_tail(log, 64 * 1024))):
        return ("killed by SIGKILL from outside the trial, possibly by the kernel's out-of-memory killer "
                "(see dmesg)")
    return None


def _cut(line: str) -> str:
    return redact(line)[:REASON_CHARS]  # the script may print a URL with its password
