"""The progress line of `report` and `diff`: shown on a terminal once a command runs past a few
seconds, never in a log or a pipe, never mixed into what the command prints on stdout."""

from __future__ import annotations

import io
import sys
import time

import pytest
from tracegen import cpu_op, step, write_trace

from perfscope.analysis import progress
from perfscope.analysis.progress import Stages
from perfscope.cli import main


class _Terminal(io.StringIO):
    """Standard error as a terminal would be, kept for reading."""

    def isatty(self) -> bool:
        return True

    def shows(self, text: str) -> bool:
        """Wait for the progress line's timer thread to draw ``text`` (a bound on a thread being
        scheduled, not a speed: 60 s, for a machine at a load of 40)."""
        deadline = time.monotonic() + 60
        while text not in self.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        return text in self.getvalue()


@pytest.fixture
def saved(tmp_path):
    """Two output folders of `perfscope analyze` on small CPU traces."""
    outs = []
    for k, dur in enumerate((900, 1400)):
        events = []
        for n in range(6):
            s = 1000 * n * 2
            events += [step(n + 1, s, dur), cpu_op("aten::mm", s + 10, dur - 50)]
        trace = write_trace(tmp_path / f"t{k}.json", events)
        out = tmp_path / f"out{k}"
        assert main(["analyze", str(trace), "--out", str(out)]) in (0, 3)
        outs.append(out)
    return outs


def test_stages_are_named_once_the_command_runs_past_the_quiet_time(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    with Stages("report", 2) as stages:
        with stages.stage("reading the summary"):
            assert terminal.shows("report: reading the summary (0/2)")
        with stages.stage("drawing the page"):
            assert terminal.shows("report: drawing the page (1/2)")
    assert stages.done == 2


def test_a_quick_command_and_a_log_file_get_no_progress_line(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Stages("diff", 1) as quick, quick.stage("reading A"):
        pass
    time.sleep(0.05)
    assert terminal.getvalue() == ""  # done within the quiet time: the line is never drawn
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    with Stages("diff", 1) as piped, piped.stage("reading A"):
        time.sleep(0.05)
    assert log.getvalue() == ""


@pytest.mark.parametrize("command", ["report", "diff"])
def test_report_and_diff_show_their_stages_on_a_terminal_and_stdout_stays_clean(saved, tmp_path, monkeypatch, capsys,
                                                                                command):
    capsys.readouterr()
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    page = tmp_path / f"{command}.html"
    from perfscope import reports

    name = "write_report" if command == "report" else "write_diff"
    real = getattr(reports, name)

    def drawn_while_seen(*args, **kwargs):  # the page is drawn once the line names it
        assert terminal.shows(f"{command}: drawing the page (2/3)")
        return real(*args, **kwargs)

    monkeypatch.setattr(reports, name, drawn_while_seen)
    argv = [command, str(saved[0]), "--out", str(page)] if command == "report" else \
        [command, str(saved[0]), str(saved[1]), "--out", str(page)]
    assert main(argv) == 0
    assert page.is_file()
    out = capsys.readouterr().out
    assert f"{command}:" not in out and "wrote" in out
    if command == "diff":
        assert out.startswith("A: ")  # the comparison's lines, whole, before the page is named
