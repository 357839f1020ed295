"""The error the collection layer raises for problems the user can fix."""

from perfscope.errors import PerfscopeError


class CollectError(PerfscopeError):
    """The script cannot be profiled: missing script, unwritable output directory, ...

    Raised before the script starts whenever possible; the message is one line.
    """


class ScheduleError(CollectError, ValueError):
    """A :class:`~perfscope.collect.ProfileSchedule` field is out of range.

    A ValueError (bad argument value) that the CLI also reports as a
    one-line ``perfscope: error:`` message, since options like
    ``--max-steps`` map straight onto the fields.
    """
