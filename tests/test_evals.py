"""The eval's scorer (evals/score.py) grades: a wrong class, a missing knob, a 0 where an
abstention belongs, a traceback for bad input each fail their case; the cases file is valid and
holds at least 20 cases, damaged and contended ones among them; the hand-made traces are what
evals/build.py writes. The eval itself runs in CI after the tests (.ci/run), its score printed."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import msgspec
import pytest

from perfscope.record.answer import Answer, encode

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"evals_{name}", ROOT / "evals" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


score = _module("score")


def _answer(**fields) -> str:
    base = dict(verdict="io-bound", provisional=False, basis="measured", step_time_us=1000.0,
                shares={"io": 0.6, "comm": 0.0, "launch": 0.1, "compute": 0.3}, advice=[], summary_advice="x",
                verdict_knobs=["num_workers", "pin_memory"], mfu=None, mfu_why="no FLOPs", warnings=[])
    return encode(Answer(**{**base, **fields}))


def _failed(expect: dict, stdout: str = "", rc: int = 0, stderr: str = "") -> list[str]:
    checks = score.grade(msgspec.convert(expect, score.Expect), rc, stdout, stderr)
    assert checks, "every case has checks"
    return [name for name, why in checks.items() if why is not None]


def test_a_right_answer_passes_every_check():
    assert _failed({"verdict": "io-bound", "provisional": False, "knob": "num_workers", "abstain": ["mfu"]},
                   _answer()) == []


@pytest.mark.parametrize("expect, fields, failing", [
    ({"verdict": "compute-bound"}, {}, "verdict compute-bound"),
    ({"verdict": "io-bound", "provisional": True}, {}, "provisional True"),
    ({"verdict": "io-bound", "knob": "device_prefetch"}, {}, "advice names device_prefetch"),
    ({"verdict": "io-bound", "no_knobs": True}, {}, "advice names no key"),
    ({"verdict": "io-bound", "abstain": ["mfu"]}, {"mfu": 0.0, "mfu_why": None}, "mfu null with its reason"),
    ({"verdict": "io-bound", "warning": "truncated"}, {}, "a warning says 'truncated'"),
    ({"verdict": "io-bound", "partial": True}, {"steps_counted": 4, "steps_total": 4}, "some steps left out"),
    ({"verdict": "io-bound"}, {"shares": {"io": 0.6, "compute": 0.3}}, "shares add up to 1"),
    ({"verdict": None}, {"verdict": None, "reason": "x"}, "no shares or advice without a verdict"),
])
def test_each_wrong_answer_fails_its_check(expect, fields, failing):
    assert failing in _failed(expect, _answer(**fields))


def test_output_that_is_not_the_answer_fails():
    assert _failed({"verdict": "io-bound"}, '{"verdict": "io-bound"}') == [
        "one JSON answer on stdout, valid against the schema"]
    assert _failed({"verdict": "io-bound"}, "", rc=1, stderr="boom") == ["runs"]


def test_bad_input_must_fail_with_one_line_and_no_traceback():
    expect = {"error": "holds no events"}
    assert _failed(expect, rc=2, stderr="perfscope: error: x: trace holds no events to analyze\n") == []
    assert _failed(expect, rc=0) == ["fails", "one clear line"]
    assert _failed(expect, rc=1, stderr="Traceback (most recent call last):\n ValueError: holds no events\n") == [
        "one clear line"]


def test_the_cases_are_valid_and_cover_what_the_eval_promises():
    cases = score.load_cases()
    assert len(cases) >= 20 and len([c for c in cases if not c.trace or not c.trace.startswith("shared:")]) >= 20
    ids = {c.id for c in cases}
    assert {"cpu-io-truncated", "gpu-kernels-lost", "cpu-io-contended", "script-io-bound-busy"} <= ids
    assert any(c.expect.verdict is None for c in cases) and any(c.expect.error for c in cases)
    for case in cases:
        if case.trace and not case.trace.startswith("shared:"):
            assert (ROOT / "evals" / case.trace).is_file(), case.id
        if case.script:
            assert (ROOT / case.script).is_file(), case.id


def test_a_case_with_two_inputs_or_none_is_refused():
    with pytest.raises(msgspec.ValidationError, match="exactly one"):
        msgspec.convert({"id": "x", "why": "y", "expect": {"verdict": None}}, score.Case)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "x", "why": "y", "trace": "t", "expect": {"verdikt": "io-bound"}}, score.Case)


def test_the_hand_made_traces_are_what_build_writes():
    build = _module("build")
    for name, data in build.build().items():
        assert gzip.decompress((ROOT / "evals" / "traces" / f"{name}.json.gz").read_bytes()) == data, \
            f"evals/traces/{name}.json.gz is stale: python evals/build.py"
