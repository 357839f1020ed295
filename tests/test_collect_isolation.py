"""Collection runs, what the script sees and what it leaves behind: ``__main__``, argv and
sys.path as plain ``python`` gives them, a script that changes directory or replaces its streams,
and perfscope's hooks and patches removed afterwards."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from collectkit import SMALL, loop_script, write_script

from perfscope.collect import collect


def test_script_sees_what_python_would_show(tmp_path):
    sub = tmp_path / "proj"
    sub.mkdir()
    script = write_script(
        sub,
        """
        import json, sys
        json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0]},
                  open(sys.argv[1], "w"))
        """,
        name="show.py",
    )
    expected_file, seen_file = tmp_path / "python.json", tmp_path / "perfscope.json"
    subprocess.run([sys.executable, str(script), str(expected_file), "--flag", "x"], check=True)
    argv_before, path_before, main_before = list(sys.argv), list(sys.path), sys.modules["__main__"]

    result = collect(str(script), [str(seen_file), "--flag", "x"], out_dir=tmp_path / "out")

    assert result.exit_code == 0
    expected, seen = json.loads(expected_file.read_text()), json.loads(seen_file.read_text())
    seen["argv"][1] = expected["argv"][1] = "<file>"
    assert seen == expected
    assert seen["name"] == "__main__" and seen["path0"] == str(sub.resolve())
    assert sys.argv == argv_before and sys.path == path_before
    assert sys.modules["__main__"] is main_before


def test_relative_out_dir_survives_a_script_that_changes_directory(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = loop_script(tmp_path, extra="pass")
    script.write_text(f"import os\nos.chdir({str(elsewhere)!r})\n" + script.read_text())
    monkeypatch.chdir(tmp_path)
    result = collect(script, [], out_dir=pathlib.Path("out"), schedule=SMALL)

    assert result.error is None
    assert result.trace_files == [tmp_path / "out" / "traces" / "rank0.pt.trace.json.gz"]
    assert result.trace_files[0].is_file() and not (elsewhere / "out").exists()
    assert result.run_info["cwd"] == str(tmp_path)  # read before the script ran
    assert os.getcwd() == str(tmp_path)  # and put back after it


def test_script_stream_changes_do_not_leak(tmp_path, monkeypatch):
    # Our own stdout/stderr on files, so the script may close them safely.
    out_file, err_file, log = tmp_path / "stdout.txt", tmp_path / "stderr.txt", tmp_path / "user.log"
    out_fd = os.open(out_file, os.O_WRONLY | os.O_CREAT)
    err_fd = os.open(err_file, os.O_WRONLY | os.O_CREAT)
    out = open(out_fd, "w", closefd=False)
    err = open(err_fd, "w", closefd=False)
    stdin = sys.stdin
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    script = write_script(
        tmp_path,
        f"""
        import io, sys
        sys.stdout = open({str(log)!r}, "w")   # redirected for good
        sys.stdin = io.StringIO("")
        print("to the user's log")
        sys.stderr.close()                     # and the real stderr closed
        raise ValueError("after closing stderr")
        """,
    )
    try:
        result = collect(script, [], out_dir=tmp_path / "out")
        assert sys.stdout is out and sys.stdin is stdin
        assert sys.stderr is not err and not sys.stderr.closed
        print("perfscope's report")
        print("perfscope's error", file=sys.stderr)
        sys.stdout.flush(); sys.stderr.flush()
    finally:
        for stream in (out, sys.stderr):
            stream.close()
        os.close(out_fd); os.close(err_fd)
    assert result.exit_code == 1 and "ValueError: after closing stderr" in result.error
    assert "perfscope" not in log.read_text()
    assert out_file.read_text() == "perfscope's report\n"
    # The script's traceback and perfscope's message reach the same file.
    err_text = err_file.read_text()
    assert "ValueError: after closing stderr" in err_text and err_text.endswith("perfscope's error\n")


def test_hooks_and_patches_are_removed_afterwards(tmp_path):
    import torch.optim.optimizer as optim_mod
    import torch.utils.data.dataloader as dataloader_mod
    from torch.nn.modules import module as module_mod

    from perfscope import control

    def state():
        return (
            dataloader_mod._BaseDataLoaderIter.__next__,
            torch.autograd.backward,
            torch.amp.GradScaler.step,
            len(optim_mod._global_optimizer_pre_hooks),
            len(optim_mod._global_optimizer_post_hooks),
            len(module_mod._global_forward_pre_hooks),
        )

    before = state()
    collect(loop_script(tmp_path, extra="if it == 4: raise KeyError('x')"), [],
            out_dir=tmp_path / "out", schedule=SMALL)  # fmt: skip
    collect(loop_script(tmp_path), [], out_dir=tmp_path / "out", schedule=SMALL)
    assert state() == before and control.active is None
