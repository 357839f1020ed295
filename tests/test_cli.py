"""The command line beyond bad input: exit codes, output directories, outputs a user can share."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from test_bad_input import good_trace, run_cli
from conftest import HANG_TIMEOUT_S  # noqa: E402

TRAIN = textwrap.dedent(
    """
    import sys, torch
    m = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    """
)


def write_script(path, body):
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize("code, expected", [("raise ValueError('early')", 1), ("sys.exit(5)", 5)])
def test_failure_before_the_window_exits_with_the_scripts_code(tmp_path, code, expected):
    script = write_script(tmp_path / "early.py", f"import sys\n{code}\n")
    r = run_cli(tmp_path, "profile", script, "--out", tmp_path / "out")
    assert r.returncode == expected, r.stderr
    assert "failed before a profiled step was recorded" in r.stderr
    assert "perfscope: error" not in r.stderr


def test_script_with_its_own_packages_of_perfscope_folders_names(tmp_path):
    # perfscope's folders reports/, tuner/, fused_ops/ are perfscope.reports, ...: the script's own
    # packages of those names (all three at once) are the script's, and perfscope's are untouched
    imports = ""
    for name in ("reports", "tuner", "fused_ops"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"def make():\n    return 'mine: {name}'\n")
        imports += f"import {name}\nassert {name}.make() == 'mine: {name}'\n"
    script = write_script(tmp_path / "train.py", imports + TRAIN)
    r = run_cli(tmp_path, "profile", script, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "report.html").is_file()
    # python -m perfscope puts the current directory (holding reports.py) first on sys.path
    r = run_cli(tmp_path, "analyze", tmp_path / "out" / "traces", "--out", tmp_path / "again")
    assert r.returncode == 0, r.stderr


def test_default_output_directories_are_never_shared(tmp_path):
    trace = good_trace(tmp_path / "t.json")
    outs = []
    for _ in range(3):  # within one second, most likely
        r = run_cli(tmp_path, "analyze", trace)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.strip().splitlines()[-1])
    assert len(set(outs)) == 3
    assert len(list((tmp_path / "perfscope-out").iterdir())) == 3


def test_relative_out_survives_a_script_changing_directory(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    write_script(tmp_path / "train.py", "import os\nos.chdir('elsewhere')\n" + TRAIN)
    r = run_cli(tmp_path, "profile", "train.py", "--out", "rel")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "rel" / "summary.json").is_file()
    assert list((tmp_path / "rel" / "traces").glob("rank0.pt.trace.json.gz"))


def test_outputs_are_readable_like_other_files(tmp_path):
    r = run_cli(tmp_path, "analyze", good_trace(tmp_path / "t.json"), "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    umask = os.umask(0)
    os.umask(umask)
    for name in ("summary.json", "report.html"):
        mode = stat.S_IMODE((tmp_path / "out" / name).stat().st_mode)
        assert mode == 0o666 & ~umask


def test_non_trace_json_in_a_directory_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "d").mkdir()
    good_trace(tmp_path / "d" / "rank0.pt.trace.json.gz")
    (tmp_path / "d" / "config.json").write_text(json.dumps({"lr": 0.1}))
    r = run_cli(tmp_path, "analyze", tmp_path / "d", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any("config.json" in w for w in summary["warnings"])
    assert [t["worker"] for t in summary["traces"]] == ["rank0"]


def test_internal_errors_are_one_line(tmp_path):
    # a bug inside perfscope (simulated) must not dump a traceback on the user
    code = (
        "import sys, perfscope.cli as c, perfscope.analysis.run as r\n"
        "def boom(*a, **k): raise ZeroDivisionError('simulated')\n"
        "r.analyze_files = boom\n"
        "sys.exit(c.main(['analyze', sys.argv[1], '--out', sys.argv[2]]))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(good_trace(tmp_path / "t.json")), str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith("perfscope: internal error: ZeroDivisionError: simulated")


def test_every_commands_help_says_what_it_writes_and_points_to_the_docs(capsys):
    from perfscope.cli import main

    for command, writes in (("profile", "summary.json"), ("analyze", "summary.json"), ("report", "report.html"),
                            ("diff", "Writes"), ("tune", "tune.json"), ("forecast", "forecast.json"),
                            ("check", "--junit"), ("merge", "merged.perfscope-view")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert writes in out and "docs/" in out, (command, out[-400:])
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "io-bound" in out and "compute-bound" in out and "docs/metrics.md" in out


def test_merge_replaces_only_its_own_view_unless_forced(tmp_path):
    from test_bad_input import assert_one_line_error, good_trace

    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        good_trace(traces / f"rank{rank}.json", rank=rank)
    other = tmp_path / "other_run" / "summary.json"
    other.parent.mkdir()
    other.write_text('{"mode": "cpu"}')
    r = run_cli(tmp_path, "merge", traces, "--out", other)
    assert_one_line_error(r)
    assert "is not a view perfscope merge wrote; not replaced (give --force" in r.stderr
    assert other.read_text() == '{"mode": "cpu"}'  # another run's summary kept
    view = tmp_path / "view.json.gz"
    assert run_cli(tmp_path, "merge", traces, "--out", view).returncode == 0
    r = run_cli(tmp_path, "merge", traces, "--out", view)  # its own view: replaced as before
    assert r.returncode == 0 and "replaced" in r.stdout, r.stderr
    r = run_cli(tmp_path, "merge", traces, "--out", other, "--force")
    assert r.returncode == 0 and other.read_bytes()[:2] == b"\x1f\x8b", r.stderr


def test_help_loads_neither_the_analysis_nor_the_record_nor_the_charts():
    """`perfscope --help` (and a refused command) starts without the heavy modules: what it prints
    needs none of them."""
    code = ("import sys\nfrom perfscope.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = ('pandas', 'matplotlib', 'scipy', 'torch', 'perfscope.record.schema', 'perfscope.check.decide',"
            " 'perfscope.analysis')\nprint(sorted(m for m in sys.modules if m.startswith(heavy)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]
