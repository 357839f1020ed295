"""`perfscope watch DIR` and the live view of `perfscope profile` (perfscope.watch,
perfscope/cli/watch.py): read from the run's traces/rank*.run.jsonl as they grow, one line per rank
with the slowest marked, ended by the run's summary or its released lock; the live view on a
pseudo-terminal, off with --no-live or without a terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from perfscope.cli.watch import follow
from perfscope.outlock import FolderLock
from perfscope.record.run_steps import RunStep, encode_run_step
from perfscope.watch import RunFollower, folder_locked, rank_view, running_class

ROOT = Path(__file__).resolve().parents[1]


def _step(n: int, seconds: float, input_s: float) -> RunStep:
    return RunStep(step=n, end=n * seconds, seconds=seconds, input=input_s, forward=(seconds - input_s) / 2,
                   backward=(seconds - input_s) / 4, optimizer=(seconds - input_s) / 8)


def _append(out: Path, rank: int, steps: list[RunStep], torn: bytes = b"") -> None:
    (out / "traces").mkdir(parents=True, exist_ok=True)
    with open(out / "traces" / f"rank{rank}.run.jsonl", "ab") as f:
        f.write(b"".join(encode_run_step(s) for s in steps) + torn)


def test_the_follower_reads_whole_lines_as_they_come(tmp_path):
    line = encode_run_step(_step(3, 0.1, 0.05))
    _append(tmp_path, 0, [_step(1, 0.1, 0.05), _step(2, 0.1, 0.05)], torn=line[:7])  # a line half written
    follower = RunFollower(tmp_path)
    assert follower.poll() and [s.step for s in follower.ranks()[0]] == [1, 2]
    assert not follower.poll()  # nothing whole since
    with open(tmp_path / "traces" / "rank0.run.jsonl", "ab") as f:
        f.write(line[7:])
    assert follower.poll() and [s.step for s in follower.ranks()[0]] == [1, 2, 3]


def test_a_rank_view_is_the_steady_median_and_phase_split():
    steps = [_step(1, 5.0, 0.0), _step(2, 3.0, 0.0)] + [_step(n, 0.1, 0.06) for n in range(3, 13)]
    v = rank_view(0, steps)
    assert v.step == 12 and v.median_s == pytest.approx(0.1)  # start-up steps left out
    assert v.shares["input"] == pytest.approx(0.6) and sum(v.shares.values()) == pytest.approx(1.0)
    assert v.running_class == "io-bound"
    assert running_class({"input": 0.05}) == "not input-bound" and running_class(None) == "no steady step yet"


def test_watch_follows_a_growing_two_rank_run_marks_the_slowest_and_ends_with_it(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    ticks = iter(range(10_000))

    def sleep(_s):
        n = next(ticks)
        if n < 4:  # the run goes on: both ranks finish five more steps, rank 1 slower
            _append(out, 0, [_step(5 * n + k, 0.10, 0.02) for k in range(1, 6)])
            _append(out, 1, [_step(5 * n + k, 0.15, 0.03) for k in range(1, 6)])
        elif n == 4:  # the analysis after the script writes the summary
            (out / "summary.json").write_text("{}")
            os.utime(out / "summary.json", (os.path.getmtime(out / "traces" / "rank1.run.jsonl") + 1,) * 2)

    assert follow(out, interval_s=0, tty=False, sleep=sleep, clock=lambda: 0.0) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("waiting for the first step")
    assert "rank 0 step 5 | io-bound | median 100.0 ms" in shown[1] and "<- slowest" in shown[2] and "rank 1" in shown[2]
    assert any(s.startswith("rank 1 step 20 | io-bound | median 150.0 ms") for s in shown)
    assert shown[-1].startswith("rank 1 step 20")  # no verdict line: the summary holds none


def test_a_run_whose_lock_is_gone_and_records_still_has_ended(tmp_path, capsys):
    _append(tmp_path, 0, [_step(n, 0.1, 0.0) for n in range(1, 6)])
    clock = iter([0.0, 0.0, 1.0, 5.0, 5.0, 9.0, 9.0])
    with FolderLock(tmp_path, "perfscope profile", pid_file=False):
        assert folder_locked(tmp_path) is True
    assert folder_locked(tmp_path) is False
    assert follow(tmp_path, interval_s=0, tty=False, sleep=lambda s: None, clock=lambda: next(clock)) == 0
    assert "step 5" in capsys.readouterr().out


def test_watch_of_a_missing_folder_is_one_line():
    done = subprocess.run([sys.executable, "-m", "perfscope", "watch", "/nonexistent/run"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "not a folder" in done.stderr


def _on_a_terminal(args: list[str], timeout_s: float = 300) -> tuple[int, str]:
    """Run ``perfscope ARGS`` with standard output on a pseudo-terminal; its exit status and all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))  # a terminal of 120 x 30
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", *args], stdout=slave, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout_s)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal closed: every writer is gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_the_live_view_draws_on_a_terminal_and_not_with_no_live(tmp_path):
    script = ["examples/io_bound.py", "--", "--steps", "40"]
    rc, shown = _on_a_terminal(["profile", "--out", str(tmp_path / "a"), "--max-steps", "0", *script])
    assert rc == 0, shown[-2000:]
    lines = shown.replace("\r", "\n").splitlines()
    live = [s for s in lines if "| median " in s]
    assert live and any("io-bound" in s for s in live), shown[-2000:]
    # the script's own lines pass above the status line, whole
    assert "step 40: loss" in [s[:13] for s in lines], shown[-2000:]
    assert "verdict: io-bound" in shown  # the table after the view
    rc, shown = _on_a_terminal(["profile", "--no-live", "--out", str(tmp_path / "b"), *script])
    assert rc == 0 and "| median " not in shown
    done = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", str(tmp_path / "c"), *script],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and "| median " not in done.stdout + done.stderr  # not a terminal: no view
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["overall"]["verdict"] == "io-bound"


@pytest.mark.slow
def test_watch_follows_a_profile_that_is_still_running_and_ends_with_it(tmp_path):
    out = tmp_path / "run"
    profile = subprocess.Popen([sys.executable, "-m", "perfscope", "profile", "--out", str(out), "--max-steps", "0",
                                "examples/io_bound.py", "--", "--steps", "80"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (out / "traces").is_dir():  # the profile makes its folder first
            assert profile.poll() is None, "the profile ended before making its folder"
            select.select([], [], [], 0.1)
        watched = subprocess.run([sys.executable, "-m", "perfscope", "watch", str(out), "--interval", "0.5"],
                                 capture_output=True, text=True, timeout=600)
    finally:
        assert profile.wait(timeout=600) == 0
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    steps = [int(s.split()[1]) for s in lines if s.startswith("step ")]
    assert len(set(steps)) >= 2 and steps == sorted(steps), lines  # it saw the run move
    assert steps[-1] == 80 and lines[-1].startswith("verdict: io-bound")  # ... to its end, then its verdict
