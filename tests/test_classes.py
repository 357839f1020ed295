"""The bottleneck classes are one table (perfscope/classes.py): the verdict, the partition's costs,
the step time's what-ifs and every renderer take them from it, and a class added to the table is
one every consumer knows (a consumer with its own list fails here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfscope import classes, steptime
from perfscope.analysis import partition, verdict
from perfscope.reports import palette
from perfscope.reports.sections import verdict as verdict_section
from conftest import HANG_TIMEOUT_S  # noqa: E402


def test_every_consumer_names_exactly_the_tables_classes():
    names = [c.name for c in classes.TABLE]
    assert list(verdict.CLASSES) == names and set(verdict.VERDICTS) == set(names)
    removable = [c.name for c in classes.TABLE if c.removable]
    assert list(steptime.REMOVABLE) == removable and set(verdict.THRESHOLDS) == set(removable)
    for mode in classes.MODES:
        assert set(verdict.COSTS[mode]) == {*names, "other"}
        assert {c for c, m in verdict.ADVICE if m == mode} == set(names)
        assert {c for c, m in verdict_section.MEANING if m == mode} == set(names)
        assert {c for c, m in verdict_section.REMOVAL if m == mode} == set(removable)
    assert set(verdict_section.TITLE) == set(names)
    assert set(palette.CLASS_COLOURS) == set(palette.CLASS_ORDER) == {*names, "other"}


@pytest.mark.parametrize(("mode", "parts"), [("gpu", partition.GPU_PARTS), ("cpu", partition.CPU_PARTS)])
def test_the_classes_costs_are_the_partitions_parts_each_counted_once(mode, parts):
    owned = [col for cols in verdict.COSTS[mode].values() for col in cols]
    assert sorted(owned) == sorted(f"{p}_us" for p in parts)
    drawn = [col for _, _, _, cols in palette.parts(mode) for col in cols]
    assert sorted(drawn) == sorted(owned)
    for _, label, _, cols in palette.parts(mode):  # each drawn part names the class that owns it
        owner = next(c for c, mine in verdict.COSTS[mode].items() if set(cols) <= set(mine))
        assert owner in label or label.startswith(owner), (label, owner)


def test_a_class_added_to_the_table_reaches_every_consumer():
    # In a process of its own: the table is extended before any consumer is imported.
    code = textwrap.dedent("""
        import dataclasses, sys
        import perfscope.classes as classes
        extra = dataclasses.replace(classes.BY_NAME["comm"], name="storage", colour="blue", chart_order=5,
                                    title="Read checkpoints less often")
        classes.TABLE = (*classes.TABLE, extra)
        classes.derive()
        import test_classes
        test_classes.test_every_consumer_names_exactly_the_tables_classes()
        from perfscope.analysis import verdict
        from perfscope.reports import palette
        assert "storage" in verdict.CLASSES and palette.CLASS_COLOURS["storage"] == palette.BLUE
        print("ok")
    """)
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT_S, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("op, told", [("aten::linear", False), ("aten::conv2d", True)])
def test_channels_last_is_advised_only_where_convolutions_ran(tmp_path, op, told):
    from tracegen import cpu_op, step
    from tracekit import analyze

    events = []
    for n in range(3):
        events += [step(n + 1, 1000 * n, 1000), cpu_op(op, 1000 * n + 5, 990)]
    a = analyze(tmp_path, events)
    assert a.verdict.verdict == "compute-bound"
    assert ("channels_last" in a.verdict.advice) is told, a.verdict.advice
    assert a.verdict.advice.startswith("Make the math cheaper: bf16 autocast on CPU")
    assert a.summary()["details"]["facts"]["convolutions"] is told
