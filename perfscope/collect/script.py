"""Runs a user's script in this interpreter the way ``python SCRIPT args`` would."""

from __future__ import annotations

import dataclasses
import os
import re
import runpy
import sys
import threading
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from perfscope import control
from perfscope.collect.errors import CollectError
from perfscope.redact import redact
from perfscope.text import safe

# Exit status of a process ended by Ctrl-C (128 + SIGINT), as shells report it.
_INTERRUPTED_EXIT_CODE = 130
_REFUSED_EXIT_CODE = 2  # perfscope's own "bad input" status
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
    Python sets it. What the script changes of this process's global state is
    put back afterwards, since perfscope carries on in the same process:
    ``sys.argv``, ``sys.path``, ``sys.stdin``/``sys.stdout``/``sys.stderr``
    (see :class:`_StdStreams`) and the working directory.
    Exceptions from the script are reported, not raised: the traceback goes to
    stderr as Python would print it, and the outcome carries a one-line error.

    Args:
        script: Path to the script, already checked with :func:`check_script`.
        args: The script's command-line arguments.

    Returns:
        The outcome; perfscope's own stop signal counts as a clean exit.
    """
    owner = os.getpid()
    outcome = _run_as_main(script, args)
    if os.getpid() != owner:
        _end_forked_child(outcome)
    if outcome.error:  # recorded in summaries and trial records: no password from the script's text
        outcome.error = redact(outcome.error)
    return outcome


def _run_as_main(script: str, args: Sequence[str]) -> ScriptOutcome:
    saved_argv = sys.argv
    saved_path = list(sys.path)
    saved_cwd = os.getcwd()
    streams = _StdStreams()
    script_dir = os.path.dirname(os.path.realpath(script))
    sys.argv = [script, *args]
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.append(script_dir)
    try:
        runpy.run_path(script, run_name="__main__")
        _join_threads()
    except control._StopScript:
        return ScriptOutcome(stopped_early=True)
    except control.ScriptRefused as exc:
        return ScriptOutcome(_REFUSED_EXIT_CODE, f"perfscope stopped {script}: {exc}")
    except SystemExit as exc:
        _join_threads()
        return _outcome_of_exit(script, exc, streams.stderr_for_report())
    except KeyboardInterrupt as exc:
        _print_traceback(script, exc, streams.stderr_for_report())
        return ScriptOutcome(_INTERRUPTED_EXIT_CODE, _describe(script, exc, "was interrupted by"))
    except BaseException as exc:  # noqa: BLE001 - report whatever the script raised
        _print_traceback(script, exc, streams.stderr_for_report())
        return ScriptOutcome(1, _describe(script, exc, "raised"))
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        streams.restore()
        _chdir_back(saved_cwd)
    return ScriptOutcome()


def _join_threads() -> None:
    """Wait for the script's non-daemon threads, as the interpreter does before it exits: a main
    thread that starts a training thread and returns has not ended the script."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread is not threading.main_thread():
            thread.join()


def _end_forked_child(outcome: ScriptOutcome) -> None:
    """End a process the script forked (``os.fork``) that came back out of the script.

    The parent runs perfscope's shutdown (stop the profiler, write the trace, analyze); a forked
    copy must not: it ends here with the status ``python SCRIPT`` would have given it. As
    multiprocessing's forked children do, it flushes the standard streams and leaves with
    ``os._exit``, so no ``finally`` or ``atexit`` code of perfscope runs in it.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream of the script's
            pass
    os._exit(outcome.exit_code)


class _StdStreams:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` as they were; put back later.

    A script may point them elsewhere (``sys.stdout = open("train.log", "w")``)
    or close them; either would leak into perfscope, which prints its report
    and errors after the script. A stream the script closed is replaced by a
    new one on the same file descriptor, provided the descriptor still refers
    to the same file (it may have been closed and reused for something else);
    otherwise by ``sys.__stdout__`` & co., or by ``os.devnull`` as a last resort.
    """

    _NAMES = ("stdin", "stdout", "stderr")

    def __init__(self) -> None:
        self._saved = {name: getattr(sys, name) for name in self._NAMES}
        self._files = {name: _open_file_id(stream) for name, stream in self._saved.items()}

    def restore(self) -> None:
        """Put the saved streams back, replacing any the script closed."""
        for name, stream in self._saved.items():
            if _is_closed(stream):
                fresh = self._reopen(name, stream)
                if getattr(sys, f"__{name}__") is stream:
                    setattr(sys, f"__{name}__", fresh)
                self._saved[name] = stream = fresh  # restore() may run twice
            setattr(sys, name, stream)

    def stderr_for_report(self) -> Any:
        """Where the script's traceback goes: its ``sys.stderr``, as in Python.

        Unless the script closed it (or set it to None): then the restored one.
        """
        err = sys.stderr
        if err is None or _is_closed(err):
            self.restore()
            err = sys.stderr
        return err

    def _reopen(self, name: str, stream: object) -> object:
        mode = "r" if name == "stdin" else "w"
        file_id = self._files[name]
        if file_id is not None and _open_file_id_of_fd(file_id[0]) == file_id:
            try:
                return open(  # noqa: SIM115 - lives as long as the stream it replaces
                    file_id[0],
                    mode,
                    encoding=getattr(stream, "encoding", None),
                    errors=getattr(stream, "errors", None),
                    buffering=1 if getattr(stream, "line_buffering", False) else -1,
                    closefd=False,  # the descriptor is not ours to close
                )
            except (OSError, ValueError, LookupError):
                pass
        original = getattr(sys, f"__{name}__")
        if original is not None and not _is_closed(original):
            return original
        return open(os.devnull, mode)  # noqa: SIM115


