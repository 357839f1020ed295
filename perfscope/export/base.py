"""The experiment-tracker extension point: a :class:`Tracker` logs one
:class:`~perfscope.export.record.RunExport` (and its children) to its store.

Contract (``tests/test_export.py`` runs it on every tracker, reading the store back with the
tracker's own library): every parameter, tag, step metric (at its step), summary value and
artifact of the record is in the store; each child is a run of its own, linked to the parent; a
missing library raises :class:`TrackerUnavailable` naming the extra to install, before anything
is logged.
"""

from __future__ import annotations

import abc

from perfscope.errors import PerfscopeError
from perfscope.export.record import RunExport


class TrackerUnavailable(PerfscopeError):
    """The tracker's library is missing or cannot reach its store; the message says what to do."""


class Tracker(abc.ABC):
    """One experiment tracker.

    Attributes:
        name: ``--to`` / ``--export`` value (``mlflow``, ``wandb``).
        extra: The package extra that installs its library (``perfscope-torch[mlflow]``).
    """

    name = ""
    extra = ""

    @abc.abstractmethod
    def log(self, run: RunExport, *, experiment: str) -> str:
        """Log ``run`` and its children under ``experiment`` (an MLflow experiment, a W&B
        project); returns where it went, in words (run ID and store).

        Raises:
            TrackerUnavailable: the library is missing, or the store refuses.
        """

    def missing(self, module: str) -> TrackerUnavailable:
        """The error for a missing library."""
        return TrackerUnavailable(f"exporting to {self.name} needs the {module} package: "
                                  f"pip install '{self.extra}' (or pip install {module})")
