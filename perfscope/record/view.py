"""The summary record as structs, for the code that renders or reads it (the console lines, the
report's sections, the diff, ``check``, ``forecast``, ``merge``, the tuner's words of a trial): every
object is the schema's struct, so a reader writes ``record.details.memory.peak_bytes`` and tests
``is None`` where it used to guard each level of a dict and each value's type.

The step rows stay mappings: the step-time rules (:mod:`perfscope.steptime`), which the analysis
that builds the rows shares, read them, and which columns a row has is part of what it says (a
column no step of a trace has is absent). :func:`perfscope.record.codec.decode` has validated them
as :class:`~perfscope.record.schema.Step` already.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from perfscope.errors import PerfscopeError
from perfscope.record.codec import problem_of
from perfscope.record.schema import Details, Overall, Summary


class Record(Summary):
    """:class:`~perfscope.record.schema.Summary` with its step rows as plain mappings."""

    steps: Annotated[list[dict[str, Any]] | None, Meta(description='one mapping per rank and step')] = None

    def overall_or_empty(self) -> Overall:
        """``overall``, an empty one where the record has none."""
        return self.overall or Overall()

    def details_or_empty(self) -> Details:
        """``details``, an empty one where the record has none."""
        return self.details or Details()


def record_of(summary: dict | Record) -> Record:
    """``summary`` (a record as plain data: the builder's output or :func:`~perfscope.record.codec.decode`'s)
    as a :class:`Record`; a :class:`Record` as it is. Fields the schema does not name are left out.

    Raises:
        PerfscopeError: a field of the wrong type ("malformed summary: FIELD: ..."); a record that
            ``decode`` read, or that the analysis built, never has one.
    """
    if isinstance(summary, Record):
        return summary
    try:
        return msgspec.convert(summary, Record)
    except msgspec.ValidationError as e:
        raise PerfscopeError(f"malformed summary: {problem_of(e)}") from None
