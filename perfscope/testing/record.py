"""The record contracts: a summary (as plain data) is valid against the schema, and every field it
holds is one the schema names (:mod:`perfscope.record.schema`), so that nothing an analysis writes
goes undocumented or unchecked; likewise a tuning record (``tune.json``) against
:mod:`perfscope.record.tune_schema`."""

from __future__ import annotations

import copy
import types
import typing

import msgspec

from perfscope.errors import PerfscopeError
from perfscope.record import Summary, validate
from perfscope.record.tune_schema import TuneRecord
from perfscope.testing import expect


def struct_of(kind) -> type | None:
    """The struct a field's type holds (through ``Annotated``, unions, lists and dict values), or None."""
    if typing.get_origin(kind) is typing.Annotated:
        return struct_of(typing.get_args(kind)[0])
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return next((s for s in map(struct_of, typing.get_args(kind)) if s is not None), None)
    if typing.get_origin(kind) is list:
        return struct_of(typing.get_args(kind)[0])
    if typing.get_origin(kind) is dict:
        return struct_of(typing.get_args(kind)[1])
    return kind if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else None


def _is_mapping(kind) -> bool:
    """The field is an object of objects by name (``dict[str, Struct]``)."""
    if typing.get_origin(kind) is typing.Annotated:
        return _is_mapping(typing.get_args(kind)[0])
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return any(_is_mapping(a) for a in typing.get_args(kind))
    return typing.get_origin(kind) is dict


def unnamed(data, struct=Summary, at: str = "") -> set[str]:
    """Paths (``details.memory.x``, ``steps[].y``) of ``data``'s fields that ``struct`` does not name."""
    out: set[str] = set()
    if isinstance(data, list):
        for x in data:
            out |= unnamed(x, struct, at + "[]")
    elif isinstance(data, dict) and struct is not None:
        hints = typing.get_type_hints(struct, include_extras=True)
        names = {f.encode_name: f.name for f in msgspec.structs.fields(struct)}
        for key, value in data.items():
            if key not in names:
                out.add(f"{at}.{key}" if at else key)
                continue
            kind = hints[names[key]]
            sub, here = struct_of(kind), f"{at}.{key}" if at else key
            if _is_mapping(kind):
                if sub is not None and isinstance(value, dict):
                    for name, x in value.items():
                        out |= unnamed(x, sub, f"{here}.{name}")
                continue
            out |= unnamed(value, sub, here)
    return out


def check_record(summary: dict) -> None:
    """``summary`` (plain data, as JSON has it) passes :func:`perfscope.record.validate` unchanged
    and holds no field the schema does not name."""
    try:
        checked = validate(copy.deepcopy(summary))
    except PerfscopeError as e:
        raise AssertionError(f"the record is not valid: {e}") from None
    expect(checked == summary, "validating the record changed it (a migration ran on a current record?)")
    missing = unnamed(summary)
    expect(not missing, f"fields the schema does not name: {', '.join(sorted(missing))}")


def check_tune_record(record: dict) -> None:
    """``record`` (a ``tune.json`` as plain data) converts to the tuning record's schema with
    every type as declared, and holds no field the schema does not name."""
    try:
        msgspec.convert(record, TuneRecord)
    except msgspec.ValidationError as e:
        raise AssertionError(f"the tuning record is not valid: {e}") from None
    missing = unnamed(record, TuneRecord)
    expect(not missing, f"fields the tuning record's schema does not name: {', '.join(sorted(missing))}")
