"""The measurement runner as a process: no DataLoader worker outlives it, and bad command-line
options, a bad config or bad step counts are refused with one line (exit status 2)."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from measurekit import (
    LOOP,
    no_config_from_env,  # noqa: F401 (autouse fixture)
    result,
    run_cli,
    write_config,
)

from perfscope.measure import runner as measure


# --------------------------------------------------------------------------- processes and options
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status is left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_dataloader_worker_outlives_the_measurement(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "2", script=LOOP,
                   args=["--steps", 50, "--num-workers", 2, "--pid-dir", pids])
    assert proc.returncode == 0, proc.stderr

    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2
    assert [pid for pid in workers if _alive(pid)] == []
    assert result(out)["facts"]["dataloader"]["num_workers"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup-steps", "1", "--measure-steps", "2", "--", "x.py"], "missing --record-dir"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "0", "--", "x.py"], "--measure-steps"),
        (["--record-dir", "R", "--warmup-steps", "-1", "--measure-steps", "2", "--", "x.py"], "--warmup-steps"),
        (["--record-dir", "R", "--warmup-steps", "a", "--measure-steps", "2", "--", "x.py"], "integer"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--bogus", "1", "--", "x.py"],
         "unrecognized arguments: --bogus"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--"], "missing SCRIPT"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--seed"], "--seed: expected one argument"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--drain-prefetch", "--drain-prefetch",
          "--", "x.py"], "given twice"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--", "missing.py"],
         "script not found"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert measure.main(argv) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfscope.measure: error:") and message in lines[0]


def test_bad_config_exits_2_and_says_why_in_the_record(tmp_path):
    config = write_config(tmp_path, "num_workers: -3\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = measure.main(["--record-dir", str(tmp_path / "rec"), "--warmup-steps", "1", "--measure-steps", "1",
                             "--config", str(config), "--", str(LOOP)])
    assert code == 2 and "num_workers" in err.getvalue()
    res = result(tmp_path / "rec")
    assert res["exit_code"] == 2 and "num_workers" in res["error"]


def test_python_api_rejects_bad_step_counts(tmp_path):
    with pytest.raises(ValueError, match="measure_steps"):
        measure.measure_in_process(LOOP, [], record_dir=tmp_path, warmup_steps=0, measure_steps=0)
    with pytest.raises(ValueError, match="profile_steps"):
        measure.measure_in_process(LOOP, [], record_dir=tmp_path, warmup_steps=0, measure_steps=1, profile_steps=-1)
