"""Reading a record leniently: every part that fits its struct's declared type is kept, every part
that does not is left out, so a hand-edited, truncated or half-written record still reads.

:func:`lenient` is for records a page must render whatever they hold (the tuning report renders
``tune.json`` of killed, running and hand-edited studies); the summary record is validated strictly
instead (:mod:`perfscope.record.codec`), because its readers compute with it.

What "left out" means, by the declared type of the part:

- a struct field: ``None`` (every field of the tuning record's structs admits it), so a field
  the record does not hold and one it holds with the wrong type read the same, and a writer's
  default (``schema``, ``schema_version``) is never taken for a fact the record does not state;
- an item of a list: dropped (``[1, "x", 2]`` as ``list[float]`` reads ``[1.0, 2.0]``);
- a value of a mapping: ``None`` where the value type admits it, else the key is dropped;
- an object with nothing in it (``{}``) where a struct is declared: ``None``, as absent.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)

_MISSING = object()


def lenient(value: Any, struct: type[S]) -> S:
    """``value`` (plain data: dicts, lists, numbers, text, as ``json.loads`` returns) as an
    instance of ``struct``, every part that does not fit left out (module docstring).

    Anything that is not a mapping reads as ``struct`` with every field ``None``. Never raises
    for bad data. Meant for structs whose fields all admit ``None`` (the struct is built without
    a type check, so a field that does not would hold ``None`` all the same).
    """
    out = _struct(value, struct)
    return out if out is not None else _empty(struct)


def _empty(struct: type[S]) -> S:
    return struct(**{name: None for name, _, _ in _fields(struct)})


@functools.cache
def _fields(struct: type) -> tuple[tuple[str, str, Any], ...]:
    """(attribute name, name in the record, declared type) of each field of ``struct``."""
    return tuple((f.name, f.encode_name, f.type) for f in msgspec.structs.fields(struct))


def _struct(value: Any, struct: type[S]) -> S | None:
    if not isinstance(value, dict):
        return None
    kwargs = {}
    for name, key, declared in _fields(struct):
        got = _fit(value.get(key, None), declared)
        kwargs[name] = None if got is _MISSING else got
    return struct(**kwargs)


@functools.cache
def _parts(declared: Any) -> tuple[tuple[Any, ...], bool]:
    """The alternatives of a declared type, without ``Annotated`` and ``None``, and whether
    ``None`` is one of them."""
    while typing.get_origin(declared) is typing.Annotated:
        declared = typing.get_args(declared)[0]
    origin = typing.get_origin(declared)
    if origin is typing.Union or origin is types.UnionType:
        options = list(typing.get_args(declared))
    else:
        options = [declared]
    nullable = type(None) in options or Any in options
    return tuple(o for o in options if o is not type(None)), nullable


def _fit(value: Any, declared: Any) -> Any:
    """``value`` read as ``declared`` with the parts that do not fit left out, or ``_MISSING``
    when nothing of it fits."""
    if value is None:
        return _MISSING
    options, _ = _parts(declared)
    for option in options:
        got = _fit_one(value, option)
        if got is not _MISSING:
            return got
    return _MISSING


def _fit_one(value: Any, option: Any) -> Any:
    if isinstance(option, type) and issubclass(option, msgspec.Struct):
        return _struct(value, option) if isinstance(value, dict) and value else _MISSING
    origin = typing.get_origin(option)
    if origin is list:
        return _fit_list(value, option) if isinstance(value, list) else _MISSING
    if origin is dict:
        return _fit_dict(value, option) if isinstance(value, dict) else _MISSING
    try:
        return msgspec.convert(value, option)
    except (msgspec.ValidationError, TypeError):
        return _MISSING


def _fit_list(value: list, option: Any) -> list:
    """The items that fit, in their order."""
    (item,) = typing.get_args(option) or (Any,)
    kept = (_fit(v, item) for v in value)
    return [v for v in kept if v is not _MISSING]


def _fit_dict(value: dict, option: Any) -> dict:
    """The entries whose key fits; a value that does not fit is None where the type admits it,
    else its entry is dropped."""
    key_type, value_type = typing.get_args(option) or (Any, Any)
    _, nullable = _parts(value_type)
    out = {}
    for k, v in value.items():
        if _fit_one(k, key_type) is _MISSING:
            continue
        got = _fit(v, value_type)
        if got is not _MISSING or nullable:
            out[k] = None if got is _MISSING else got
    return out
