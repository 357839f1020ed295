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


def check_losses(baseline: list[float | None], trial: list[float | None]) -> NumericsCheck:
    """Compare the measured steps' losses of a trial with the baseline's.

    Args:
        baseline, trial: Loss per measured step (None where no loss was seen), same seeds.

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
