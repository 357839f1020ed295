"""Proving the winner: the study's best few candidates re-measured against the baseline, in
interleaved rounds (:mod:`perfscope.tuner.confirm`), and the recommendation that follows, with a hint when a
recommended value is the largest one searched. See ``docs/tune.md``, step 6."""

from __future__ import annotations

import os
import statistics

from perfscope.errors import PerfscopeError
from perfscope.text import plural
from perfscope.runtime.config import AccelConfig, config_from_dict
from perfscope.tuner.confirm import WIDE_INTERVAL, confirm_candidates, interval_text
from perfscope.tuner.progress import still_running
from perfscope.tuner.objective import better_word
from perfscope.tuner.startup import StartUp, from_runs
from perfscope.tuner.runner import run_configuration, runner_of
from perfscope.record.run_facts import run_facts
from perfscope.tuner.attrs import trial_mark


_DECIDED = {"cleared": "faster", "below": "not faster", "round budget": "undecided at the last round",
            "time budget": "undecided when the time budget ended"}


class ConfirmationError(PerfscopeError):
    """The baseline failed during the confirmation."""


def prove(session, options, notes: list[str]) -> tuple[dict | None, dict]:
    """Confirm the best few candidates against the baseline.

    Args:
        session: The :class:`perfscope.tuner.study.TuningStudy`.
        options: The :class:`perfscope.tuner.tune.TuneOptions` (confirm_top, confirm_rounds, confidence, min_gain).
        notes: The record's notes; a failed confirmation run adds one.

    Returns:
        ``(confirmation or None, recommendation)`` as in ``tune.json``.

    Raises:
        ConfirmationError: the baseline failed during the confirmation.
    """
    candidates = _candidates(session, options)
    if not candidates:
        return None, _keep(line=_nothing_to_confirm(session, options))
    print(f"perfscope: confirming trial(s) {', '.join(str(t.number) for t in candidates)} against the baseline "
          f"in interleaved rounds until each is decided ({options.confirm_min_rounds} to {options.confirm_rounds} "
          "rounds)...", flush=True)
    runs = _Runs(session, notes)
    clock = runner_of(session.spec).clock
    started = clock()
    results = confirm_candidates(
        runs.baseline, {t.number: runs.of(config_from_dict(trial_mark(t).changes), f"trial-{t.number}")
                        for t in candidates},
        rounds=options.confirm_rounds, min_rounds=options.confirm_min_rounds, confidence=options.confidence,
        min_gain=options.min_gain, budget_s=options.confirm_budget_s, clock=clock,
        on_round=lambda number, looked: print(_round_line(number, looked, clock() - started), flush=True),
    )
    used = max((c.rounds for c in results.values() if c is not None), default=0)
    confirmation = {"rounds": used, "max_rounds": options.confirm_rounds, "min_rounds": options.confirm_min_rounds,
                    "budget_s": options.confirm_budget_s, "confidence": options.confidence,
                    "min_gain": options.min_gain, "candidates": []}
    best, outweighed = _judge(candidates, results, runs.steps, options, confirmation["candidates"])
    return confirmation, _recommendation(best, outweighed, confirmation["candidates"], session, options, notes)


def _keep(**more) -> dict:
    """A recommendation to keep the current settings (``more``: its line, the undecided candidate)."""
    return {"status": "keep-current", "trial": None, "config": {}, "speedup": None, "ci_low": None, "ci_high": None,
            **more}


def _recommendation(best: tuple | None, outweighed: list[str], entries: list[dict], session, options,
                    notes: list[str]) -> dict:
    """The recommendation from :func:`_judge`'s verdict on the confirmation's ``entries``."""
    if best is None:
        undecided = None if outweighed else _undecided(entries, options)
        if undecided is not None:
            return _keep(**undecided)
        return _keep(line=_none_faster(entries, outweighed, options, notes))
    t, c, startup = best
    line = c.describe(better_word(options.objective))
    if startup is not None:
        line += f"; {startup.text()}" + ("" if options.run_steps else " (--run-steps N weighs it against your run)")
    config = trial_mark(t).changes
    return {"status": "faster", "trial": t.number, "config": config, "speedup": c.speedup, "ci_low": c.ci_low,
            "ci_high": c.ci_high, "rounds": c.rounds, "line": line, "hint": range_hint(session.space, config),
            "startup": startup.to_dict() if startup is not None else None}


