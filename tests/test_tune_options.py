"""``tuner.options.TuneOptions``: a validated dataclass whose ranges the command line derives."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.tuner.options import LIMITS, TuneOptions, TuneOptionsError


def options(**kw) -> TuneOptions:
    kw.setdefault("script_args", ())
    return TuneOptions(script="train.py", out_dir=Path("o"), best_path=Path("o/best.yaml"), study_name="s", **kw)


def test_the_command_line_checks_the_same_ranges():
    from perfscope.cli.tune import _limits

    assert _limits() == {flag: (low, high) for flag, low, high in LIMITS.values()}
    assert set(LIMITS) <= {f.name for f in __import__("dataclasses").fields(TuneOptions)}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("trials", 1, "--trials must be a whole number from 2 to 10,000, got 1"),
    ("trials", 3.0, "--trials must be a whole number"),
    ("seed", True, "--seed"),
    ("measure_cap_s", float("inf"), "--measure-cap"),
    ("target_rse", 0.0, "--target-rse must be a number above 0 to 1"),
    ("min_gain", 10.0, "--min-gain must be a number from 0 below 10"),
    ("confirm_rounds", 1, "--confirm-rounds"),
])
def test_values_out_of_range_are_refused_naming_the_option(field, value, message):
    with pytest.raises(TuneOptionsError, match=message.replace("(", r"\(")):
        options(**{field: value})


def test_confirmation_rounds_agree_and_the_first_look_follows_few_rounds():
    assert options().confirm_min_rounds == 3
    assert options(confirm_rounds=2).confirm_min_rounds == 2  # fewer rounds asked: the first look moves down
    with pytest.raises(TuneOptionsError, match="--confirm-min-rounds 5 is above --confirm-rounds 3"):
        options(confirm_rounds=3, confirm_min_rounds=5)


def test_optional_limits_take_none_and_arguments_must_be_strings():
    o = options(time_budget_s=None, target_rse=None, nproc_per_node=None)
    assert o.target_rse is None and o.script_args == ()
    with pytest.raises(TuneOptionsError, match="strings"):
        options(script_args=("--lr", 0.1))
