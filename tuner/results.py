"""A run's outputs, written as one unit: ``tune.json``, ``report.html``, ``best.yaml``, ``best/`` and
``diff.html`` in the output folder always come from the same run.

Before a run writes its first output, the earlier run's unit is set aside: when it holds a proven
recommendation (a ``best.yaml`` that changes something) the whole unit moves to ``previous/``
(replacing an older ``previous/``), otherwise its files are removed or replaced. So a "keep your
current settings" answer never silently replaces a proven ``best.yaml``, and an earlier
``diff.html`` ("B is 9.56x faster") never sits beside a report that says to keep the settings.
Whenever ``previous/`` holds a recommendation this run did not confirm, a note says where it is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from perfscope.runtime.config import ConfigError, read_yaml
from perfscope.tuner import record as tune_record

PREVIOUS = "previous"
"""Folder (in the output folder) of the last proven recommendation a later run superseded."""


class RunOutputs:
    """The output unit of one run of ``perfscope tune``.

    Args:
        out_dir: The output folder.
        best_path: The configuration file (``best.yaml``, or the ``--out`` YAML file).
    """

    def __init__(self, out_dir: Path, best_path: Path) -> None:
        self.out = Path(out_dir)
        self.best = Path(best_path)
        self.began = False
        self.notes: list[str] = []

    def unit(self) -> list[Path]:
        """The files and folders of one run's unit."""
        return [self.out / "tune.json", self.out / "report.html", self.best, self.out / "best",
                self.out / "diff.html"]

    def begin(self) -> list[str]:
        """Set the earlier run's unit aside (once per run, before its first write).

        Returns:
            Lines for the console and the record's notes (empty when nothing was set aside).

        Raises:
            OSError: the folder cannot be changed.
        """
        if self.began:
            return []
        self.began = True
        earlier = [p for p in self.unit() if p.exists() or p.is_symlink()]
        if _worth_keeping(self.best):
            staging = self.out / f".{PREVIOUS}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            for path in earlier:
                os.replace(path, staging / path.name)
            _remove(self.out / PREVIOUS)
            os.replace(staging, self.out / PREVIOUS)
            changes = proven_changes(self.out / PREVIOUS / self.best.name)
            what = _changes_text(changes) if changes else f"its {self.best.name}"
            self.notes.append(f"the earlier run's results (recommending {what}) were moved to "
                              f"{self.out / PREVIOUS}/; the folder now holds this run's")
        else:
            for path in earlier:
                if path.name in ("tune.json", "report.html"):
                    continue  # replaced atomically by this run's own, at once
                _remove(path)
        return list(self.notes)

    def write(self, record: dict, recommendation: dict | None, *, comment: str | None = None) -> None:
        """Write this run's ``best.yaml`` (when it has a recommendation), ``tune.json`` and report.

        Args:
            record: The ``tune.json`` record (its notes get the lines of :meth:`begin` first).
            recommendation: The record's recommendation, or None (interrupted before one: no
                ``best.yaml`` is written).
            comment: The first line of ``best.yaml``.

        Raises:
            OSError: a file cannot be written (each is written atomically).
        """
        self.begin()
        if recommendation is not None:
            from perfscope.runtime.config import config_from_dict, save_config

            save_config(config_from_dict(recommendation["config"]), self.best, comment=comment or "", only_changes=True)
        tune_record.write_outputs(self.out, record, best=self.best if recommendation is not None else None)

    def previous_note(self, recommendation: dict | None) -> str | None:
        """A line when ``previous/`` holds a recommendation that this run's answer does not confirm."""
        if recommendation is None or recommendation.get("status") == "faster":
            return None
        changes = proven_changes(self.out / PREVIOUS / self.best.name)
        if not changes:
            return None
        return (f"an earlier run recommended {_changes_text(changes)}; this run did not confirm it (its results "
                f"are kept in {self.out / PREVIOUS}/)")


def proven_changes(path: Path) -> dict | None:
    """The changes a ``best.yaml`` makes (None when it is missing, empty or not a mapping)."""
    if not Path(path).is_file():
        return None
    try:
        data = read_yaml(path)  # bounded, no aliases: a hand-edited file cannot take the memory
    except ConfigError:
        return None
    return data if isinstance(data, dict) and data else None


def _worth_keeping(best: Path) -> bool:
    """Whether an earlier ``best.yaml`` says more than "keep your settings" (or cannot be read:
    then it is kept too, never removed)."""
    if not best.is_file():
        return False
    try:
        data = read_yaml(best)
    except ConfigError:
        return True
    return data not in (None, {})


def _changes_text(changes: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in changes.items())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
