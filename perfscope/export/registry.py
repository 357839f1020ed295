"""The built-in trackers by name (:class:`~perfscope.export.base.Tracker` instances)."""

from __future__ import annotations

from perfscope.errors import PerfscopeError
from perfscope.export.base import Tracker
from perfscope.export.mlflow import MlflowTracker
from perfscope.export.wandb import WandbTracker

TRACKERS = ("mlflow", "wandb")


def tracker(name: str) -> Tracker:
    """The tracker called ``name`` (one of :data:`TRACKERS`).

    Raises:
        PerfscopeError: no such tracker.
    """
    found = {t.name: t for t in (MlflowTracker(), WandbTracker())}.get(name)
    if found is None:
        raise PerfscopeError(f"no tracker {name!r}: use one of {', '.join(TRACKERS)}")
    return found
