"""Event dicts -> numpy columns, refusing values that do not fit instead of failing on them.

Real traces hold every shape of value: integers past 64 bits (u64 correlation ids, byte counts),
strings where numbers belong, lists where names belong, ``args: null``. Each helper here turns a
field of many events into one column and says how many values it could not use, so the table's
data-quality record can count them.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

NO_ID = -1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_I32_MAX = 2**31 - 1


def is_number(v) -> bool:
    """A real JSON number: int or float, not bool, not NaN."""
    return type(v) in (int, float) and v == v


def text(value) -> str:
    """A category or name as text; anything that is not a string (a list...) becomes its repr."""
    return value if isinstance(value, str) else ("" if value is None else str(value))


def args_of(event: dict) -> dict:
    """``event["args"]`` when it is an object, else ``{}`` (``args: null``, a list...)."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def int_column(values: list, *, upper: int = _I64_MAX) -> tuple[np.ndarray, int]:
    """Integers as int64; absent (None) values and those unusable become -1.

    Args:
        values: One value per event (None where the field is absent).
        upper: Largest value accepted (e.g. 2**31 - 1 for device indices).

    Returns:
        ``(column, unusable)``: the column and how many present values were not integers in
        ``[0, upper]`` (negative ids mean "none" in Kineto and are not counted).
    """
    n = len(values)
    if set(map(type, values)) <= {int, type(None)}:
        try:  # fast path: ints (bools excluded by the type check) that fit
            col = np.fromiter((NO_ID if v is None else v for v in values), dtype=np.int64, count=n)
            if upper >= _I64_MAX or not (col > upper).any():
                return col, 0
        except OverflowError:
            pass
    out = np.full(n, NO_ID, dtype=np.int64)
    bad = 0
    for i, v in enumerate(values):
        if v is None:
            continue
        if type(v) is float and v.is_integer():  # 12.0 from a writer that prints floats
            v = int(v)
        if type(v) is int and _I64_MIN <= v <= upper:
            out[i] = v
        else:
            bad += 1
    return out, bad


def id_column(values: list) -> tuple[np.ndarray, int]:
    """Identifiers that need only equality (correlation ids) as int64 codes >= 0, -1 when absent.

    Values that fit int64 are kept as they are; when some do not (u64 ids past 2**63), every
    distinct integer is given a dense code instead, which keeps equality and never fails.

    Returns:
        ``(column, unusable)``: how many present values were not integers (a float such as 1.5, a
        string), which become -1.
    """
    col, bad = int_column(values)
    if not bad:
        return col, 0
    present = [v if type(v) is int else (int(v) if type(v) is float and v.is_integer() else None) for v in values]
    unusable = sum(1 for v, p in zip(values, present) if v is not None and p is None)
    codes, _ = pd.factorize(pd.Series(present, dtype=object), use_na_sentinel=True)
    return codes.astype(np.int64), unusable


def stream_of_tid(tid) -> int:
    """Stream id from a GPU thread id: ``7`` or ``"stream 7"`` (2021 traces); -1 when none."""
    if type(tid) is int:
        return tid if 0 <= tid <= _I64_MAX else NO_ID
    digits = "".join(ch for ch in str(tid) if ch.isascii() and ch.isdigit())
    return int(digits) if digits and len(digits) <= 18 else NO_ID


def device_of_pid(pid) -> int:
    """GPU index from a 2021 GPU event's ``pid``; -1 when it is not a plausible index."""
    return pid if type(pid) is int and 0 <= pid <= _I32_MAX else NO_ID


def fingerprint(event: dict) -> str:
    """A text equal for two events exactly when every field (``args`` included) is equal."""
    try:
        return json.dumps(event, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # keys that do not sort: not from a JSON file, compare as written
        return repr(event)
