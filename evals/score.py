"""Grade perfscope's answers on the eval's cases (``evals/cases.yaml``) and print the score.

Each case is run as a user runs it -- ``perfscope analyze --json`` on a trace, ``perfscope profile
--json`` on a script -- and its answer is decoded with the structs ``docs/answer.schema.json`` is
generated from, then checked against what the case expects. A case passes when every one of its
checks does; the score is the share of cases passed, and anything under 100% exits 1.

Usage::

    python evals/score.py [--only ID ...] [--jobs N] [--no-scripts] [--require-shared]

Cases on ``../shared/traces`` are skipped, and listed, where that folder is absent
(``--require-shared`` makes that a failure). A case with ``load: N`` runs alone, beside N busy
processes the scorer starts and stops: the contended machine is made, not hoped for.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import yaml

from perfscope.record.answer import Answer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "traces"
CASE_TIMEOUT_S = 900  # a two-rank script beside a busy machine; a hang still ends
# An abstained figure and the field that must say why (docs/answer.md).
WHY = {"verdict": "reason", "shares": "reason", "step_time_us": "reason", "mfu": "mfu_why"}


class Expect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a case's answer must say (the comment at the top of ``cases.yaml``)."""

    verdict: str | None = "unset"
    provisional: bool | None = None
    knob: str | None = None
    no_knobs: bool = False
    abstain: list[str] = []
    reason: str | None = None
    warning: str | None = None
    partial: bool = False
    error: str | None = None


