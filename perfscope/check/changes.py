"""What grew between the baseline and the run: each class's milliseconds per step and the kernels
(GPU) or operators (CPU) whose time per step grew most; each side averaged over its runs."""

from __future__ import annotations

import statistics

TOP_GROWN = 3
MAX_NAME = 120  # a kernel's or operator's name as printed: templated C++ names run to thousands
# A class or kernel whose time per step grew by less than this share of the baseline's step time
# is not named: it does not explain a regression the gate can see.
QUIET_SHARE = 0.01


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def per_step_classes(summaries: list[dict]) -> tuple[float | None, dict[str, float]]:
    """Mean time per counted row (µs) and each class's share of it, averaged over the runs."""
    means, shares = [], {}
    for s in summaries:
        o = s.get("overall") or {}
        mean = _number(o.get("mean_step_time_us"))
        if mean is None:
            continue
        means.append(mean)
        for c, f in (o.get("fractions") or {}).items():
            if _number(f) is not None:
                shares.setdefault(str(c), []).append(float(f))
    if not means:
        return None, {}
    return statistics.fmean(means), {c: statistics.fmean(v) for c, v in shares.items()}


def per_step_top(summaries: list[dict]) -> dict[str, float]:
    """The top kernels (GPU) or operators (CPU) of ``details``, µs per counted row, averaged."""
    totals: dict[str, float] = {}
    for s in summaries:
        key = "top_kernels" if s.get("mode") == "gpu" else "top_operators"
        rows = _number((s.get("overall") or {}).get("steps_counted")) or 0
        if not rows:
            continue
        for name, total in _totals(s, key):
            totals[name] = totals.get(name, 0.0) + total / rows / len(summaries)
    return totals


def _totals(summary: dict, key: str) -> list[tuple[str, float]]:
    """(name, total µs) of the ``details.<key>`` entries that have a total."""
    out = []
    for e in (summary.get("details") or {}).get(key) or []:
        total = _number(e.get("total_us")) if isinstance(e, dict) else None
        if total is not None:
            out.append((str(e.get("name")), total))
    return out


def what_grew(baselines: list[dict], runs: list[dict]) -> list[str]:
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


def _grown_top(baselines: list[dict], runs: list[dict], quiet: float) -> list[tuple[float, str]]:
    """(growth µs, line) of the kernels/operators whose time per step grew by more than ``quiet``
    µs, of the :data:`TOP_GROWN` that grew most."""
    what = "kernel" if runs[0].get("mode") == "gpu" else "operator"
    ta, tb = per_step_top(baselines), per_step_top(runs)
    grown = []
    for delta, name in sorted(((tb[n] - ta.get(n, 0.0), n) for n in tb), reverse=True)[:TOP_GROWN]:
        if delta > quiet:
            was = f"{ta[name] / 1000:.2f}" if name in ta else "absent (0)"
            shown = name if len(name) <= MAX_NAME else name[:MAX_NAME] + "..."
            grown.append((delta, f"{what} {shown}: {was} -> {tb[name] / 1000:.2f} ms per step (+{delta / 1000:.2f} ms)"))
    return grown
