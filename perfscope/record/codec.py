"""Reading and writing the summary record: :func:`decode` validates once against the schema
(:mod:`perfscope.record.schema`) and migrates older versions; :func:`encode` writes.

What the readers get is the record as plain data (dicts and lists, as JSON has it), validated:
every field the schema names has its type and range where present, every number is finite and
below 2**63, and the version is the current one (older ones migrated). A bad file is one
``PerfscopeError`` line naming the field.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import msgspec
import orjson

from perfscope.atomic import read_bounded, write_bytes_atomic
from perfscope.errors import PerfscopeError
from perfscope.record.schema import READABLE_VERSIONS, SCHEMA, SCHEMA_VERSION, Summary
from perfscope.text import short_repr

_MAX_NUMBER = 2.0**63  # beyond any microsecond count or nanosecond epoch; keeps arithmetic finite


def _bad_number(value) -> str | None:
    """The first non-finite or absurdly large number anywhere in ``value``, as a message (fields
    the schema does not name included: a renderer may still do arithmetic on them)."""
    stack = [(value, "")]
    while stack:
        v, at = stack.pop()
        if isinstance(v, dict):
            stack += [(x, f"{at}.{k}" if at else str(k)) for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(x, f"{at}[{i}]") for i, x in enumerate(v)]
        elif _out_of_range(v):
            return f"{at}: {short_repr(v)} is out of range"
    return None


def _out_of_range(v) -> bool:
    """A number (not a bool) that is not finite, or beyond 2**63 either way."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (math.isfinite(v) and abs(v) <= _MAX_NUMBER)


def _v1_to_v2(data: dict) -> dict:
    """Version 1 had no evidence per step: a step counts when it is complete (all of them when
    none is, as version 1 read them), with status ``ok`` or ``incomplete``."""
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    any_complete = any(s.get("complete", True) for s in steps)
    for s in steps:
        if "counted" not in s:
            counted = bool(s.get("complete", True)) or not any_complete
            s["counted"] = counted
            s.setdefault("status", "ok" if counted else "incomplete")
            s.setdefault("status_reason", None if counted else "the step's window is not whole (version 1 summary)")
    data["schema_version"] = 2
    return data


# version -> the function that lifts a record of that version to the next
MIGRATIONS = {1: _v1_to_v2}

_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def problem_of(e: msgspec.ValidationError) -> str:
    """msgspec's message as ``FIELD: expected ...``."""
    text = str(e)
    m = _PATH.search(text)
    where = m.group(1) if m else ""
    what = _PATH.sub("", text)
    return f"{where or 'the record'}: {what[0].lower() + what[1:] if what else 'invalid'}"


def validate(data: dict) -> dict:
    """``data`` (a record as plain data, any readable version) checked and migrated to the
    current version.

    Raises:
        PerfscopeError: not a summary record, a version this perfscope does not read, or a field
            of the wrong type or out of range ("malformed summary: FIELD: ...").
    """
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise PerfscopeError("not a perfscope summary (schema field missing)")
    version = data.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise PerfscopeError(f"summary schema version {short_repr(version)} is not supported (this perfscope reads "
                             f"{', '.join(map(str, READABLE_VERSIONS))})")
    problem = _bad_number(data)
    if problem is None:
        try:
            msgspec.convert(data, Summary)
        except msgspec.ValidationError as e:
            problem = problem_of(e)
    if problem:
        raise PerfscopeError(f"malformed summary: {problem}")
    while data["schema_version"] < SCHEMA_VERSION:
        data = MIGRATIONS[data["schema_version"]](data)
    return data


def decode(text: bytes, where: str = "summary.json") -> dict:
    """A record from the bytes of a ``summary.json``, validated and migrated (:func:`validate`).

    Raises:
        PerfscopeError: one line starting with ``where``: not JSON (also ``Infinity``, ``NaN`` and
            ``1e999``, which JSON has no room for), a trace instead of a summary, or :func:`validate`'s.
    """
    if text[:2] == b"\x1f\x8b":  # gzip: a .json.gz trace, most likely, passed where a summary belongs
        raise PerfscopeError(f"{where}: a gzip file (a trace?), not a summary.json; run `perfscope analyze {where}` "
                             "and pass its output directory")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise PerfscopeError(f"{where}: malformed summary: not valid JSON ({e})") from None
    if isinstance(data, dict) and "traceEvents" in data or isinstance(data, list):
        raise PerfscopeError(f"{where}: a trace, not a summary.json; run `perfscope analyze {where}` and pass its "
                             "output directory")
    try:
        return validate(data)
    except PerfscopeError as e:
        raise PerfscopeError(f"{where}: {e}") from None


def encode(summary: dict) -> bytes:
    """``summary`` as the indented JSON text of ``summary.json`` (numpy scalars as numbers)."""
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def load_summary(path: str | Path) -> dict:
    """Read a ``summary.json`` (or the one inside an output directory): :func:`decode`.

    Raises:
        PerfscopeError: missing, or as :func:`decode`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    try:
        text = read_bounded(path)
    except FileNotFoundError:
        raise PerfscopeError(f"{path}: no such summary file") from None
    except OSError as e:
        raise PerfscopeError(f"{path}: cannot be read ({e.strerror or e})") from None
    return decode(text, str(path))


def write_summary(summary: dict, path: str | Path) -> Path:
    """Write ``summary`` as indented JSON, atomically."""
    return write_bytes_atomic(path, encode(summary))
