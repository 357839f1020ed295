"""JSON values of many events -> numpy columns, by the rules of :mod:`perfscope.trace.columns`.

Each helper turns one field of a batch's events into a column (and, where the rules count them,
the values it could not use); the typed variants take what msgspec already checked (int, float,
str or None) and skip the checks the plain JSON values need. Integers are read as orjson reads
them (exact up to 64 bits, a float beyond), so both decoders give the same columns.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from perfscope.trace import columns as col

_NAN = float("nan")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1


class Incomplete(Exception):
    """The batch does not end at an event boundary (it was cut inside an event)."""


class Undecodable(Exception):
    """The batch holds text the strict decoders refuse; the whole file needs the repairing read."""


def as_orjson(v):
    """An integer as orjson gives it: exact within [-2**63, 2**64 - 1], a float beyond.

    Raises:
        Undecodable: an integer past a float's range, which orjson refuses (the repairing read
            makes it null and counts it).
    """
    if type(v) is int and not (_I64_MIN <= v <= _U64_MAX):
        try:
            return float(v)
        except OverflowError:
            raise Undecodable("an integer past a float's range") from None
    return v


class Interner:
    """Texts -> dense codes in order of first appearance, across batches (what
    ``pandas.factorize`` gives on the whole column, batch by batch)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []

    def merge(self, local: np.ndarray, uniques: list[str]) -> np.ndarray:
        """Codes of a batch (``local`` indexes ``uniques``) as global codes (int32)."""
        ids = np.empty(len(uniques), dtype=np.int32)
        for k, u in enumerate(uniques):
            g = self.codes.get(u)
            if g is None:
                g = self.codes[u] = len(self.values)
                self.values.append(u)
            ids[k] = g
        return ids[local] if len(local) else np.zeros(0, np.int32)

    def array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=object) if self.values else np.zeros(0, dtype=object)


