"""A start-up cost (compile time) weighed against a per-step gain: the arithmetic of
perfscope/tuner/startup.py worked by hand, and the proof step's use of it with a stand-in for the
trial runner (no process is started)."""

from __future__ import annotations

import itertools
import types

import pytest

from perfscope.tuner import prove as prove_mod
from perfscope.tuner.attrs import BaselineRun
from perfscope.tuner.runner import TrialRunner
from perfscope.tuner.startup import extra_seconds, weigh
from perfscope.tuner.trial import TrialSpec


def test_break_even_and_net_speed_up_by_hand():
    # 10 ms steps made 1.5x faster save 10 - 6.667 = 3.333 ms a step: 20 s are repaid after 6,000 steps
    s = weigh(20.0, 0.010, 1.5)
    assert s.break_even_steps == pytest.approx(6000) and s.net_speedup is None
    assert s.text() == "compiling took 20.0 s, repaid after 6,000 steps"
    # over 1,000 steps: 10 s against 20 + 6.667 s
    assert weigh(20.0, 0.010, 1.5, 1000).net_speedup == pytest.approx(10 / (20 + 10 / 1.5))
    # over 100,000 steps: 1,000 s against 20 + 666.7 s
    assert weigh(20.0, 0.010, 1.5, 100_000).net_speedup == pytest.approx(1000 / (20 + 1000 / 1.5))
    assert weigh(5.0, 0.010, 0.9).break_even_steps is None  # slower a step: never repaid
    assert "never repaid" in weigh(5.0, 0.010, 0.9).text()


@pytest.mark.parametrize("bad", [dict(step_s=0.0), dict(speedup=float("nan")), dict(extra_s=-1.0), dict(run_steps=0)])
def test_bad_arguments_are_refused(bad):
    args = dict(extra_s=1.0, step_s=0.01, speedup=1.2, run_steps=None) | bad
    with pytest.raises(ValueError):
        weigh(**args)


def test_extra_seconds_are_the_candidates_beyond_the_baselines():
    assert extra_seconds([None, None], [None]) is None  # nothing compiled anywhere
    assert extra_seconds([21.0, 19.0, 20.0], [None, None]) == 20.0
    assert extra_seconds([3.0], [5.0]) == 0.0  # never negative


def _session(tmp_path):
    trial = types.SimpleNamespace(number=1, value=150.0, user_attrs={"config": {"compile": "default"}})
    return types.SimpleNamespace(baseline=BaselineRun(value=100.0), feasible_trials=lambda: [trial],
                                 space=types.SimpleNamespace(knobs=["compile"], at_top=lambda config: []),
                                 spec=TrialSpec(script="train.py", script_args=(), runner=_FakeRuns()),
                                 work_dir=tmp_path,
                                 loader_settings=lambda config: {})


class _FakeRuns(TrialRunner):
    """Baseline runs at about 100 steps/s, the compiled candidate at about 150, each with a
    little deterministic noise; the candidate's runs compile for ``compile_s`` seconds."""

    compile_s = 20.0

    def __init__(self):
        self.wobble = itertools.cycle([0.99, 1.01, 1.0, 0.995, 1.005])

    def run(self, spec, config, work, **kw):
        compiled = config is not None and config.compile != "off"
        value = (150.0 if compiled else 100.0) * next(self.wobble)
        return types.SimpleNamespace(ok=True, value=value, status="ok", reason=None, step_seconds=[1 / value] * 8,
                                     facts={"compiler": {"compile_s": self.compile_s if compiled else None}})


def _fake_runs(monkeypatch, compile_s=20.0):
    monkeypatch.setattr(_FakeRuns, "compile_s", compile_s)
    monkeypatch.setattr(prove_mod, "still_running", lambda what: None)


def _options(run_steps):
    return types.SimpleNamespace(objective="time", confirm_top=1, confirm_rounds=6, confirm_min_rounds=3, confidence=0.95, min_gain=0.02,
                                 confirm_budget_s=None, run_steps=run_steps)


def test_a_long_run_keeps_the_compiled_winner_and_states_the_cost(tmp_path, monkeypatch):
    _fake_runs(monkeypatch)
    confirmation, rec = prove_mod.prove(_session(tmp_path), _options(100_000), [])
    assert rec["status"] == "faster" and rec["config"] == {"compile": "default"}
    assert rec["startup"]["extra_s"] == pytest.approx(20.0) and rec["startup"]["run_steps"] == 100_000
    assert rec["startup"]["net_speedup"] > 1.4
    assert "compiling took 20.0 s, repaid after" in rec["line"] and "over the 100,000 steps of the run" in rec["line"]


def test_a_short_run_keeps_the_current_settings_with_the_figures(tmp_path, monkeypatch):
    _fake_runs(monkeypatch)
    confirmation, rec = prove_mod.prove(_session(tmp_path), _options(1000), [])
    assert rec["status"] == "keep-current"
    assert rec["line"].startswith("keep your current settings: the start-up cost outweighs the gain over 1,000 steps")
    assert "compiling took 20.0 s" in rec["line"] and "over the 1,000 steps of the run: 0.3" in rec["line"]
    assert confirmation["candidates"][0]["faster"] is True  # a step is faster; the run is not


def test_without_a_run_length_the_break_even_is_said(tmp_path, monkeypatch):
    _fake_runs(monkeypatch)
    _, rec = prove_mod.prove(_session(tmp_path), _options(None), [])
    assert rec["status"] == "faster" and rec["startup"]["net_speedup"] is None
    assert rec["line"].endswith("(--run-steps N weighs it against your run)")


def test_a_candidate_without_compile_has_no_startup(tmp_path, monkeypatch):
    _fake_runs(monkeypatch, compile_s=None)
    _, rec = prove_mod.prove(_session(tmp_path), _options(1000), [])
    assert rec["status"] == "faster" and rec["startup"] is None