class _Runs:
    """The confirmation's runs, each through the study's runner, in a folder of this worker's (other
    workers may confirm at the same time); a failed one is noted (``notes``: the record's)."""

    def __init__(self, session, notes: list[str]) -> None:
        self.session, self.notes = session, notes
        self.work = session.work_dir / f"confirm-{os.getpid()}"
        self.steps: dict[str, list] = {}
        """Run name -> (compile seconds, median step seconds) of each of its runs: the start-up cost."""

    def of(self, config: AccelConfig | None, name: str):
        """A run of ``config`` (None: the script's own settings), as :func:`confirm_candidates` takes
        it: its value, None where it failed."""
        return lambda: self.run(config, name)

    def run(self, config: AccelConfig | None, name: str) -> float | None:
        outcome = run_configuration(self.session.spec, config, self.work / name, profile_steps=0,
                                    on_progress=still_running(f"confirmation run of {name}"),
                                    **self.session.loader_settings(config))
        if not outcome.ok or outcome.value is None:
            self.notes.append(f"confirmation run of {name} failed ({outcome.status}): {outcome.reason}")
            return None
        compiled = run_facts(outcome.facts).compiler.compile_s
        self.steps.setdefault(name, []).append((compiled, statistics.median(outcome.step_seconds or [0.0])))
        return outcome.value

    def baseline(self) -> float:
        """A run of the baseline.

        Raises:
            ConfirmationError: it failed.
        """
        value = self.run(None, "baseline")
        if value is None:
            raise ConfirmationError("the baseline failed during confirmation; see the notes in tune.json")
        return value


def _round_line(number: int, looked: dict, seconds: float) -> str:
    """``perfscope: confirmation round 2 done (41 s): trial 3: ...`` after each round."""
    parts = [f"trial {key}: {interval_text(c.speedup, c.ci_low, c.ci_high, c.baseline, c.candidate)}"
             + (f", {_DECIDED[c.decided_by]}" if c.decided_by in _DECIDED else "")
             for key, c in looked.items() if c is not None]
    return f"perfscope: confirmation round {number} done ({seconds:.0f} s)" + (f": {'; '.join(parts)}" if parts else "")


def _candidates(session, options) -> list:
    """The best few feasible trials, one per configuration, that beat the baseline in the search
    by more than ``min_gain`` (at most ``confirm_top``)."""
    floor = float(session.baseline.value) * (1 + options.min_gain)
    candidates, seen = [], set()
    for t in session.feasible_trials():
        key = tuple(sorted(trial_mark(t).changes.items()))
        if not key or key in seen or t.value <= floor:
            continue
        seen.add(key)
        candidates.append(t)
        if len(candidates) >= options.confirm_top:
            break
    return candidates


def _nothing_to_confirm(session, options) -> str:
    """Why there is no candidate, as the recommendation's line."""
    if not session.space.knobs:
        return "keep your current settings: no knob can apply to this run (see the knobs left out)"
    cut = getattr(session, "cut_short", None)
    if cut:  # what was not searched is not known to be slower
        ran = ("no trial of the search ran" if session.finished_count() <= 1 else
               f"no trial that ran beat the baseline by more than {options.min_gain:.0%}")
        return f"keep your current settings for now: {ran}, and the search was cut short: {cut}"
    if not session.feasible_trials():
        return ("keep your current settings: no trial of the search finished, so nothing was compared "
                "(see each trial's failure in tune.json)")
    return ("keep your current settings: no feasible trial beat the baseline by more than "
            f"{options.min_gain:.0%} in the search")


def _judge(candidates: list, results: dict, runs: dict, options, entries: list) -> tuple[tuple | None, list[str]]:
    """Each candidate's confirmation entry (appended to ``entries``), the best proven one as
    ``(trial, confirmed, startup)`` or None, and the lines of those faster a step whose start-up
    outweighs the gain over ``options.run_steps``."""
    best, outweighed = None, []
    for t in candidates:
        c = results.get(t.number)
        entry = {"trial": t.number, "config": trial_mark(t).changes, "baseline": None, "candidate": None,
                 "speedup": None, "ci_low": None, "ci_high": None, "faster": False, "rounds": 0, "level": None,
                 "decided_by": "failed", "startup": None}
        entries.append(entry)
        if c is None:
            continue
        entry.update(c.to_dict())
        startup = _startup(runs, f"trial-{t.number}", c.speedup, options.run_steps)
        entry["startup"] = startup.to_dict() if startup is not None else None
        if not c.faster:
            continue
        if startup is not None and startup.net_speedup is not None and startup.net_speedup < 1 + options.min_gain:
            outweighed.append(f"trial {t.number}: {c.speedup:.2f}x a step, but {startup.text()}")
        # The largest *proven* gain: the interval's low end, not the noisier point estimate.
        elif best is None or c.ci_low > best[1].ci_low:
            best = (t, c, startup)
    return best, outweighed