def local_codes(texts: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes (int32) in order of first appearance, and the distinct texts."""
    if not texts:
        return np.zeros(0, np.int32), []
    codes, uniques = pd.factorize(np.asarray(texts, dtype=object), use_na_sentinel=False)
    return codes.astype(np.int32), list(uniques)


def ints(values: list, upper: int, name: str, bad_values: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(column, bad)``: integers in ``[-2**63, upper]`` as int64, -1 for absent and bad values
    (the rule of :func:`perfscope.trace.columns.int_column`, value by value)."""
    n = len(values)
    bad = np.zeros(n, dtype=bool)
    try:
        out = np.fromiter((col.NO_ID if v is None else v for v in values), dtype=np.int64, count=n)
        if all(type(v) is int or v is None for v in values) and not (out > upper).any():
            return out, bad
    except (OverflowError, TypeError, ValueError):
        pass
    out = np.full(n, col.NO_ID, dtype=np.int64)
    for i, v in enumerate(values):
        if v is None:
            continue
        v = as_orjson(v)
        w = int(v) if type(v) is float and v.is_integer() else v
        if type(w) is int and _I64_MIN <= w <= upper:
            out[i] = w
        else:
            bad[i] = True
            bad_values[(name, i)] = v
    return out, bad


def typed_ints(values: list, upper: int, name: str, bad_values: dict) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ints` of values msgspec typed (int, or None for an absent correlation)."""
    try:
        out = np.array(values, dtype=np.int64)
        if not (out > upper).any():
            return out, np.zeros(len(values), dtype=bool)
    except (OverflowError, TypeError):  # None among them, or past 64 bits
        obj = np.array(values, dtype=object)
        absent = obj == None  # noqa: E711 (elementwise)
        obj[absent] = col.NO_ID
        try:
            out = obj.astype(np.int64)
            if not (out > upper).any():
                return out, np.zeros(len(values), dtype=bool)
        except OverflowError:
            pass
    return ints(values, upper, name, bad_values)


def discriminator(values: list) -> np.ndarray:
    """``args["External id"]`` as int64: equal for exact copies of an event, different for most
    other pairs of events with the same name and times (so few are read again to compare)."""
    try:
        if all(type(v) is int or v is None for v in values):  # a float would be cast, not refused
            obj = np.array(values, dtype=object)
            obj[obj == None] = col.NO_ID  # noqa: E711 (elementwise)
            return obj.astype(np.int64)
    except OverflowError:
        pass
    # as orjson gives them, so a copy decoded by either path mixes the same
    values = [as_orjson(v) for v in values]
    return np.array([v if type(v) is int and _I64_MIN <= v <= _I64_MAX else
                     (col.NO_ID if v is None else zlib.crc32(repr(v).encode())) for v in values], dtype=np.int64)


def numbers(values: list, typed: bool) -> np.ndarray:
    """Real numbers (not bools, not NaN) as float64; NaN for everything else."""
    if typed:  # floats only (NaN where absent)
        return np.array(values, dtype=np.float64)
    try:
        if all(type(v) is float or type(v) is int for v in values):
            return np.array(values, dtype=np.float64)
    except OverflowError:
        pass
    return np.array([float(v) if col.is_number(v) else _NAN for v in values], dtype=np.float64)


_NONE = object()  # stands for None in a factorization (pandas would make None a NaN)


def first_seen(values: list) -> tuple[np.ndarray, list]:
    """Codes (int32) of hashable values in order of first appearance, and the distinct values,
    None kept as None. For values that never compare equal across types: int, str and None, as
    msgspec gives them."""
    if not values:
        return np.zeros(0, np.int32), []
    arr = np.array(values, dtype=object)
    none = arr == None  # noqa: E711 (elementwise)
    if none.any():
        arr[none] = _NONE
    codes, uniques = pd.factorize(arr, use_na_sentinel=False)
    return codes.astype(np.int32), [None if u is _NONE else u for u in uniques]


def ids(values: list, typed: bool) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """pid/tid values: codes of their text (``str(value)``), their uniques, and per row the GPU
    index and stream a 2021 trace encodes in them; converted once per distinct value.

    ``typed``: the values are int, str or None only (msgspec checked them), which never compare
    equal across types; values from dicts may be bools or floats (``1 == True == 1.0``) and are
    kept apart by type.
    """
    if typed:
        codes, raws = first_seen(values)
    else:
        index: dict = {}
        raws, codes = [], np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            try:
                k = index.setdefault((type(v), v), len(raws))
            except TypeError:  # unhashable (a list): on its own
                k = -1
            if k == -1 or k == len(raws):
                k = len(raws)
                raws.append(v)
            codes[i] = k
    raws = [as_orjson(v) for v in raws]
    t_codes, t_uniques = local_codes([str(v) for v in raws])
    device = np.array([col.device_of_pid(v) for v in raws], dtype=np.int32)
    stream = np.array([col.stream_of_tid(v) for v in raws], dtype=np.int64)
    return t_codes[codes], t_uniques, device[codes], stream[codes]


def text_codes(values: list, missing_is_odd: bool, typed: bool) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Names or categories: codes of their text, uniques, and whether each was not text.

    ``typed``: str, or None for an absent category (text ``""``, not odd).
    """
    if typed or all(type(v) is str for v in values):
        if not values:
            return np.zeros(0, np.int32), [], np.zeros(0, bool)
        codes, uniques = first_seen(values)
        return codes, [u if u is not None else "" for u in uniques], np.zeros(len(values), bool)
    odd = np.array([(type(v) is not str) and (missing_is_odd or v is not None) for v in values], dtype=bool)
    codes, uniques = local_codes([col.text(v) for v in values])
    return codes, uniques, odd


def narrow(a: np.ndarray) -> np.ndarray:
    """Integer values as int32 when they all fit, else as they are (int64): a batch's columns,
    and the trace table's identifier columns (joined batches widen again where one needs it).
    An int32 array is returned itself, not copied."""
    if a.dtype == np.int32:
        return a
    if a.size and (a.min() < -(2**31) or a.max() > 2**31 - 1):
        return a
    return a.astype(np.int32)


_SIGNED = (np.int8, np.int16, np.int32, np.int64)


def smallest_int(a: np.ndarray) -> np.ndarray:
    """Signed integer values in the smallest of int8, int16, int32 and int64 that holds them all
    (``a`` itself when that is its own type); other arrays are returned as they are. A batch's
    codes and identifiers mostly fit one or two bytes (a few hundred names, eight streams), and a
    large trace keeps tens of millions of rows of them. An empty integer array is int8, whatever
    its type: the same for every path that builds it."""
    if a.dtype.kind != "i":
        return a
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    for t in _SIGNED:
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return a if a.dtype == t else a.astype(t)
    return a
