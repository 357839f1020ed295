"""What grew between the baseline and the run: each class's milliseconds per step and the kernels
(GPU) or operators (CPU) whose time per step grew most; each side averaged over its runs."""

from __future__ import annotations

import statistics

from perfscope.record.view import Record

TOP_GROWN = 3
MAX_NAME = 120  # a kernel's or operator's name as printed: templated C++ names run to thousands
# A class or kernel whose time per step grew by less than this share of the baseline's step time
# is not named: it does not explain a regression the gate can see.
QUIET_SHARE = 0.01


def per_step_classes(records: list[Record]) -> tuple[float | None, dict[str, float]]:
    """Mean time per counted row (µs) and each class's share of it, averaged over the runs."""
    means, shares = [], {}
    for s in records:
        o = s.overall
        if o is None or o.mean_step_time_us is None:
            continue
        means.append(o.mean_step_time_us)
        fractions = o.fractions
        for c in fractions.__struct_fields__ if fractions is not None else ():
            if getattr(fractions, c) is not None:
                shares.setdefault(c, []).append(getattr(fractions, c))
    if not means:
        return None, {}
    return statistics.fmean(means), {c: statistics.fmean(v) for c, v in shares.items()}


def per_step_top(records: list[Record]) -> dict[str, float]:
    """The top kernels (GPU) or operators (CPU) of ``details``, µs per counted row, averaged."""
    totals: dict[str, float] = {}
    for s in records:
        rows = s.overall_or_empty().steps_counted
        if not rows:
            continue
        for name, total in _totals(s):
            totals[name] = totals.get(name, 0.0) + total / rows / len(records)
    return totals


def _totals(record: Record) -> list[tuple[str, float]]:
    """(name, total µs) of the top kernels (GPU) or operators (CPU) that have a total."""
    d = record.details
    rows = (d.top_kernels if record.mode == "gpu" else d.top_operators) if d is not None else None
    return [(str(e.name), e.total_us) for e in rows or [] if e.total_us is not None]


def what_grew(baselines: list[Record], runs: list[Record]) -> list[str]:
    """Lines naming the classes and the kernels/operators whose time per step grew (ms), largest
    growth first; growths below :data:`QUIET_SHARE` of the baseline's step time are left out."""
    (mb, fb), (mr, fr) = per_step_classes(baselines), per_step_classes(runs)
    if not mb or mr is None:
        return []
    quiet = QUIET_SHARE * mb
    grown = []
    for c in sorted(set(fb) & set(fr)):
        a, b = fb[c], fr[c]
        delta = b * mr - a * mb
        if delta > quiet:
            grown.append((delta, f"{c} share {a:.0%} -> {b:.0%}: {a * mb / 1000:.2f} -> {b * mr / 1000:.2f} ms "
                                 f"per step (+{delta / 1000:.2f} ms)"))
    grown += _grown_top(baselines, runs, quiet)
    return [line for _, line in sorted(grown, key=lambda g: -g[0])]


def _grown_top(baselines: list[Record], runs: list[Record], quiet: float) -> list[tuple[float, str]]:
    """(growth µs, line) of the kernels/operators whose time per step grew by more than ``quiet``
    µs, of the :data:`TOP_GROWN` that grew most."""
    what = "kernel" if runs[0].mode == "gpu" else "operator"
    ta, tb = per_step_top(baselines), per_step_top(runs)
    grown = []
    for delta, name in sorted(((tb[n] - ta.get(n, 0.0), n) for n in tb), reverse=True)[:TOP_GROWN]:
        if delta > quiet:
            was = f"{ta[name] / 1000:.2f}" if name in ta else "absent (0)"
            shown = name if len(name) <= MAX_NAME else name[:MAX_NAME] + "..."
            grown.append((delta, f"{what} {shown}: {was} -> {tb[name] / 1000:.2f} ms per step (+{delta / 1000:.2f} ms)"))
    return grown
