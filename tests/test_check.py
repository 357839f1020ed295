"""perfscope check: the regression gate's decision, its text, exit status and JUnit XML."""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET

import orjson
import pytest

import perfscope
from perfscope.check import MIN_STEPS, CheckInputError, compare, report_lines
from test_bad_input import assert_one_line_error, run_cli
from test_report import gpu_trace


def summary(times_ms, verdict="compute-bound", mode="cpu", fractions=None, top=None):
    steps = [{"rank": 0, "step": i, "step_time_us": t * 1000, "counted": True} for i, t in enumerate(times_ms)]
    mean = sum(times_ms) / len(times_ms) * 1000
    return {"mode": mode, "steps": steps,
            "overall": {"verdict": verdict, "mean_step_time_us": mean, "steps_counted": len(steps),
                        "fractions": fractions or {"compute": 0.9, "io": 0.05, "launch": 0.05, "comm": 0.0}},
            "details": {"top_operators": top or []}}


def noisy(n, ms, seed, spread=0.02):
    rng = random.Random(seed)
    return [ms * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_identical_distributions_pass():
    r = compare(summary(noisy(30, 40, 1)), summary(noisy(30, 40, 2)))
    assert not r.failed and abs(r.slowdown) < 0.02
    assert report_lines(r)[-1] == "result: pass"


def test_a_ten_percent_regression_fails_with_its_evidence():
    r = compare(summary(noisy(20, 40, 1)), summary(noisy(20, 44, 2)))
    assert r.step_regression and r.failed
    assert r.p_value < 0.01 and 0.08 < r.slowdown < 0.12
    lines = report_lines(r)
    assert "REGRESSION" in lines[0] and "Mann-Whitney U" in lines[0] and lines[-1] == "result: FAIL"


def test_a_slowdown_below_half_the_target_passes_however_significant():
    r = compare(summary(noisy(200, 40, 1, 0.001)), summary(noisy(200, 40.8, 2, 0.001)))  # 2%, p tiny
    assert r.p_value < 1e-6 and not r.failed


def test_a_large_but_noisy_slowdown_is_not_called():
    base = [10, 80, 10, 80, 10, 80]
    r = compare(summary(base), summary([12, 82, 10, 90, 11, 81]))
    assert r.slowdown > 0.025 and r.p_value >= 0.01 and not r.failed
    assert "within the noise" in report_lines(r)[0]


def test_verdict_to_a_removable_class_fails_and_between_removable_ones_does_not():
    same = noisy(10, 40, 3)
    assert compare(summary(same), summary(same, verdict="io-bound")).verdict_regression
    r = compare(summary(same, verdict="io-bound"), summary(same, verdict="launch-bound"))
    assert not r.failed and "changed, not failed" in report_lines(r)[1]
    r = compare(summary(same, verdict="io-bound"), summary(same))
    assert not r.failed and "the removable cause is gone" in report_lines(r)[1]
    r = compare(summary(same), summary(same, verdict=None))
    assert not r.failed and "not compared" in report_lines(r)[1]


def test_what_grew_names_classes_and_operators_and_stays_quiet_on_crumbs():
    a = summary([40] * 10, top=[{"name": "aten::mm", "total_us": 300_000}, {"name": "aten::add", "total_us": 100}])
    b = summary([48] * 10, fractions={"compute": 0.75, "io": 0.2, "launch": 0.05, "comm": 0.0},
                top=[{"name": "aten::mm", "total_us": 360_000}, {"name": "aten::add", "total_us": 150}])
    grew = compare(a, b).changes
    assert grew[0].startswith("io share 5% -> 20%: 2.00 -> 9.60 ms per step (+7.60 ms)")
    assert any(g.startswith("operator aten::mm: 30.00 -> 36.00 ms per step") for g in grew)
    assert not any("aten::add" in g for g in grew)


def test_runs_that_cannot_be_compared():
    with pytest.raises(CheckInputError, match=f"at least {MIN_STEPS}"):
        compare(summary([40] * 10), summary([40] * (MIN_STEPS - 1)))
    with pytest.raises(CheckInputError, match="do not compare"):
        compare(summary([40] * 10), summary([40] * 10, mode="gpu"))


def test_all_equal_steps_are_no_evidence():
    assert compare(summary([40] * 10), summary([40] * 10)).p_value == 1.0


def _write(path, s):
    s = dict(s, schema="perfscope.summary", schema_version=2)
    path.write_bytes(orjson.dumps(s))
    return path


def test_cli_exit_status_text_and_junit(tmp_path):
    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    same = _write(tmp_path / "same.json", summary(noisy(20, 40, 2)))
    slow = _write(tmp_path / "slow.json", summary(noisy(20, 46, 3), verdict="io-bound"))
    ok = run_cli(tmp_path, "check", same, "--baseline", base)
    assert ok.returncode == 0, ok.stderr
    assert "result: pass" in ok.stdout
    junit = tmp_path / "ci" / "check.xml"
    (tmp_path / "ci").mkdir()
    bad = run_cli(tmp_path, "check", slow, "--baseline", base, "--max-regression", "5%", "--junit", junit)
    assert bad.returncode == 1, bad.stderr
    assert "REGRESSION" in bad.stdout and "verdict: compute-bound -> io-bound: REGRESSION" in bad.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "2"
    assert {tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None} == {"step time", "verdict"}
    loose = run_cli(tmp_path, "check", slow, "--baseline", base, "--max-regression", "40")
    assert "step time" in loose.stdout and "ok (below the 20.0% threshold)" in loose.stdout


def test_cli_never_writes_over_a_device_a_link_or_an_input(tmp_path):
    import os

    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    run = _write(tmp_path / "run.json", summary(noisy(20, 40, 2)))
    (tmp_path / "target.xml").write_text("keep")
    os.symlink(tmp_path / "target.xml", tmp_path / "link.xml")
    os.mkfifo(tmp_path / "fifo")
    for junit, words in ((tmp_path / "link.xml", "symbolic link"), (tmp_path / "fifo", "not a regular file"),
                         (run, "one of the inputs"), (base, "one of the inputs")):
        r = run_cli(tmp_path, "check", run, "--baseline", base, "--junit", junit)
        assert_one_line_error(r)
        assert words in r.stderr
    assert (tmp_path / "target.xml").read_text() == "keep" and (tmp_path / "link.xml").is_symlink()
    assert orjson.loads(run.read_bytes())["steps"]


def test_cli_refuses_the_same_run_twice(tmp_path):
    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    slow = _write(tmp_path / "slow.json", summary(noisy(20, 46, 3)))
    copy = tmp_path / "copy.json"  # the same steps analyzed again later: another generated_at, one run
    copy.write_bytes(orjson.dumps({**orjson.loads(slow.read_bytes()), "generated_at": "2026-01-01T00:00:00+00:00"}))
    for argv in ([slow, slow, "--baseline", base], [slow, copy, "--baseline", base], [slow, "--baseline", base, base]):
        r = run_cli(tmp_path, "check", *argv)
        assert_one_line_error(r)
        assert "are the same run" in r.stderr


def test_steps_of_zero_time_on_either_side_cannot_be_compared(tmp_path):
    with pytest.raises(CheckInputError, match="the baseline has 10 counted step"):
        compare(summary([0.0] * 10), summary([40] * 10))
    with pytest.raises(CheckInputError, match=r"the run has 10 counted step\(s\) that took no time \(under 1 µs\)"):
        compare(summary([40] * 10), summary([0.0] * 10))  # passed as 100% faster before
    with pytest.raises(CheckInputError, match="took no time"):  # subnormal: "0.0% slower" on a 100% slowdown
        compare(summary([5e-324 / 1000] * 10), summary([1e-323 / 1000] * 10))
    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    zero = _write(tmp_path / "zero.json", summary([0.0] * 20))
    r = run_cli(tmp_path, "check", zero, "--baseline", base)
    assert_one_line_error(r)
    assert r.returncode == 2 and "took no time" in r.stderr and "result:" not in r.stdout


def test_junit_holds_any_name_as_well_formed_xml(tmp_path):
    from perfscope.check import write_junit

    weird = "aten::\ufffe\uffff\x01\u001b[31mred" + "x" * 5000
    a = summary([40] * 10, top=[{"name": weird, "total_us": 1000}])
    b = summary([48] * 10, top=[{"name": weird, "total_us": 200_000}])
    path = write_junit(compare(a, b), tmp_path / "j.xml", name="run\udcff\u001b]0;x")
    root = ET.parse(path).getroot()  # well formed
    assert root.find("testsuite").get("failures") == "1"
    text = path.read_text()
    assert "\x1b" not in text and "\ufffe" not in text
    assert max(len(line) for line in compare(a, b).changes) < 300  # a long name is cut


@pytest.mark.parametrize("argv, words", [
    (["--max-regression", "five"], "not a percentage"),
    (["--max-regression", "0"], "above 0%"),
    (["--alpha", "100%"], "below 100%"),
    (["--max-regression", "0.05"], "ambiguous: write 5% for a fraction of 0.05"),
])
def test_cli_bad_options_are_one_line(tmp_path, argv, words):
    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    r = run_cli(tmp_path, "check", base, "--baseline", base, *argv)
    assert_one_line_error(r)
    assert words in r.stderr


def test_cli_cannot_compare_is_exit_2(tmp_path):
    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    few = _write(tmp_path / "few.json", summary([40, 41]))
    r = run_cli(tmp_path, "check", few, "--baseline", base)
    assert_one_line_error(r)
    assert "needs at least 5" in r.stderr
    r = run_cli(tmp_path, "check", tmp_path / "missing", "--baseline", base)
    assert_one_line_error(r)
    other = _write(tmp_path / "other.json", summary(noisy(20, 40, 2)))
    r = run_cli(tmp_path, "check", other, "--baseline", base, "--junit", tmp_path)
    assert_one_line_error(r)
    assert "is a directory" in r.stderr and "result:" not in r.stdout  # refused before comparing


def test_check_on_analyzed_traces(tmp_path):
    # the same 1 ms steps: first compute-bound, then waiting on the DataLoader
    a = perfscope.analyze(gpu_trace(tmp_path / "a.json", steps=8, dl_us=5, kernel_us=900)).summary()
    b = perfscope.analyze(gpu_trace(tmp_path / "b.json", steps=8, dl_us=600, kernel_us=300)).summary()
    assert compare(a, a).failed is False
    r = compare(a, b)
    assert r.verdicts == ("compute-bound", "io-bound") and r.verdict_regression and not r.step_regression
    assert any(line.startswith("io share") for line in r.changes)


def drifting_runs(means_ms, seed):
    """Runs whose steps are tight but whose levels drift from run to run (a shared machine)."""
    return [summary(noisy(20, m, seed + k, 0.005)) for k, m in enumerate(means_ms)]


def test_drift_between_runs_is_in_the_test_with_several_baseline_runs():
    baselines = drifting_runs([40, 42, 39, 41.5, 40.5, 38.8], 10)
    drifted = summary(noisy(20, 42.6, 99, 0.005))  # 5% above the mean, inside the drift
    one = compare(baselines[0], drifted)
    assert one.step_regression and "Mann-Whitney" in one.test  # a single pair takes drift for a regression
    many = compare(baselines, drifted)
    assert many.test == "prediction interval of 6 baseline runs" and not many.failed
    far = compare(baselines, summary(noisy(20, 50, 98, 0.005)))
    assert far.step_regression and far.p_value < 0.01


def test_several_runs_on_both_sides_use_welch():
    base = drifting_runs([40, 41, 39.5, 40.5], 20)
    same = compare(base, drifting_runs([40.2, 39.8, 41, 40.1], 30))
    assert same.test == "Welch's t-test over 4 and 4 runs" and not same.failed
    slow = compare(base, drifting_runs([44.1, 44.5, 43.8, 44.9], 40))
    assert slow.step_regression and slow.runs == (4, 4)
    against_one = compare(base[0], drifting_runs([44.1, 44.5, 43.8, 44.9], 40))
    assert against_one.test == "t-test of 4 runs against one baseline run"


def test_cli_takes_several_runs_and_a_folder_of_outputs(tmp_path):
    folder = tmp_path / "baselines"
    for k, s in enumerate(drifting_runs([40, 42, 39, 41.5, 40.5, 38.8], 10)):
        (folder / f"run{k}").mkdir(parents=True)
        _write(folder / f"run{k}" / "summary.json", s)
    run = _write(tmp_path / "run.json", summary(noisy(20, 42.6, 99, 0.005)))
    r = run_cli(tmp_path, "check", run, "--baseline", folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "prediction interval of 6 baseline runs" in r.stdout and "note: one run" not in r.stdout
    run2 = _write(tmp_path / "run2.json", summary(noisy(20, 42.0, 98, 0.005)))
    r = run_cli(tmp_path, "check", run, run2, "--baseline", folder / "run0", folder / "run1")
    assert "Welch's t-test over 2 and 2 runs" in r.stdout
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli(tmp_path, "check", run, "--baseline", tmp_path / "empty"))


def provisional_summary(times_ms, waits_ms, verdict="launch-bound"):
    """A summary whose every step waited for cores: the verdict provisional, the steps uncounted."""
    s = summary([t for t in times_ms], verdict=verdict)
    for row, wait in zip(s["steps"], waits_ms):
        row.update(counted=False, status="host-contended", core_wait_us=wait * 1000, provisional_verdict=verdict)
    s["overall"].update(provisional=True, core_wait_share=sum(waits_ms) / sum(times_ms), steps_counted=0)
    return s


def test_provisional_runs_are_compared_on_their_steps_without_the_waits():
    # Both sides on a busy host: 100 ms steps of which 60 ms (baseline) and 70 ms (run) were waits
    # for a core; without them 40 ms and 30 ms: the run is faster, not 10% slower.
    base = provisional_summary(noisy(20, 100, 1), [60.0] * 20)
    run = provisional_summary(noisy(20, 100, 2), [70.0] * 20, verdict="compute-bound")
    r = compare(base, run)
    assert r.baseline_step_us == pytest.approx(40_000, rel=0.05) and r.run_step_us == pytest.approx(30_000, rel=0.07)
    assert not r.step_regression and not r.verdict_regression  # a provisional verdict change is not failed on
    assert any("verdict is provisional" in n for n in r.notes), r.notes
    assert not r.failed


def test_a_provisional_run_against_a_clean_baseline_is_compared_and_noted(tmp_path):
    base = _write(tmp_path / "base.json", summary(noisy(20, 40, 1)))
    run = _write(tmp_path / "run.json", provisional_summary(noisy(20, 100, 2), [62.0] * 20))  # 38 ms without
    r = run_cli(tmp_path, "check", run, "--baseline", base)
    assert r.returncode == 0, r.stderr
    assert "the run had no clean step (busy host)" in r.stdout and "result: pass" in r.stdout


def test_impossible_summaries_from_a_hostile_read_are_refused_or_not_trusted():
    # steps of 285,000 years each
    with pytest.raises(CheckInputError, match="longer than 115 days"):
        compare(summary([9e15] * 30), summary([400] * 30))
    # a provisional flag beside 30 clean counted steps is a hand edit: the verdict is judged as usual
    base = summary(noisy(30, 40, 1))
    run = summary(noisy(30, 40, 2), verdict="io-bound")
    run["overall"]["provisional"] = True
    r = compare(base, run)
    assert r.verdict_regression and r.failed
