"""The confirmation statistics, on a fake objective whose noise the test controls."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.confirm import confirm, speedup_interval


class FakeRun:
    """Throughput ``mean`` with multiplicative Gaussian noise of ``noise`` (relative), seeded;
    ``drift`` multiplies every call after the previous one (a machine getting slower)."""

    def __init__(self, mean: float, noise: float, seed: int, drift: float = 1.0, clock: list | None = None):
        self.mean, self.noise, self.rng, self.drift = mean, noise, np.random.default_rng(seed), drift
        self.clock = clock if clock is not None else [0]

    def __call__(self) -> float:
        self.clock[0] += 1
        return self.mean * self.drift ** self.clock[0] * (1 + self.noise * self.rng.standard_normal())


def test_a_clearly_faster_candidate_is_confirmed():
    c = confirm(FakeRun(100, 0.03, 1), FakeRun(140, 0.03, 2), rounds=5)
    assert c.faster
    assert 1.3 < c.speedup < 1.5 and c.ci_low > 1.2
    assert c.describe().startswith(f"{c.speedup:.2f}x faster")


def test_a_candidate_no_faster_than_the_baseline_is_refused():
    # same true throughput, 5% noise: refused (almost always); "keep your current settings"
    c = confirm(FakeRun(100, 0.05, 0), FakeRun(100, 0.05, 100), rounds=5)
    assert not c.faster
    assert "keep your current settings" in c.describe()


def test_false_confirmations_stay_within_the_confidence_level():
    # 400 studies of a candidate that is no faster: a 95% two-sided interval lies wholly above 1
    # in about 2.5% of them; a bootstrap interval on 5 rounds would pass far more (~8% here)
    passed = sum(confirm(FakeRun(100, 0.05, s), FakeRun(100, 0.05, 10_000 + s), rounds=5).faster for s in range(400))
    assert passed <= 0.05 * 400


def test_a_gain_smaller_than_min_gain_is_refused():
    c = confirm(FakeRun(100, 0.005, 3), FakeRun(103, 0.005, 4), rounds=6, min_gain=0.05)
    assert c.ci_low > 1.0  # truly faster...
    assert not c.faster  # ...but not by the 5% asked for


def test_interleaving_cancels_a_drifting_machine():
    # the machine slows 3% per measurement; alternating keeps the paired ratio near the truth (1.2)
    clock = [0]
    c = confirm(FakeRun(100, 0.0, 5, drift=0.97, clock=clock), FakeRun(120, 0.0, 6, drift=0.97, clock=clock), rounds=5)
    assert c.speedup == pytest.approx(1.2 * 0.97, rel=1e-9)  # one step of drift between the pair's runs
    assert c.faster


def test_interval_is_deterministic_and_validated():
    a, b = [100, 98, 103, 101], [120, 119, 125, 118]
    point, low, high = speedup_interval(a, b)
    assert low < point < high and point == pytest.approx(np.exp(np.mean(np.log(np.divide(b, a)))))
    with pytest.raises(ValueError):
        speedup_interval([1.0], [2.0])
    with pytest.raises(ValueError):
        speedup_interval([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        confirm(lambda: 1.0, lambda: 1.0, rounds=1)
