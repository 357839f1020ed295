"""The one definition of the run's step time, representative step, speed-up and what-if."""

import math

import pytest

from perfscope import steptime


def rows(times, rank=0, launch=None):
    return [{"rank": rank, "step": i, "step_time_us": t, "launch_cost_frac": (launch or {}).get(i, 0.0)}
            for i, t in enumerate(times)]


def test_step_time_is_the_mean_of_the_slowest_rank_per_step():
    both = rows([100, 300]) + rows([200, 100], rank=1)
    assert steptime.job_step_times(both) == {0: 200, 1: 300}
    assert steptime.step_time_us(both) == pytest.approx(250)
    assert steptime.step_time_us([]) is None


def test_bursty_loader_steps_the_median_would_misstate():
    # four workers: one step waits for a batch, three find one ready
    bursty = rows([400, 10, 10, 10] * 3)
    assert steptime.step_time_us(bursty) == pytest.approx(107.5)
    assert steptime.representative_step(bursty) == 1  # 10 µs is nearest to 107.5 (ties: earlier)


def test_representative_step_is_nearest_to_the_step_time():
    assert steptime.representative_step(rows([90, 130, 101, 99])) == 2  # mean 105: 101 is 4 away, 99 is 6
    assert steptime.representative_step(rows([10, 30])) == 0  # tie: the earlier
    assert steptime.representative_step([]) is None


def test_what_if_of_a_small_cause_is_not_inflated_by_a_new_median():
    # the median step holds little launch time, but removing it elsewhere would make a shorter step
    # the median: the median comparison claims far more than the cause costs
    times = [121.0, 108.0, 125.0, 121.0, 140.0]
    launch = {0: 1.4 / 121, 1: 0.0, 2: 20 / 125, 3: 1.4 / 121, 4: 0.0}
    r = rows(times, launch=launch)
    (w,) = steptime.what_if(r)
    mean = sum(times) / len(times)
    saved = (1.4 + 20 + 1.4) / len(times)
    assert w["class"] == "launch"
    assert w["step_time_us"] == pytest.approx(mean)
    assert w["saved_us_per_step"] == pytest.approx(saved)
    assert w["speedup"] == pytest.approx(mean / (mean - saved))


def test_what_if_takes_the_slowest_remainder_across_ranks():
    r = rows([100], launch={0: 0.5}) + rows([90], rank=1)
    (w,) = steptime.what_if(r)
    assert w["step_time_without_us"] == pytest.approx(90)  # rank 1 now sets the pace


def test_speedup_is_throughput_ratio_and_refuses_unknowns():
    assert steptime.speedup(200, 100) == pytest.approx(2.0)
    assert steptime.speedup(None, 100) is None
    assert steptime.speedup(100, 0) is None
    assert steptime.speedup(math.nan, 10) is None


def test_rows_without_a_usable_time_are_left_out():
    r = rows([100, 100]) + [{"rank": 0, "step": 9, "step_time_us": float("nan")}, {"rank": 0, "step": 8}]
    assert steptime.step_time_us(r) == pytest.approx(100)


def test_the_slowest_rank_is_the_one_with_the_most_compute_not_the_longest_step():
    rows = [{"rank": 0, "median_step_time_us": 120.0, "median_compute_us": 60.0},   # waits in collectives
            {"rank": 1, "median_step_time_us": 100.0, "median_compute_us": 90.0},   # the one waited for
            {"rank": 2, "median_step_time_us": 130.0, "median_compute_us": None}]
    assert steptime.slowest_rank(rows) == 1
    assert steptime.slowest_rank(rows[:1]) is None  # one rank: nobody waits for it
    assert steptime.slowest_rank([rows[0], rows[2], "junk"]) is None
