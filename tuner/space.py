"""The search space, shaped by the baseline's profile and by what the run can use.

Each key of the runtime configuration (:class:`perfscope.runtime.config.AccelConfig`) is owned by
one knob group (:mod:`perfscope.runtime.groups`), which says which of its knobs can apply to this
run (a GPU, a process group, a DataLoader, ``perfscope.accelerate`` in the script) and why the
others cannot. The space holds the applicable knobs whose bottleneck takes a visible share of the
baseline's step time; every knob left out keeps a reason.

Trial parameters use Optuna distributions. A parameter's *baseline* value is what the script does
on its own (read from the baseline run), so the baseline is a point of the space, and a trial's
configuration holds only the knobs that differ from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from typing import Any

import msgspec
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
    json_to_distribution,
)

from perfscope.analysis.verdict import CLASSES as VERDICT_CLASSES
from perfscope.analysis.verdict import THRESHOLDS as VERDICT_THRESHOLDS
from perfscope.record.run_facts import RunFacts, run_facts
from perfscope.runtime.config import AccelConfig, config_from_dict
from perfscope.runtime.groups import GROUPS, Knob, KnobGroup, owner
from perfscope.tuner.attrs import SetupUnreadable

# The bottlenecks a knob can remove: the verdict classes of perfscope.analysis.verdict (``io`` for
# ``io-bound`` ...), each measured by the summary fraction of the same name.
BOTTLENECKS = VERDICT_CLASSES
# A bottleneck that takes less of the baseline's step time than this is not searched: its best
# case (removing all of it) is within a trial's measurement noise on a shared machine.
MIN_BOTTLENECK_SHARE = 0.05
# Bottleneck names of spaces stored before the knob groups (``groups`` in a study's space JSON).
_LEGACY_SERVES = {"input": "io", "precision": "compute", "communication": "comm", "launch": "launch"}


@dataclasses.dataclass
class SearchSpace:
    """The knobs to search, in bottleneck order, and the knobs left out with reasons.

    Attributes:
        knobs: Searched knobs, those removing the verdict's bottleneck first.
        excluded: knob -> why it is not searched.
        order: Bottlenecks (``io``, ``comm``, ``launch``, ``compute``): the verdict's first, then
            by their share of the baseline's step time, largest first (equal shares in that order).
        verdict: The baseline's verdict the space was shaped by.
        titles: group name -> what its knobs are (for the report's legend).
    """

    knobs: list[Knob]
    excluded: dict[str, str]
    order: list[str]
    verdict: str
    titles: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def baseline_params(self) -> dict:
        """The baseline as trial parameters."""
        return {k.name: k.baseline for k in self.knobs}

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {k.name: k.distribution for k in self.knobs}

    def suggest(self, trial: optuna.Trial) -> dict:
        """Ask the trial for every knob (conditional knobs only when their parent allows them)."""
        params: dict = {}
        for knob in self.knobs:
            if knob.when is not None and params.get(knob.when[0]) not in knob.when[1]:
                params[knob.name] = knob.baseline
                continue
            params[knob.name] = _suggest(trial, knob)
        return params

    def sample(self, rng: random.Random) -> dict:
        """Random parameters (uniform over each distribution; log-uniform where it is log)."""
        params: dict = {}
        for knob in self.knobs:
            d = knob.distribution
            if knob.when is not None and params.get(knob.when[0]) not in knob.when[1]:
                params[knob.name] = knob.baseline
            elif isinstance(d, CategoricalDistribution):
                params[knob.name] = rng.choice(list(d.choices))
            elif isinstance(d, IntDistribution):
                params[knob.name] = rng.randrange(d.low, d.high + 1, d.step)
            else:
                low, high = (math.log(d.low), math.log(d.high)) if d.log else (d.low, d.high)
                value = rng.uniform(low, high)
                params[knob.name] = math.exp(value) if d.log else value
        return params

    def at_top(self, changes: dict) -> list[Knob]:
        """The knobs that ``changes`` sets to the largest value of an ordered numeric range of two
        values or more (an integer range's high end; the largest of numeric choices): values beyond
        it were not tried."""
        top = []
        for knob in self.knobs:
            value, d = changes.get(knob.name), knob.distribution
            if value is None or isinstance(value, bool):
                continue
            if isinstance(d, CategoricalDistribution):
                numeric = [c for c in d.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
                if len(numeric) == len(d.choices) >= 2 and value == max(numeric):
                    top.append(knob)
            elif isinstance(d, (IntDistribution, FloatDistribution)) and d.high > d.low and value >= d.high:
                top.append(knob)
        return top

    def to_config(self, params: dict) -> AccelConfig:
        """The configuration of a trial: only the knobs whose value differs from the baseline.

        Raises:
            ConfigError: an impossible combination (e.g. prefetch_factor without workers).
        """
        changes = {}
        for knob in self.knobs:
            if knob.name in params and params[knob.name] != knob.baseline:
                changes[knob.name] = params[knob.name]
        if not params.get("num_workers", _baseline(self, "num_workers")):
            changes.pop("prefetch_factor", None)  # meaningless without worker processes
        return config_from_dict(changes)

    def describe(self) -> dict:
        """JSON-able description (``tune.json``'s ``space``)."""
        return {
            "verdict": self.verdict,
            "order": list(self.order),
            "searched": [{"name": k.name, "group": k.group, "serves": list(k.serves), "choices": k.choices_text(),
                          "baseline": k.baseline} for k in self.knobs],
            "excluded": dict(self.excluded),
            "groups": dict(self.titles),
            "min_share": MIN_BOTTLENECK_SHARE,
        }

    def to_json(self) -> str:
        """The whole space, to store in the study (every worker then searches the same one)."""
        return json.dumps({
            "verdict": self.verdict, "order": self.order, "excluded": self.excluded, "titles": self.titles,
            "knobs": [{"name": k.name, "group": k.group, "serves": list(k.serves),
                       "distribution": distribution_to_json(k.distribution),
                       "baseline": k.baseline, "when": [k.when[0], list(k.when[1])] if k.when else None}
                      for k in self.knobs],
        })

    @classmethod
    def from_json(cls, text: str) -> SearchSpace:
        """Inverse of :meth:`to_json` (spaces stored by earlier versions too).

        Raises:
            SpaceUnreadable: ``text`` is not a stored space.
        """
        try:
            data = msgspec.json.decode(text, type=_StoredSpace)
            knobs = [Knob(name=k.name, serves=_serves(k), distribution=json_to_distribution(k.distribution),
                          baseline=k.baseline, when=(k.when[0], tuple(k.when[1])) if k.when else None,
                          group=k.group or _owner_name(k.name))
                     for k in data.knobs]
        except (ValueError, KeyError, TypeError) as e:  # msgspec's DecodeError and ValidationError among them
            raise SpaceUnreadable("search space", str(e)) from None
        order = [_LEGACY_SERVES.get(b, b) for b in data.order]
        titles = data.titles or {g.name: g.title for g in GROUPS if any(k.group == g.name for k in knobs)}
        return cls(knobs=knobs, excluded=data.excluded, order=order, verdict=data.verdict, titles=titles)


class SpaceUnreadable(SetupUnreadable):
    """The study's stored search space is unreadable."""


class _StoredKnob(msgspec.Struct, kw_only=True):
    """A knob as :meth:`SearchSpace.to_json` stores it; ``groups`` (no ``serves``, no ``group``):
    as versions before the groups named bottlenecks stored it."""

    name: str
    distribution: str
    """Optuna's JSON of it (``optuna.distributions.distribution_to_json``)."""
    baseline: Any = None
    when: tuple[str, list[Any]] | None = None
    group: str | None = None
    serves: list[str] | None = None
    groups: list[str] | None = None


class _StoredSpace(msgspec.Struct, kw_only=True):
    """The space as :meth:`SearchSpace.to_json` stores it in the study."""

    verdict: str
    order: list[str]
    excluded: dict[str, str]
    knobs: list[_StoredKnob]
    titles: dict[str, str] | None = None


def _owner_name(key: str) -> str:
    """The group of a knob stored before groups were recorded ('' for an unknown key)."""
    try:
        return owner(key).name
    except KeyError:
        return ""


def _serves(stored: _StoredKnob) -> tuple[str, ...]:
    if stored.serves is not None:
        return tuple(stored.serves)
    return tuple(_LEGACY_SERVES.get(g, g) for g in stored.groups or ())


def _baseline(space: SearchSpace, name: str):
    for knob in space.knobs:
        if knob.name == name:
            return knob.baseline
    return None


def _suggest(trial: optuna.Trial, knob: Knob):
    d = knob.distribution
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(knob.name, d.choices)
    if isinstance(d, IntDistribution):
        return trial.suggest_int(knob.name, d.low, d.high, log=d.log)
    return trial.suggest_float(knob.name, d.low, d.high, log=d.log)


def bottleneck_shares(fractions: dict) -> dict[str, float]:
    """Each bottleneck's share of the baseline's step time, from the summary's ``overall.fractions``."""
    return {b: float(fractions.get(b) or 0.0) for b in BOTTLENECKS}


def build_space(facts: dict | RunFacts, fractions: dict, verdict: str, *, cpu_count: int | None = None,
                groups: tuple[KnobGroup, ...] = GROUPS) -> SearchSpace:
    """The search space for a run.

    Args:
        facts: What the baseline run showed (``facts`` of the measurement's rank 0 record; see
            ``perfscope.measure``): cuda, world_size, ddp, dataloader, accelerate, tf32..., read
            once (:func:`perfscope.record.run_facts.run_facts`).
        fractions: The baseline's ``overall.fractions`` (io, comm, launch, compute; shares of step
            time in [0, 1]).
        verdict: The baseline's run verdict (``io-bound`` ...); ``unknown`` (no verdict, no
            fractions) searches every applicable knob, its shares being unknown rather than zero.
        cpu_count: CPU cores on this node (default: ``os.cpu_count()``).
        groups: The knob groups to search (each says which of its knobs apply and why the others
            do not; :mod:`perfscope.runtime.groups`).

    Returns:
        The :class:`SearchSpace`; it may hold no knob (then there is nothing to tune, and
        ``excluded`` says why).
    """
    facts = run_facts(facts)
    cpu = _cores(cpu_count, facts)
    shares = bottleneck_shares(fractions)
    main = verdict.removesuffix("-bound")
    order = sorted(BOTTLENECKS, key=lambda b: (b != main, -shares[b]))
    searched = _searched(main, shares, known=main in BOTTLENECKS and bool(fractions))
    knobs: list[Knob] = []
    excluded: dict[str, str] = {}
    for group in groups:
        part = group.search_part(facts, cpu)
        excluded.update(part.excluded)
        for knob in part.knobs:
            if searched.intersection(knob.serves):
                knobs.append(knob)
            else:
                excluded[knob.name] = _too_small(knob.serves[0], shares)
    knobs.sort(key=lambda k: min(order.index(b) for b in k.serves if b in searched))
    _drop_orphans(knobs, excluded)
    return SearchSpace(knobs=_parents_first(knobs), excluded=excluded, order=order, verdict=verdict,
                       titles=_titles(groups, knobs))


def _cores(cpu_count: int | None, facts: RunFacts) -> int:
    """The cores to plan for: as given, else the run's facts', else this machine's; at least 1."""
    return max(1, cpu_count or facts.cpu_count or os.cpu_count() or 1)


def _titles(groups: tuple[KnobGroup, ...], knobs: list[Knob]) -> dict[str, str]:
    """The titles of the groups that have a searched knob."""
    return {g.name: g.title for g in groups if any(k.group == g.name for k in knobs)}


def _too_small(bottleneck: str, shares: dict[str, float]) -> str:
    return (f"its bottleneck ({bottleneck}) takes only {shares[bottleneck]:.0%} of the baseline's step time "
            f"(searched from {MIN_BOTTLENECK_SHARE:.0%})")


def _searched(main: str, shares: dict[str, float], *, known: bool) -> set[str]:
    """The bottlenecks whose knobs are searched: the verdict's and those taking at least
    :data:`MIN_BOTTLENECK_SHARE` of the step; without a verdict the shares are unknown, not zero:
    every one."""
    return {b for b in BOTTLENECKS if not known or b == main or shares[b] >= MIN_BOTTLENECK_SHARE}


def _drop_orphans(knobs: list[Knob], excluded: dict[str, str]) -> None:
    """Conditional knobs whose parent is not searched (they would never vary) moved to excluded."""
    names = {k.name for k in knobs}
    for knob in [k for k in knobs if k.when is not None and k.when[0] not in names]:
        knobs.remove(knob)
        excluded[knob.name] = f"searched only together with {knob.when[0]}, which is not searched for this run"


def _parents_first(knobs: list[Knob]) -> list[Knob]:
    """``knobs`` in their order, except that a conditional knob comes right after its parent (its
    parent's value must be known when it is suggested; the parent may be another group's)."""
    children = {k.name: k for k in knobs if k.when is not None}
    out: list[Knob] = []

    def put(knob: Knob) -> None:
        out.append(knob)
        for child in [c for c in children.values() if c.when[0] == knob.name]:
            put(children.pop(child.name))

    for knob in knobs:
        if knob.when is None:
            put(knob)
    return out + list(children.values())  # a cycle of conditions: kept, in order


def guess_bottlenecks(verdict: str, fractions: dict) -> frozenset[str]:
    """The bottlenecks the rule-based guess acts on: the verdict's, and every other one whose share
    of the step reaches the share at which the classifier names a step after it
    (:data:`perfscope.analysis.verdict.THRESHOLDS`: io and comm 10%, launch 25%). Compute has no
    such share (it is what is left), so the precision rules join only for a compute-bound verdict."""
    main = verdict.removesuffix("-bound")
    found = {b for b, share in VERDICT_THRESHOLDS.items() if float(fractions.get(b) or 0.0) >= share}
    return frozenset(found | ({main} if main in BOTTLENECKS else set()))


def rule_based_guess(space: SearchSpace, facts: dict | RunFacts, cpu_count: int | None = None,
                     fractions: dict | None = None, groups: tuple[KnobGroup, ...] = GROUPS) -> dict | None:
    """A first configuration from the profile, as trial parameters (None when it equals the baseline).

    Each group adds its rules for the bottlenecks of :func:`guess_bottlenecks`
    (:meth:`KnobGroup.guess`; the rules follow PyTorch's performance tuning guide), so a run held
    back by loading and the all-reduce at once gets workers and larger buckets in one trial. A
    value is kept within the space: an integer is clamped to its range, a number among numeric
    choices becomes the nearest choice (on a log scale), another value outside a categorical
    knob's choices, or a knob that is not searched, stays at the baseline.
    """
    params = dict(space.baseline_params)
    facts = run_facts(facts)
    cpu = _cores(cpu_count, facts)
    fractions = fractions or {}

    def put(name: str, value, at_most: bool = False) -> None:
        if name in params:
            dist = space.distributions[name]
            if isinstance(dist, IntDistribution):
                value = max(dist.low, min(dist.high, int(value)))
            elif isinstance(dist, CategoricalDistribution) and value not in dist.choices:
                value = _nearest(dist.choices, value, at_most)
                if value is None:
                    return
            params[name] = value

    bottlenecks = guess_bottlenecks(space.verdict, fractions)
    for group in groups:
        group.guess(space.verdict, bottlenecks, facts, fractions, cpu, params, put)
    return None if params == space.baseline_params else params


def _nearest(choices, value, at_most: bool = False):
    """The numeric choice nearest ``value`` on a log scale (``at_most``: the largest not above it,
    else the smallest), or None (not all numbers, or not > 0)."""
    def positive(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0

    if not positive(value) or not all(positive(c) for c in choices):
        return None
    if at_most:
        below = [c for c in choices if c <= value]
        return max(below) if below else min(choices)
    return min(choices, key=lambda c: abs(math.log(c / value)))
