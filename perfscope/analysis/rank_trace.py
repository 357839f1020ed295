"""What one trace file contributed to an analysis (:class:`RankTrace`): the record that the per-file
work (:mod:`perfscope.analysis.rank`) produces and the views and the run's reduction read."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfscope.analysis import evidence as ev
from perfscope.analysis.steps import Launches, StepWindows
from perfscope.trace import TraceTable
from perfscope.trace.quality import DataQuality


@dataclass
class RankTrace:
    """What one trace file contributed.

    Attributes:
        table: The columnar trace.
        mode: ``"gpu"`` when it holds GPU events, else ``"cpu"``.
        metrics: Per-step metrics (``*_us``), one row per step.
        windows: The steps and their windows.
        launches: The launching runtime call of every GPU event.
        evidence: Each step's status and reason (:mod:`perfscope.analysis.evidence`).
        quality: The file's data-quality record: the table's, then the analysis's counts.
        warnings: Problems with the step markers (duplicates, overlaps, unparsable numbers).
        partition_sets: GPU traces: the interval sets the step partition is cut from
            (:func:`perfscope.analysis.partition.gpu_sets`), kept for the run-level details.
        operators: Per step, operator and input shape, the calls and times
            (:func:`perfscope.analysis.operator_view.operator_steps`); None when not placed.
        modules: Per step and ``nn.Module`` range, the calls and times
            (:func:`perfscope.analysis.module_view.module_steps`); None without module ranges.
    """

    table: TraceTable
    mode: str
    metrics: pd.DataFrame
    windows: StepWindows
    launches: Launches
    evidence: ev.Evidence
    quality: DataQuality
    warnings: list[str] = field(default_factory=list)
    partition_sets: list | None = field(default=None, repr=False)
    operators: pd.DataFrame | None = field(default=None, repr=False)
    modules: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def steps(self) -> np.ndarray:
        """Step numbers, in row order."""
        return self.windows.step

    @property
    def complete(self) -> np.ndarray:
        """Per step: recorded whole (status other than ``incomplete``)."""
        return self.evidence.status != ev.INCOMPLETE

    @property
    def has_markers(self) -> bool:
        return self.windows.has_markers