class Case(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One graded case: an input, why its answer is what it is, and what the answer must say."""

    id: str
    why: str
    expect: Expect
    trace: str | None = None
    script: str | None = None
    args: list[str] = []
    nproc: int = 1
    load: int = 0
    env: dict[str, str] = {}

    def __post_init__(self) -> None:
        if (self.trace is None) == (self.script is None):
            raise msgspec.ValidationError(f"case {self.id}: name exactly one of trace and script")
        if self.expect.verdict == "unset" and self.expect.error is None:
            raise msgspec.ValidationError(f"case {self.id}: expect a verdict (or null) or an error")


class Result(msgspec.Struct, kw_only=True):
    """A graded case: ``checks`` maps each check to None (passed) or what was wrong."""

    id: str
    checks: dict[str, str | None] = {}
    skipped: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.skipped is None and bool(self.checks) and all(v is None for v in self.checks.values())


def load_cases(path: Path = HERE / "cases.yaml") -> list[Case]:
    """The cases, validated once (ids unique)."""
    cases = msgspec.convert(yaml.safe_load(path.read_text(encoding="utf-8")), list[Case])
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise msgspec.ValidationError(f"case ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return cases


def command(case: Case, out: Path) -> list[str] | str:
    """The perfscope command line of a case, or why it cannot run here."""
    perfscope = [sys.executable, "-m", "perfscope"]
    if case.script is not None:
        ranks = ["--nproc-per-node", str(case.nproc)] if case.nproc > 1 else []
        return [*perfscope, "profile", *ranks, "--json", "--out", str(out), str(ROOT / case.script), "--", *case.args]
    if case.trace.startswith("shared:"):
        path = SHARED / case.trace.removeprefix("shared:")
        if not path.exists():
            return f"{path} is absent (the real traces live in ../shared/traces)"
    else:
        path = HERE / case.trace
    return [*perfscope, "analyze", "--json", "--out", str(out), str(path)]


def grade(expect: Expect, rc: int, stdout: str, stderr: str) -> dict[str, str | None]:
    """The checks of one answer: check name -> None when it holds, else what was found instead."""
    checks: dict[str, str | None] = {}
    if expect.error is not None:
        lines = [line for line in stderr.splitlines() if line.strip()]
        checks["fails"] = None if rc != 0 else "exit status 0"
        checks["one clear line"] = (None if lines and expect.error in lines[-1] and "Traceback" not in stderr
                                    else f"stderr: {stderr.strip()[-300:]!r}")
        return checks
    if rc != 0:
        return {"runs": f"exit status {rc}: {stderr.strip()[-300:]!r}"}
    try:
        answer = msgspec.json.decode(stdout, type=Answer)
    except msgspec.DecodeError as exc:
        return {"one JSON answer on stdout, valid against the schema": str(exc)}
    checks["one JSON answer on stdout, valid against the schema"] = None

    def check(name: str, ok: bool, found: Any) -> None:
        checks[name] = None if ok else f"found {found!r}"

    check(f"verdict {expect.verdict}", answer.verdict == expect.verdict, answer.verdict)
    if expect.provisional is not None:
        check(f"provisional {expect.provisional}", answer.provisional is expect.provisional, answer.provisional)
    if expect.knob is not None:
        check(f"advice names {expect.knob}", expect.knob in answer.verdict_knobs, answer.verdict_knobs)
    if expect.no_knobs:
        check("advice names no key", answer.verdict_knobs == [], answer.verdict_knobs)
    for name in expect.abstain:
        value, why = getattr(answer, name), getattr(answer, WHY[name])
        check(f"{name} null with its reason", value is None and bool(why), (value, why))
    if expect.reason is not None:
        check(f"reason says {expect.reason!r}", expect.reason in (answer.reason or ""), answer.reason)
    if expect.warning is not None:
        check(f"a warning says {expect.warning!r}", any(expect.warning in w for w in answer.warnings), answer.warnings)
    if expect.partial:
        counted, total = answer.steps_counted, answer.steps_total
        check("some steps left out", counted is not None and total is not None and counted < total, (counted, total))
    if answer.verdict is None:  # an abstention is whole: no shares, no advice
        check("no shares or advice without a verdict", answer.shares is None and not answer.advice,
              (answer.shares, answer.advice))
    else:
        check("shares add up to 1", abs(sum((answer.shares or {}).values()) - 1.0) < 1e-6, answer.shares)
    return checks


@contextlib.contextmanager
def busy(n: int):
    """``n`` processes spinning on the CPU for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_case(case: Case) -> Result:
    """Run one case and grade its answer."""
    with tempfile.TemporaryDirectory(prefix=f"perfscope-eval-{case.id}-") as tmp:
        cmd = command(case, Path(tmp) / "out")
        if isinstance(cmd, str):
            return Result(id=case.id, skipped=cmd)
        env = {**os.environ, **case.env,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        start = time.monotonic()
        with busy(case.load):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=CASE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return Result(id=case.id, checks={"runs": f"no answer in {CASE_TIMEOUT_S} s"})
        seconds = time.monotonic() - start
    return Result(id=case.id, checks=grade(case.expect, done.returncode, done.stdout, done.stderr), seconds=seconds)


def score(cases: list[Case], jobs: int) -> list[Result]:
    """Every case's result, in the cases' order: those without load ``jobs`` at a time, then each
    loaded one alone."""
    plain = [c for c in cases if not c.load]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = dict(zip([c.id for c in plain], pool.map(run_case, plain)))
    for case in cases:
        if case.load:
            results[case.id] = run_case(case)
    return [results[c.id] for c in cases]


def report(results: list[Result]) -> str:
    """The score in words: one line per case, what failed, the totals."""
    lines = []
    for r in results:
        if r.skipped:
            lines.append(f"  skip  {r.id}: {r.skipped}")
            continue
        lines.append(f"  {'pass' if r.passed else 'FAIL'}  {r.id} ({len(r.checks)} checks, {r.seconds:.1f} s)")
        lines += [f"          {name}: {why}" for name, why in r.checks.items() if why is not None]
    graded = [r for r in results if not r.skipped]
    passed = sum(r.passed for r in graded)
    checks = sum(len(r.checks) for r in graded)
    held = sum(v is None for r in graded for v in r.checks.values())
    share = passed / len(graded) if graded else 0.0
    lines.append(f"eval score: {passed}/{len(graded)} cases ({share:.1%}), {held}/{checks} checks"
                 + (f"; {len(results) - len(graded)} skipped" if len(graded) < len(results) else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="grade these cases only")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2; loaded ones run alone)")
    parser.add_argument("--no-scripts", action="store_true", help="leave out the script cases")
    parser.add_argument("--require-shared", action="store_true", help="fail where ../shared/traces is absent")
    args = parser.parse_args(argv)
    try:
        cases = load_cases()
    except (msgspec.ValidationError, yaml.YAMLError, OSError) as exc:
        print(f"evals: cases.yaml: {exc}", file=sys.stderr)
        return 2
    if args.only:
        unknown = set(args.only) - {c.id for c in cases}
        if unknown:
            print(f"evals: no case {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.id in args.only]
    if args.no_scripts:
        cases = [c for c in cases if c.script is None]
    results = score(cases, args.jobs)
    print(report(results), flush=True)
    skipped = any(r.skipped for r in results)
    return 0 if all(r.passed or r.skipped for r in results) and not (skipped and args.require_shared) else 1


if __name__ == "__main__":
    sys.exit(main())
