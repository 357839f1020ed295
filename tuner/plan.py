"""What a tune's plan costs and what its time budget left undone, as lines for the user: told
before the search (:func:`plan_line`) and, where ``--time-budget`` ended it early, in the last
line and the notes (:func:`budget_cut`). Times are seconds (the runner's clock)."""

from __future__ import annotations

import math

from perfscope.tuner.attrs import trial_mark
from perfscope.tuner.options import TuneOptions
from perfscope.tuner.study import TuningStudy, counts_as_finished


def plan_line(session: TuningStudy, options: TuneOptions) -> str | None:
    """How long the plan takes at the baseline's pace, told before the search: the trials left,
    then the confirmation's rounds (``confirm_top`` candidates and the baseline in each, from
    ``confirm_min_rounds`` to ``confirm_rounds``), each run about as long as the baseline's run;
    bounded by ``--time-budget`` and ``--confirm-budget``. None where the baseline's time is unknown."""
    run_s = float(session.baseline.duration_s or 0.0) if session.baseline is not None else 0.0
    if run_s <= 0 or not session.space.knobs:
        return None
    left = max(options.trials - session.finished_count(), 0)
    search_s = left * run_s
    if options.time_budget_s is not None:
        search_s = min(search_s, options.time_budget_s)
    per_round = (options.confirm_top + 1) * run_s
    low, high = options.confirm_min_rounds * per_round, options.confirm_rounds * per_round
    if options.confirm_budget_s is not None:
        low, high = min(low, options.confirm_budget_s), min(high, options.confirm_budget_s)
    return (f"the plan at the baseline's pace ({run_s:,.0f} s a run): {left} more trial(s), about {search_s / 60:,.1f} "
            f"min, then {options.confirm_min_rounds} to {options.confirm_rounds} confirmation rounds, about "
            f"{low / 60:,.1f} to {high / 60:,.1f} min (a busy machine takes longer)")


def budget_cut(session: TuningStudy, options: TuneOptions, elapsed_s: float) -> str:
    """What the time budget left undone, as a line: ``k of n trials ran before the time budget
    (knobs never tried: ...); raise --time-budget to about N s``. N is the time spent so far plus
    the trials left at the pace so far (the time spent over the trials that ran, the baseline's
    profile and every start-up included)."""
    finished = [t for t in session.study.get_trials(deepcopy=False) if counts_as_finished(t)]
    tried = {k for t in finished for k in trial_mark(t).changes}
    untried = [k.name for k in session.space.knobs if k.name not in tried]
    per_trial = elapsed_s / max(len(finished), 1)
    needed = elapsed_s + max(options.trials - len(finished), 0) * per_trial
    never = f" (knobs never tried: {', '.join(untried)})" if untried else ""
    return (f"{len(finished)} of {options.trials} trials (the baseline included) ran before the time budget of "
            f"{options.time_budget_s:,.0f} s{never}; raise --time-budget to about {math.ceil(needed / 10) * 10:,.0f} s "
            f"for all {options.trials} (about {per_trial:,.0f} s a trial)")
