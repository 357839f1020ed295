"""What a study was made for: its script, arguments and ranks, and how its trials are measured.

A resumed study must go on measuring what it measured: another script or other arguments would
mix baselines, and other ``--steps-per-trial``, ``--warmup-steps`` or ``--seed`` would mix
measurements of different windows (a longer warm-up drains more of a DataLoader's prefetched
batches; another seed draws other data). Both are stored in the study on its first run and checked
on every later one.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import optuna

from perfscope.errors import PerfscopeError
from perfscope.record.lenient import lenient

COMMAND_ATTR = "perfscope.command"
MEASUREMENT_ATTR = "perfscope.measurement"
# The options that decide what a trial measures, by their name in the stored attribute.
MEASUREMENT_OPTIONS = {"warmup_steps": "--warmup-steps", "measure_steps": "--steps-per-trial", "seed": "--seed",
                       "target_rse": "--target-rse", "measure_cap_s": "--measure-cap"}


class StoredCommand(msgspec.Struct, kw_only=True):
    """The command a study was made for, as stored in it (``nnodes`` only for several nodes:
    studies made before multi-node tuning hold none). Read leniently: a part of the wrong type
    reads as absent, so a damaged one differs from any command and is named, not a crash."""

    script: str | None = None
    args: list[str] | None = None
    nproc_per_node: int | None = None
    nnodes: int | None = None


class CommandChanged(PerfscopeError):
    """The study was made for another command or measures its trials otherwise."""


def check_same_command(study: optuna.Study, options, *, space_attr: str) -> None:
    """Store the study's command and measurement on its first run; refuse other ones later.

    A study whose setup never finished (its baseline failed) holds no trial and takes the new
    command. A study made before the measurement was stored takes it now.

    Args:
        study: The study.
        options: The :class:`perfscope.tuner.tune.TuneOptions`.
        space_attr: The study attribute whose presence says the setup finished.

    Raises:
        CommandChanged: another script, other arguments or ranks, or another measurement.
    """
    command = {"script": options.script, "args": list(options.script_args), "nproc_per_node": options.nproc_per_node}
    if getattr(options, "nodes", None) is not None:  # absent for one node: studies made before multi-node tuning still match
        command["nnodes"] = options.nodes.nnodes
    measurement = {key: getattr(options, key) for key in MEASUREMENT_OPTIONS}
    fresh = space_attr not in study.user_attrs and not study.get_trials(deepcopy=False)
    stored = study.user_attrs.get(COMMAND_ATTR)
    if stored is None or (stored != command and fresh):
        study.set_user_attr(COMMAND_ATTR, command)
    elif stored != command:
        stored, command = lenient(stored, StoredCommand), lenient(command, StoredCommand)
        # the same words for both: the scripts differ by their folder, so name them in full
        full = words(stored) == words(command)
        raise CommandChanged(f"study {options.study_name!r} was made for `{words(stored, full=full)}`, not "
                             f"`{words(command, full=full)}`; pass another --study-name or --out to start a new one")
    _check_same_measurement(study, options, measurement, fresh)


def _check_same_measurement(study: optuna.Study, options, measurement: dict, fresh: bool) -> None:
    """Store the measurement options (a fresh study, or one made before they were stored);
    refuse other values than the stored ones.

    Raises:
        CommandChanged: naming each option whose value differs.
    """
    measured = study.user_attrs.get(MEASUREMENT_ATTR)
    if not isinstance(measured, dict) or fresh:  # none stored, or not one perfscope wrote: this one
        study.set_user_attr(MEASUREMENT_ATTR, measurement)
        return
    changed = [f"{flag} {measured.get(key)}, not {measurement[key]}" for key, flag in MEASUREMENT_OPTIONS.items()
               if key in measured and measured[key] != measurement[key]]
    if changed:
        raise CommandChanged(f"study {options.study_name!r} measures its trials with {'; '.join(changed)}: its "
                             "trials would not compare with new ones. Pass the same values to resume it, or another "
                             "--study-name or --out to start a new one")


def words(command: StoredCommand, *, full: bool = False) -> str:
    """A stored command as the user would type it (``full``: the script's whole path, not its name)."""
    ranks = f" --nproc-per-node {command.nproc_per_node}" if command.nproc_per_node else ""
    if command.nnodes:
        ranks = f" --nnodes {command.nnodes}" + ranks
    args = f" -- {' '.join(command.args)}" if command.args else ""
    script = command.script or "(no script)"
    return f"perfscope tune{ranks} {script if full else Path(script).name}{args}"
