"""The command line on bad input: one line on stderr (``perfscope: error: ...``), a non-zero exit,
never a traceback, and nothing already written is lost."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tracegen import launch, step, write_trace
from conftest import HANG_TIMEOUT_S  # noqa: E402

# argparse names the sub-command in its errors: "perfscope analyze: error: ..."
USAGE_ERROR = re.compile(r"^perfscope( \w+)?: error: ")
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def run_cli(cwd, *args):
    return subprocess.run(
        [sys.executable, "-m", "perfscope", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
    )


def assert_one_line_error(r):
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("perfscope: error: "), r.stderr


def good_trace(path, first_step=1, rank=None):
    events = []
    for i in range(2):
        n, t0 = first_step + i, 100 * i
        events += [step(n, t0, 100), *launch("gemm", t0 + 1, t0 + 5, 90, correlation=n)]
    meta = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}} if rank is not None else {}
    return write_trace(path, events, **meta)


# Each builds a bad input under tmp and returns the command's arguments (without --out).


def _missing_path(tmp):
    return ["analyze", tmp / "no-such-trace.json"]


def _dir_without_traces(tmp):
    (tmp / "empty").mkdir()
    (tmp / "empty" / "notes.txt").write_text("no traces here")
    return ["analyze", tmp / "empty"]


def _corrupt_gzip(tmp):
    (tmp / "bad.json.gz").write_bytes(GZIP_HEADER + b"\xff" * 64)  # invalid deflate block
    return ["analyze", tmp / "bad.json.gz"]


def _invalid_json(tmp):
    (tmp / "bad.json").write_text('{"schemaVersion": 1, "deviceProperties": [1, 2')
    return ["analyze", tmp / "bad.json"]


def _empty_trace(tmp):
    (tmp / "empty.json").write_text('{"traceEvents": []}')
    return ["analyze", tmp / "empty.json"]


def _ranks_disagree(tmp):
    (tmp / "ranks").mkdir()
    good_trace(tmp / "ranks" / "rank0.pt.trace.json", first_step=1, rank=0)
    good_trace(tmp / "ranks" / "rank1.pt.trace.json", first_step=5, rank=1)
    return ["analyze", tmp / "ranks"]


def _script_not_found(tmp):
    return ["profile", tmp / "no_such_train.py"]


def _script_not_py(tmp):
    (tmp / "train.txt").write_text("print('hi')\n")
    return ["profile", tmp / "train.txt"]


BAD_INPUTS = {
    "missing-path": _missing_path,
    "dir-without-traces": _dir_without_traces,
    "corrupt-gzip": _corrupt_gzip,
    "invalid-json": _invalid_json,
    "empty-trace": _empty_trace,
    "ranks-disagree": _ranks_disagree,
    "script-not-found": _script_not_found,
    "script-not-py": _script_not_py,
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_error(tmp_path, case):
    args = BAD_INPUTS[case](tmp_path)
    r = run_cli(tmp_path, *args, "--out", tmp_path / "out")
    assert_one_line_error(r)


def test_unwritable_out_is_one_line_error(tmp_path):
    good = good_trace(tmp_path / "rank0.pt.trace.json")
    (tmp_path / "afile").write_text("a regular file, so nothing can be created below it")
    r = run_cli(tmp_path, "analyze", good, "--out", tmp_path / "afile" / "out")
    assert_one_line_error(r)
    assert "afile" in r.stderr


def test_profile_with_unwritable_out_is_one_line_error(tmp_path):
    (tmp_path / "train.py").write_text("print('never run')\n")
    (tmp_path / "afile").write_text("")
    r = run_cli(tmp_path, "profile", tmp_path / "train.py", "--out", tmp_path / "afile" / "out")
    assert_one_line_error(r)
    assert "never run" not in r.stdout


def test_malformed_event_is_one_line_error(tmp_path):
    (tmp_path / "t.json").write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": "abc", "dur": 1}]}'
    )
    assert_one_line_error(run_cli(tmp_path, "analyze", tmp_path / "t.json", "--out", tmp_path / "out"))


@pytest.mark.parametrize(
    "args",
    [
        ["analyze"],  # no path
        ["analyze", "t.json", "--bogus"],
        ["analyze", "t.json", "--", "x"],  # script args only for profile
        ["profile", "train.py", "--active", "0"],
        ["profile", "train.py", "--skip-first", "-1"],
        ["frobnicate"],
    ],
    ids=["no-path", "unknown-option", "dashdash", "active-0", "negative-skip", "unknown-command"],
)
def test_bad_options_are_usage_errors(tmp_path, args):
    r = run_cli(tmp_path, *args)
    assert "Traceback" not in r.stdout + r.stderr
    assert r.returncode == 2
    assert USAGE_ERROR.match(r.stderr.strip().splitlines()[-1]), r.stderr
    assert not (tmp_path / "perfscope-out").exists()


# ---------------------------------------------------------------- nothing already written is lost


@pytest.fixture
def previous_run(tmp_path):
    """An output directory holding the files of an earlier good analysis."""
    out = tmp_path / "out"
    r = run_cli(tmp_path, "analyze", good_trace(tmp_path / "rank0.pt.trace.json"), "--out", out)
    assert r.returncode == 0, r.stderr
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "summary.json" in files
    return out, files


@pytest.mark.parametrize("case", ["missing-path", "corrupt-gzip", "empty-trace", "ranks-disagree", "script-not-found"])
def test_failed_run_keeps_previous_outputs(tmp_path, previous_run, case):
    out, before = previous_run
    args = BAD_INPUTS[case](tmp_path)
    r = run_cli(tmp_path, *args, "--out", out)
    assert_one_line_error(r)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after == before  # same files (no leftovers), same bytes
