"""Runs a user's script in this interpreter the way ``python SCRIPT args`` would."""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from types import TracebackType

from perfscope.collect import control
from perfscope.collect.errors import CollectError

# Exit status of a process ended by Ctrl-C (128 + SIGINT), as shells report it.
_INTERRUPTED_EXIT_CODE = 130
_MAX_MESSAGE_CHARS = 200


@dataclasses.dataclass
class ScriptOutcome:
    """How a script run ended.

    Attributes:
        exit_code: What ``python SCRIPT`` would have exited with (0 when
            perfscope ended the script at ``max_steps``).
        error: One line saying how the script failed, or None.
        stopped_early: True when perfscope ended the script.
    """

    exit_code: int = 0
    error: str | None = None
    stopped_early: bool = False


def check_script(script: str | os.PathLike) -> str:
    """Validate the script path before anything is started.

    Args:
        script: Path to a Python file, as the user typed it.

    Returns:
        The path as a string, unchanged (it becomes ``sys.argv[0]``).

    Raises:
        CollectError: The path does not exist, is a directory or is not a
            ``.py`` file.
    """
    path = os.fspath(script)
    if not os.path.exists(path):
        raise CollectError(f"script not found: {path}")
    if os.path.isdir(path):
        raise CollectError(f"script is a directory, not a Python file: {path}")
    if not path.endswith(".py"):
        raise CollectError(f"script must be a Python file ending in .py: {path}")
    return path


def run_script(script: str, args: Sequence[str]) -> ScriptOutcome:
    """Run ``script`` as ``__main__`` with ``sys.argv = [script, *args]``.

    ``sys.path[0]`` becomes the script's (symlink-resolved) directory, as
    Python sets it; ``sys.argv`` and ``sys.path`` are restored afterwards.
    Exceptions from the script are reported, not raised: the traceback goes to
    stderr as Python would print it, and the outcome carries a one-line error.

    Args:
        script: Path to the script, already checked with :func:`check_script`.
        args: The script's command-line arguments.

    Returns:
        The outcome; perfscope's own stop signal counts as a clean exit.
    """
    saved_argv = sys.argv
    saved_path = list(sys.path)
    script_dir = os.path.dirname(os.path.realpath(script))
    sys.argv = [script, *args]
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.append(script_dir)
    try:
        runpy.run_path(script, run_name="__main__")
    except control._StopScript:
        return ScriptOutcome(stopped_early=True)
    except SystemExit as exc:
        return _outcome_of_exit(script, exc)
    except KeyboardInterrupt as exc:
        _print_traceback(script, exc)
        return ScriptOutcome(_INTERRUPTED_EXIT_CODE, _describe(script, exc, "was interrupted by"))
    except BaseException as exc:  # noqa: BLE001 - report whatever the script raised
        _print_traceback(script, exc)
        return ScriptOutcome(1, _describe(script, exc, "raised"))
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return ScriptOutcome()


def _outcome_of_exit(script: str, exc: SystemExit) -> ScriptOutcome:
    code = exc.code
    if code is None or code == 0:
        return ScriptOutcome()
    if isinstance(code, int):
        return ScriptOutcome(code, f"{script} exited with status {code}")
    # sys.exit("message") prints the message and exits 1, like Python does.
    print(code, file=sys.stderr)
    return ScriptOutcome(1, f"{script} exited: {_first_line(str(code))}")


def _describe(script: str, exc: BaseException, verb: str) -> str:
    """One line like ``train.py raised ValueError: bad thing (line 42)``."""
    message = _first_line(str(exc))
    text = f"{script} {verb} {type(exc).__name__}"
    if message:
        text += f": {message}"
    line = _script_line(script, exc)
    if line is not None:
        text += f" (line {line})"
    return text


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    if len(line) > _MAX_MESSAGE_CHARS:
        line = line[: _MAX_MESSAGE_CHARS - 3] + "..."
    return line


def _script_line(script: str, exc: BaseException) -> int | None:
    # The innermost frame in the script itself: the user's line, not torch's.
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == script:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None and isinstance(exc, SyntaxError) and exc.filename == script:
        line = exc.lineno
    return line


def _print_traceback(script: str, exc: BaseException) -> None:
    # Drop perfscope's and runpy's frames so the output matches `python SCRIPT`.
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    if tb is None and not isinstance(exc, SyntaxError):
        tb = exc.__traceback__  # not raised from the script's code: show all
    sys.stderr.flush()
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    sys.stderr.flush()
