"""A run's outputs are one unit: a failed write leaves the earlier run's files together, and a
trace that is not the one a summary was made from is never drawn under its step times."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from perfscope import atomic
from perfscope.analysis.run import analyze_files
from perfscope.cli import main
from perfscope.errors import PerfscopeError
from perfscope.outputs import write_outputs
from test_report import cpu_trace, gpu_trace


def _analysis(path):
    return analyze_files([path], run_info={"source": str(path)})


def test_a_full_disk_leaves_the_earlier_summary_and_report_together(tmp_path, monkeypatch):
    first = _analysis(gpu_trace(tmp_path / "a.json", steps=3))
    out = tmp_path / "out"
    write_outputs(first.summary(), out, first.tables)
    before = {name: (out / name).read_bytes() for name in ("summary.json", "report.html", "timeline.json")}

    real_write = os.write
    calls = {"n": 0}

    def fill_up(fd, data):
        calls["n"] += 1
        if calls["n"] > 1:  # the second file of the unit finds the disk full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    second = _analysis(cpu_trace(tmp_path / "b.json", steps=5))
    monkeypatch.setattr(atomic.os, "write", fill_up, raising=True)
    monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: _RawFile(fd), raising=True)
    with pytest.raises(PerfscopeError, match="No space left on device.*earlier ones there are unchanged"):
        write_outputs(second.summary(), out, second.tables)
    monkeypatch.undo()
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "summary.json", "timeline.json"]  # no temporary


class _RawFile:
    """A file object writing through ``os.write`` (so the test can fail the second file's write)."""

    def __init__(self, fd):
        self.fd = fd

    def write(self, data):
        return atomic.os.write(self.fd, data)

    def flush(self):
        pass

    def fileno(self):
        return self.fd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def test_report_leaves_out_a_trace_that_a_later_run_replaced(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    trace = gpu_trace(out / "traces" / "rank0.json", steps=3, kernel_name="first_run_kernel")
    assert main(["analyze", str(trace), "--out", str(out)]) == 0
    assert "first_run_kernel" in (out / "report.html").read_text()
    capsys.readouterr()

    # A re-run interrupted after its trace was written: the new trace beside the old summary.
    gpu_trace(trace, steps=6, kernel_name="second_run_kernel")
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()  # drawn from the first run's timeline.json
    assert "first_run_kernel" in html and "second_run_kernel" not in html

    (out / "timeline.json").unlink()  # then only the traces could draw it
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert "is no longer the trace" in err and "left out of the timeline" in err
    html = (out / "report.html").read_text()
    assert "second_run_kernel" not in html  # its events are not drawn under the first run's steps


def test_a_copied_output_directory_keeps_its_timeline(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    trace = gpu_trace(out / "traces" / "rank0.json", steps=3, kernel_name="kept_kernel")
    assert main(["analyze", str(trace), "--out", str(out)]) == 0
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # new file times; the same content
    shutil.rmtree(out)
    capsys.readouterr()
    assert main(["report", str(copy)]) == 0
    assert "no longer the trace" not in capsys.readouterr().err
    assert "kept_kernel" in (copy / "report.html").read_text()
