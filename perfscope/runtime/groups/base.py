"""The knob group: the unit in which the runtime and the tuner are extended.

A group owns some keys of the configuration (:class:`~perfscope.runtime.config.AccelConfig`) end
to end: how ``perfscope.accelerate`` applies them to a training loop, how launch-time patching
applies them to an unmodified script, what the baseline run shows of the script's own values,
which of them the tuner searches (and why the others are left out), and the first guess for the
bottleneck they remove. ``docs/runtime.md`` ("Adding a knob") walks through writing one;
``tests/test_knob_groups.py`` is the contract every group must pass.

Groups are passed as instances (``build_space(..., groups=...)``, ``patching.plan(config,
groups=...)``); :data:`perfscope.runtime.groups.GROUPS` holds the built-in ones in the order
``accelerate`` applies them.

This module imports neither torch nor optuna: a group imports them inside the methods that need
them (the runtime runs in the user's training process; the tuner's side only in the tuner).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perfscope.record.run_facts import RunFacts, run_facts

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from perfscope.runtime.accelerator_state import Accelerator
    from perfscope.runtime.config import AccelConfig
    from perfscope.runtime.patch_report import PatchReport

# ``put(key, value, at_most=False)``: set a trial parameter of the guess within the knob's
# distribution (see tuner.space.rule_based_guess); ``at_most``: a value between numeric choices
# becomes the largest choice not above it, not the nearest.
Put = Callable[[str, Any], None]
# Why a model knob is left out of the search when no model was seen (fused_ops, channels_last, compile).
NO_MODEL = "the run showed no model (no nn.Module with parameters was called)"


@dataclasses.dataclass(frozen=True)
class Knob:
    """One searched parameter.

    Attributes:
        name: The :class:`AccelConfig` key.
        serves: The bottlenecks it removes, as the verdict classes of
            :mod:`perfscope.analysis.verdict` (``"io"``, ``"comm"``, ``"launch"``, ``"compute"``);
            it is searched when any of them takes a visible share of the baseline's step time.
        distribution: Its Optuna distribution.
        baseline: The value the script runs with on its own (a point of ``distribution``).
        when: ``(parent, values)``: only suggested when the parent knob takes one of ``values``
            (prefetch_factor needs worker processes); otherwise it keeps its baseline value.
        group: The name of the group that owns it.
    """

    name: str
    serves: tuple[str, ...]
    distribution: BaseDistribution
    baseline: object
    when: tuple[str, tuple] | None = None
    group: str = ""

    def choices_text(self) -> str:
        """The distribution in words, e.g. ``0..8`` or ``O0, O1, O2``."""
        d = self.distribution
        if hasattr(d, "choices"):
            return ", ".join(map(str, d.choices))
        scale = " (log)" if getattr(d, "log", False) else ""
        return f"{d.low:g}..{d.high:g}{scale}"


@dataclasses.dataclass
class SearchPart:
    """What a group contributes to a search space.

    Attributes:
        knobs: The knobs to search (``group`` is filled in by :meth:`KnobGroup.search_part`).
        excluded: key (or ``key=value`` for one value of a searched key) -> why it is not
            searched; every key of the group is in ``knobs`` or here.
    """

    knobs: list[Knob] = dataclasses.field(default_factory=list)
    excluded: dict[str, str] = dataclasses.field(default_factory=dict)

    def exclude(self, keys, why: str) -> None:
        """Leave ``keys`` (one name or several) out, for ``why``."""
        for key in (keys,) if isinstance(keys, str) else keys:
            self.excluded[key] = why


class KnobGroup(abc.ABC):
    """A set of configuration keys and everything the runtime and the tuner do with them.

    Subclasses set :attr:`name`, :attr:`keys` and :attr:`title`, and implement the four abstract
    methods. The contract (``tests/test_knob_groups.py``): every configuration key belongs to
    exactly one group; :meth:`search` puts each key of the group among the knobs or the
    exclusions, with a reason; a knob's baseline is a point of its distribution and is the
    script's own value (:meth:`observed`), so the baseline maps to an empty change; every value a
    knob can take other than its baseline is applied by :meth:`apply` or named as skipped, and is
    applied by :meth:`launch_plan` or named as needing ``perfscope.accelerate``.

    Attributes:
        name: Short name (``"input"``), shown in the tuning report.
        keys: The configuration keys it owns.
        title: What its knobs are, in a few words (the tuning report's legend).
    """

    name: str = ""
    keys: tuple[str, ...] = ()
    title: str = ""

    @abc.abstractmethod
    def apply(self, acc: Accelerator) -> None:
        """Apply the group's keys of ``acc.config`` inside ``perfscope.accelerate``.

        Replaces ``acc.model`` / ``acc.optimizer`` / ``acc.loader`` where the knob needs another
        object, and records each changed key in ``acc.applied`` (what was done) or
        ``acc.skipped`` (why not).

        Raises:
            ConfigError: a value this setup cannot honour (named key, what to do instead).
        """

    @abc.abstractmethod
    def launch_plan(self, config: AccelConfig, report: PatchReport) -> None:
        """Describe, without installing anything, what launch-time patching does with the
        group's keys: ``report.applied[key]`` for what it patches, ``report.needs_accelerate[key]``
        for what needs the training loop's cooperation."""

    def launch_patches(self, config: AccelConfig, report: PatchReport) -> list[contextlib.AbstractContextManager]:
        """The context managers that patch an unmodified script for the group's keys of
        ``config`` (installed in order, removed in reverse when the run ends); default: none."""
        return []

    @abc.abstractmethod
    def observed(self, facts: RunFacts) -> dict[str, Any]:
        """The script's own value of each key, as the baseline run showed it.

        Args:
            facts: The baseline's run facts (``perfscope.measure``'s record, read as
                :class:`~perfscope.record.run_facts.RunFacts`: ``dataloader``, ``ddp``, ``tf32``,
                ``threads`` ...).

        Returns:
            key -> value for the keys the run shows (None or absent: not shown by this run).
        """

    @abc.abstractmethod
    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        """The knobs the tuner may search for this run, and why the others cannot apply.

        Args:
            facts: The baseline's run facts (see :meth:`observed`).
            cpu: CPU cores of this node that the run may use.
        """

    def guess(self, verdict: str, bottlenecks: frozenset[str], facts: RunFacts, fractions: dict, cpu: int,
              params: dict, put: Put) -> None:
        """Add the group's rule-based first guess through ``put``; default: none.

        Args:
            verdict: The baseline's verdict (``"io-bound"`` ...): rules that change the numerics
                (compression, a larger effective batch) act only on the verdict's bottleneck.
            bottlenecks: The bottlenecks to act on (``"io"``, ``"comm"``, ``"launch"``,
                ``"compute"``): the verdict's, and each other one whose share of the step reaches
                the share at which the classifier would name it (see
                :func:`perfscope.tuner.space.guess_bottlenecks`).
            facts: Run facts; fractions: the summary's ``overall.fractions`` (shares in [0, 1]).
            cpu: CPU cores of this node; params: the guess so far (trial parameters).
        """

    def search_part(self, facts: dict | RunFacts, cpu: int) -> SearchPart:
        """:meth:`search` of ``facts`` (plain data is read once, :func:`~perfscope.record.run_facts.run_facts`),
        with each knob marked as this group's."""
        part = self.search(run_facts(facts), cpu)
        part.knobs = [dataclasses.replace(k, group=self.name) for k in part.knobs]
        return part

    def changed(self, config: AccelConfig) -> list[str]:
        """The group's keys that ``config`` sets away from the defaults."""
        changes = config.changes()
        return [k for k in self.keys if k in changes]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def record(acc: Accelerator, key: str, done: str | None, why: str | None) -> None:
    """A knob's outcome inside ``perfscope.accelerate``: ``acc.applied[key] = done``, or
    ``acc.skipped[key] = why`` when nothing was done."""
    if done:
        acc.applied[key] = done
    else:
        acc.skipped[key] = why


def on_first_model(key: str, change: Callable, report: PatchReport) -> contextlib.AbstractContextManager:
    """The launch-time patch of a model knob: ``change(model) -> (done, why)`` on the first module
    the script calls that holds parameters (:func:`perfscope.runtime.model_scan.first_model`),
    reported as applied (``done``) or not applied (``why``)."""
    from perfscope.runtime.model_scan import first_model  # imports torch

    def apply(model) -> None:
        done, why = change(model)
        if done:
            report.applied[key] = done
        else:
            report.applied.pop(key, None)
            report.not_applied[key] = why

    return first_model(apply)


def categorical(choices):
    """``optuna.distributions.CategoricalDistribution(choices)`` (imported when first needed)."""
    from optuna.distributions import CategoricalDistribution

    return CategoricalDistribution(list(choices))


def int_range(low: int, high: int):
    """``optuna.distributions.IntDistribution(low, high)`` (imported when first needed)."""
    from optuna.distributions import IntDistribution

    return IntDistribution(low, high)


def within(distribution, value) -> bool:
    """``value`` is a point of an Optuna distribution: one of a categorical's ``choices``, or
    between an int or float distribution's ``low`` and ``high`` on its ``step`` (the public
    attributes of ``optuna.distributions``; checked against Optuna 5.1.0)."""
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return value in choices
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not distribution.low <= value <= distribution.high:
        return False
    step = getattr(distribution, "step", None)
    if not step:
        return True
    offset = (value - distribution.low) / step
    return abs(offset - round(offset)) < 1e-8

