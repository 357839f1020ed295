"""Collection runs refused before the script starts: a script path that is no Python file, an
output folder that cannot be written, and an invalid profiling schedule."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from collectkit import write_script

from perfscope.collect import CollectError, ProfileSchedule, collect
from perfscope.errors import PerfscopeError


def test_bad_script_paths_raise_collect_error(tmp_path):
    (tmp_path / "notes.txt").write_text("print(1)")
    for bad in [tmp_path / "missing.py", tmp_path / "notes.txt", tmp_path]:
        with pytest.raises(CollectError):
            collect(bad, [], out_dir=tmp_path / "out")
    assert issubclass(CollectError, PerfscopeError)


def test_unwritable_out_dir_raises_before_running(tmp_path):
    marker = tmp_path / "ran"
    script = write_script(tmp_path, f"open({str(marker)!r}, 'w')\n")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(CollectError, match="cannot write to output directory"):
        collect(script, [], out_dir=blocker / "out")
    assert not marker.exists()


@pytest.mark.parametrize(
    "kwargs",
    [{"active": 0}, {"skip_first": -1}, {"warmup": 1.5}, {"active": True}, {"max_steps": 3}],
)
def test_schedule_validation(kwargs):
    field = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"ProfileSchedule.{field} must be") as info:
        ProfileSchedule(**kwargs)
    assert isinstance(info.value, PerfscopeError)  # the CLI prints it as one line


def test_schedule_stop_rule():
    assert ProfileSchedule().stop_after == 10
    assert ProfileSchedule(max_steps=0).stop_after is None
    assert ProfileSchedule(max_steps=50).stop_after == 50