def _is_closed(stream: object) -> bool:
    try:
        return bool(getattr(stream, "closed", False))
    except Exception:  # noqa: BLE001 - a broken stream counts as closed
        return True


def _open_file_id(stream: object) -> tuple[int, int, int] | None:
    """(fd, device, inode) of a stream's descriptor, or None if it has none."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - io.StringIO, pytest capture, closed ...
        return None
    return _open_file_id_of_fd(fd)


def _open_file_id_of_fd(fd: int) -> tuple[int, int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return fd, st.st_dev, st.st_ino


def _chdir_back(cwd: str) -> None:
    try:
        os.chdir(cwd)
    except OSError as exc:  # the script removed it: stay where it left us
        print(safe(f"perfscope: cannot return to directory {cwd}: {exc.strerror}"), file=sys.stderr)


def _safe_str(obj: object) -> str:
    # str() runs the script's code (__str__), which may itself raise; Python
    # prints this placeholder in that case.
    try:
        return str(obj)
    except Exception:  # noqa: BLE001
        return "<exception str() failed>"


def _outcome_of_exit(script: str, exc: SystemExit, err: Any) -> ScriptOutcome:
    # As Python: None is 0, an int is the status, anything else (a message)
    # is printed and gives status 1 (so sys.exit(0.0) fails, like in Python).
    code = exc.code
    if code is None:
        return ScriptOutcome()
    if isinstance(code, int):
        status = exit_status(code)
        if status == 0:
            return ScriptOutcome()
        return ScriptOutcome(status, f"{script} exited with status {status}")
    message = _safe_str(code) or type(code).__name__  # sys.exit(KeyboardInterrupt()) prints nothing
    try:
        print(_safe_str(code), file=err, flush=True)
    except Exception:  # noqa: BLE001 - a broken stream of the script's; Python ignores it too
        pass
    return ScriptOutcome(1, f"{script} exited: {_first_line(message)}")


def exit_status(code: int) -> int:
    """The status a process gets from ``sys.exit(code)``, as CPython and the kernel reduce it.

    CPython converts ``code`` to a C ``long`` (64 bits here; an integer outside that range becomes
    -1) and the kernel keeps its low 8 bits: ``sys.exit(256)`` exits 0, ``sys.exit(2**70)`` and
    ``sys.exit(-1)`` exit 255.
    """
    code = int(code)
    if not -(2**63) <= code < 2**63:
        code = -1
    return code & 0xFF


def _describe(script: str, exc: BaseException, verb: str) -> str:
    """One line like ``train.py raised ValueError: bad thing (line 42)``."""
    message = _first_line(_safe_str(exc))
    text = f"{script} {verb} {type(exc).__name__}"
    if message:
        text += f": {message}"
    line = _script_line(script, exc)
    # A SyntaxError's message already ends in "(train.py, line 3)".
    if line is not None and not re.search(rf"\bline {line}\b", message):
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


def _print_traceback(script: str, exc: BaseException, err: Any) -> None:
    # Drop perfscope's and runpy's frames so the output matches `python SCRIPT`.
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    if tb is None and not isinstance(exc, SyntaxError):
        tb = exc.__traceback__  # not raised from the script's code: show all
    try:
        err.flush()
        traceback.print_exception(type(exc), exc, tb, file=err)
        err.flush()
    except Exception:  # noqa: BLE001 - a broken stream of the script's; Python ignores it too
        pass