# How a budget that ended a confirmation is named, and the option that gives it more.
_BUDGETS = {"time budget": ("the confirmation's time budget", "--confirm-budget"),
            "round budget": ("its last round", "--confirm-rounds")}


def _undecided(entries: list, options) -> dict | None:
    """The recommendation when a budget ended the confirmation of a candidate that measured faster
    but whose interval had not cleared ``1 + min_gain``: ``undecided``, the best such candidate
    recorded as ``candidate`` (not as the answer: ``config`` stays empty, ``best.yaml`` keeps the
    current settings), and a line saying what ended it and how to finish. None where there is none."""
    open_ = [e for e in entries if e.get("decided_by") in _BUDGETS and e.get("speedup") is not None
             and e["speedup"] > 1 + options.min_gain]
    if not open_:
        return None
    e = max(open_, key=lambda e: e["speedup"])
    ended, option = _BUDGETS[e["decided_by"]]
    line = (f"undecided: trial {e['trial']} measured {e['speedup']:.2f}x in {plural(e['rounds'], 'round')}"
            f"{_interval_words(e.get('ci_low'), e.get('ci_high'))}, when "
            f"{ended} ended it before the interval cleared {1 + options.min_gain:.2f}x; keep your current settings "
            f"for now, or run the same command again with a larger {option} to decide it (the study keeps every "
            "trial)")
    candidate = {k: e.get(k) for k in ("trial", "config", "speedup", "ci_low", "ci_high", "rounds", "decided_by")}
    return {"status": "undecided", "line": line, "candidate": candidate}


def _interval_words(low: float | None, high: float | None) -> str:
    """``, interval 1.05x-1.31x``, or that the rounds were too few where it is missing or wider than
    :data:`perfscope.tuner.confirm.WIDE_INTERVAL`."""
    bounded = low is not None and high is not None and low > 0 and high / low <= WIDE_INTERVAL
    return f", interval {low:.2f}x-{high:.2f}x" if bounded else ", too few rounds to bound it"


def _none_faster(entries: list, outweighed: list[str], options, notes: list[str]) -> str:
    """The recommendation's line when no candidate is recommended."""
    if outweighed:
        return (f"keep your current settings: the start-up cost outweighs the gain over {options.run_steps:,} "
                f"steps ({'; '.join(outweighed)})")
    lines = [f"trial {e['trial']}: {interval_text(e['speedup'], e['ci_low'], e['ci_high'], e['baseline'], e['candidate'])}"
             for e in entries if e["speedup"] is not None]
    if lines:
        return (f"keep your current settings: no candidate was {better_word(options.objective)} beyond the measured "
                f"noise ({'; '.join(lines)})")
    # not one measurement: nothing was shown slower, the runs failed (a full disk, a crash)
    failed = [n for n in notes if n.startswith("confirmation run of")]
    return ("keep your current settings: no candidate could be confirmed, its confirmation runs failed"
            + (f" ({failed[-1]})" if failed else ""))


def _startup(runs: dict[str, list], name: str, speedup: float | None, run_steps: int | None) -> StartUp | None:
    """The candidate's compile time against its speed-up, from the confirmation runs
    (:func:`perfscope.tuner.startup.from_runs`)."""
    return from_runs(runs.get(name) or [], runs.get("baseline") or [], speedup, run_steps)


def range_hint(space, config: dict) -> str | None:
    """What to try next when the recommendation sits at the top of a searched range.

    Args:
        space: The :class:`perfscope.tuner.space.SearchSpace` searched.
        config: The recommended configuration's changes.

    Returns:
        One line, or None when no recommended value is the largest one searched.
    """
    top = space.at_top(config)
    if not top:
        return None
    which = " and ".join(f"{k.name}={config[k.name]!r}" for k in top)
    ranges = "; ".join(f"{k.name} {k.choices_text()}" for k in top)
    line = (f"{which} {'is the largest value' if len(top) == 1 else 'are the largest values'} searched ({ranges}): "
            "larger ones were not tried and may be faster still")
    if any(k.name == "num_workers" for k in top):
        # build_space's range: 2 workers per core (at least 4, at most 16), or the script's own value.
        line += ("; num_workers goes up to 2 per CPU core (at least 4, at most 16) or to the script's own "
                 "value: set more workers in the script to search further")
    return line
