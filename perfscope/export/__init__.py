"""Exporting a run to an experiment tracker: ``perfscope export DIR --to mlflow|wandb``, and
``--export`` on ``profile`` and ``tune``.

:mod:`.record` reads an output folder once into a :class:`~.record.RunExport` (parameters, tags,
step-indexed metrics, summary scalars, artifacts, child runs); each tracker
(:class:`~.base.Tracker`: :class:`~.mlflow.MlflowTracker`, :class:`~.wandb.WandbTracker`) logs
that one record its own way. ``tests/test_export.py`` runs the contract on both, reading each
store back with its own library.
"""

from __future__ import annotations

from perfscope.export.base import Tracker
from perfscope.export.record import RunExport, StepMetrics, read_export
from perfscope.export.registry import TRACKERS, tracker

__all__ = ["TRACKERS", "RunExport", "StepMetrics", "Tracker", "read_export", "tracker"]
