"""The numerics guard: a faster configuration must train the same model.

Each trial starts from the same seeds as the baseline, so the loss of its measured steps is
compared with the baseline's. The bound is the one the runtime's mixed-precision tests hold O1 and
O2 to (``tests/test_runtime_precision.py``): within 10% plus 0.01 of the fp32 loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOSS_RTOL = 0.10
LOSS_ATOL = 0.01


@dataclass(frozen=True)
class NumericsCheck:
    """Outcome of :func:`check_losses`.

    Attributes:
        status: ``ok``, ``unsafe`` or ``not-visible`` (no loss seen in the trial or the baseline).
        detail: One line with the numbers.
    """

    status: str
    detail: str

    @property
    def unsafe(self) -> bool:
        return self.status == "unsafe"

    def to_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail}


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None]


def at_same_samples(baseline: list[float | None], trial: list[float | None], first: int, last: int,
                    ratio: float) -> tuple[list[float | None], list[float | None]]:
    """The baseline's and the trial's losses at the same number of samples seen, for a trial
    whose batch is ``ratio`` times the baseline's (a changed ``batch_size``): the trial's step
    ``i`` (0-based, in ``[first, last)``) has seen as many samples as the baseline's step
    ``ratio * (i + 1) - 1``; steps the baseline did not run are left out of both.

    Args:
        baseline, trial: Loss per step from the first (None where no loss was seen).
        first, last: The trial's measured steps.
        ratio: Trial batch size over the baseline's (1: the same steps of both).
    """
    if ratio == 1:
        return baseline[first:last], trial[first:last]
    pairs = [(round(ratio * (i + 1)) - 1, i) for i in range(first, min(last, len(trial)))]
    pairs = [(b, t) for b, t in pairs if 0 <= b < len(baseline)]
    return [baseline[b] for b, _ in pairs], [trial[t] for _, t in pairs]


def check_losses(baseline: list[float | None], trial: list[float | None]) -> NumericsCheck:
    """Compare the measured steps' losses of a trial with the baseline's.

    Args:
        baseline, trial: Loss per measured step (None where no loss was seen), same seeds; for a
            trial with another batch size, at the same samples seen (:func:`at_same_samples`).

    Returns:
        ``unsafe`` when a trial loss is NaN or infinite, or when the mean losses differ by more
        than ``LOSS_RTOL * |baseline mean| + LOSS_ATOL``; ``not-visible`` when either has no loss.
    """
    t = _finite(trial)
    b = [v for v in _finite(baseline) if math.isfinite(v)]
    if not t or not b:
        return NumericsCheck("not-visible", "no loss seen (perfscope sees losses passed to perfscope.backward "
                             "or to backward() of a scalar)")
    if not all(math.isfinite(v) for v in t):
        bad = next(v for v in t if not math.isfinite(v))
        return NumericsCheck("unsafe", f"the loss became {bad} during the measured steps")
    mean_t, mean_b = sum(t) / len(t), sum(b) / len(b)
    bound = LOSS_RTOL * abs(mean_b) + LOSS_ATOL
    diff = abs(mean_t - mean_b)
    words = f"mean loss {mean_t:.4g} vs baseline {mean_b:.4g} (|diff| {diff:.3g}, bound {bound:.3g})"
    return NumericsCheck("unsafe" if diff > bound else "ok", words)
