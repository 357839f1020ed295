"""Hostile and malformed input from the hardening pass: names that carry terminal escapes, YAML
alias bombs, hand-edited summaries, wrong objects given to ``accelerate``, runaway counts and knob
values. Each ends in escaped text or one clear error line, never a forged line, a hang or an
internal error."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from tracegen import launch, step, write_trace

import perfscope
from perfscope.cli import main
from perfscope.console import format_summary, format_warnings
from perfscope.errors import PerfscopeError
from perfscope.runtime.config import ConfigError, load_config
from conftest import HANG_TIMEOUT_S  # noqa: E402

# Escape sequences (retitle the terminal, clear the screen), a carriage return, a newline that
# would start a forged verdict line, and a right-to-left override.
HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\r\n verdict: forged\u202e"
# Every C0/C1 control but the line's own newline, and the bidi controls.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
FORGED = re.compile(r"^\s*(verdict|advice|perfscope: error): forged")
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "hta"


def _assert_terminal_safe(text: str) -> None:
    assert not RAW_CONTROL.search(text), repr(text)
    for line in text.split("\n"):
        assert not FORGED.match(line), repr(line)


def _run(capsys, *argv, context=None) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    out, err = capsys.readouterr()
    _assert_terminal_safe(out)
    _assert_terminal_safe(err)
    assert "Traceback" not in err and "internal error" not in err, (context, err)
    return rc, out, err


def _rank_trace(path: Path, rank: int, kernel: str = "gemm") -> Path:
    events = []
    for i in range(3):
        n, t0 = 1 + i, 100 * i
        events += [step(n, t0, 100), *launch(kernel, t0 + 1, t0 + 5, 90, correlation=n)]
    return write_trace(path, events, distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2})


# --- 7: terminal injection ---------------------------------------------------------------------


def test_hostile_names_reach_the_terminal_escaped_in_analyze_report_and_diff(tmp_path, capsys):
    runs = tmp_path / f"runs{HOSTILE}"
    runs.mkdir()
    for rank in (0, 1):
        _rank_trace(runs / f"rank{rank}{HOSTILE}.pt.trace.json", rank, kernel=f"gemm{HOSTILE}")
    (runs / f"bad{HOSTILE}.json").write_text("{bad")
    out = tmp_path / f"out{HOSTILE}"
    rc, stdout, err = _run(capsys, "analyze", runs, "--out", out)
    assert rc == 0 and stdout.count("\nverdict: ") == 1 and "wrote " in stdout and "skipped bad" in err
    rc, stdout, _ = _run(capsys, "report", out, "--out", tmp_path / f"r{HOSTILE}.html")
    assert rc == 0 and stdout.startswith("wrote ")
    rc, stdout, _ = _run(capsys, "diff", out, out / "summary.json", "--out", tmp_path / f"d{HOSTILE}.html")
    assert rc == 0 and sum(line.startswith("verdict:") for line in stdout.splitlines()) == 1


def test_errors_about_hostile_paths_are_one_escaped_line(tmp_path, capsys):
    for argv in (["report", tmp_path / f"missing{HOSTILE}"], ["analyze", tmp_path / f"no{HOSTILE}.json"],
                 ["profile", tmp_path / f"train{HOSTILE}.py"], ["diff", tmp_path / f"a{HOSTILE}", tmp_path]):
        rc, _, err = _run(capsys, *argv)
        assert rc == 2 and len(err.strip().split("\n")) == 1 and err.startswith("perfscope: error: "), err


def test_hostile_arguments_in_usage_errors_are_escaped(tmp_path, capsys):
    rc, _, err = _run(capsys, "analyze", tmp_path, f"--bogus{HOSTILE}")
    assert rc == 2 and "unrecognized arguments" in err
    rc, _, err = _run(capsys, "report", tmp_path, "--step", f"x{HOSTILE}")
    assert rc == 2 and "--step" in err


def test_summary_text_fields_cannot_forge_table_lines(tmp_path):
    summary = copy.deepcopy(_synthetic_summary(tmp_path))
    o = summary["overall"]
    o["advice"] = f"relax{HOSTILE}"
    summary["steps"][0]["verdict"] = f"io-bound{HOSTILE}"
    summary["steps"][0]["rank"] = f"0{HOSTILE}"
    summary["notes"] = [f"note{HOSTILE}"]
    summary["details"]["straggler"] = {"rank": 1, "steps_last": 2, "steps": 3, "basis": f"b{HOSTILE}"}
    # a class name and a rank hold no text: a record with text there is refused, not printed
    bad_runner_up, bad_rank = copy.deepcopy(summary), copy.deepcopy(summary)
    bad_runner_up["overall"]["runner_up"] = f"launch-bound{HOSTILE}"
    bad_rank["details"]["straggler"]["rank"] = f"1{HOSTILE}"
    for bad, field in ((bad_runner_up, "overall.runner_up"), (bad_rank, "details.straggler.rank")):
        with pytest.raises(PerfscopeError, match=f"malformed summary: {field}"):
            format_summary(bad)
    text = format_summary(summary)
    _assert_terminal_safe(text)
    assert sum(line.startswith("verdict:") for line in text.split("\n")) == 1
    _assert_terminal_safe("\n".join(format_warnings({"warnings": [f"w{HOSTILE}"]})))


# --- 8: YAML alias bombs and long values in configuration errors -------------------------------


def test_yaml_aliases_are_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("num_workers: &n 2\nprefetch_factor: *n\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "anchors.yaml" in message and "line 1" in message and "alias" in message and "\n" not in message


def test_a_yaml_alias_bomb_ends_in_a_short_error(tmp_path):
    # 10 levels of ten aliases each would expand to 10**10 strings; 5 are enough to show the
    # expansion (100,000 strings) reaching the message
    levels = ["&l0 [" + ", ".join(["lol"] * 10) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 5)]
    path = tmp_path / "bomb.yaml"
    path.write_text("num_workers: [" + ", ".join(levels) + "]\n")
    assert path.stat().st_size < 600
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert len(str(e.value)) < 400 and "bomb.yaml" in str(e.value)


def test_configuration_files_have_a_size_bound(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * 200_000 + "num_workers: 2\n")
    with pytest.raises(ConfigError, match="huge.yaml.*too large"):
        load_config(path)


@pytest.mark.parametrize("text, expected", [
    ("[" * 5000 + "]" * 5000, "nested too deeply"),  # the composer recurses once per level
    ("- 1\n- 2\n", "mapping"),
    ("1: 2\nfoo: 3\n", "unknown config key"),  # a number and a text key: sorted together once failed
    (b"num_workers: \xff\xfe\n", "not valid YAML"),
    ("0\n", "mapping"),  # not an empty configuration
])
def test_odd_configuration_files_are_one_line_config_errors_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "odd.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "odd.yaml" in str(e.value) and expected in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("data", [
    {"num_workers": "x" * 100_000},
    {"amp_level": ["O1"] * 50_000},
    {"k" * 100_000: 1},
    {f"key{i}": 1 for i in range(10_000)},
])
def test_configuration_errors_shorten_long_values(data):
    with pytest.raises(ConfigError) as e:
        load_config(data)
    assert len(str(e.value)) < 600


EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "io_bound.py")
SHADOW_LIKE = ("root:$6$Zq9saltsalt$hashHASHhash0123456789:19000:0:99999:7:::\n"
               "daemon:*:19000:0:99999:7:::\nwebapp:$y$j9T$Yx7secretpart:19001:0:99999:7:::\n")


@pytest.mark.parametrize("text", [
    SHADOW_LIKE,
    "DATABASE_URL=postgresql://app:Zq9secret@db/app\nAPI_TOKEN=Zq9token\n",  # an .env file: one string
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktZZq9\n-----END OPENSSH PRIVATE KEY-----\n",
    '{"Zq9 a sentence, not a key": 1}',  # JSON is YAML: a mapping whose key is not a name
])
def test_a_file_that_is_not_a_configuration_is_never_echoed(capsys, tmp_path, text):
    path = tmp_path / "notes.txt"
    path.write_text(text)
    code, out, err = _run(capsys, "profile", EXAMPLE, "--config", str(path))
    assert code == 2 and not out
    assert err.startswith(f"perfscope: error: not a configuration file: {path}") and err.count("\n") == 1, err
    said = err.replace(str(path), "PATH")
    assert "Zq9" not in said and "root" not in said and "daemon" not in said, err


def test_unknown_keys_are_named_short_and_values_never(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("db_password: Zq9hunter2\n" + "k" * 60 + ": 1\nnum_workers: Zq9value\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    said = str(e.value)
    assert "'db_password'" in said and "k" * 60 not in said and "kkk..." in said and "Zq9" not in said, said
    path.write_text("num_workers: Zq9value\n")
    with pytest.raises(ConfigError, match="config key 'num_workers': got a string, allowed") as e:
        load_config(path)
    assert "Zq9" not in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_config_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    import os
    import subprocess
    import sys

    path = {"fifo": tmp_path / "config.yaml", "device": Path("/dev/zero"), "folder": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: reading would wait for ever
    done = subprocess.run([sys.executable, "-m", "perfscope", "profile", EXAMPLE, "--config", str(path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"perfscope: error: not a configuration file: {path} (not a regular file)\n"


@pytest.mark.parametrize("argv", [
    ["report", "{run}"], ["diff", "{run}", "{run}"], ["check", "{run}", "--baseline", "{run}"],
    ["forecast", "{run}", "--nodes", "2", "--ranks-per-node", "2", "--inter-node", "10Gbit"],
], ids=["report", "diff", "check", "forecast"])
def test_a_summary_past_its_bound_is_one_line_and_not_read(capsys, tmp_path, monkeypatch, argv):
    from perfscope import atomic

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_bytes(b"{" + b" " * 4096 + b"}")
    monkeypatch.setattr(atomic, "MAX_RECORD_BYTES", 1024)
    code, out, err = _run(capsys, *[a.format(run=run) for a in argv])
    assert code != 0 and err.count("\n") == 1, err
    assert f"{run / 'summary.json'}: 4,098 bytes, more than the 1,024 a record of perfscope's holds; not read" in err


# --- 13: wrong objects for accelerate, malformed summaries ------------------------------------


def _mlp():
    from torch import nn

    return nn.Linear(2, 2)


@pytest.mark.parametrize("make, name", [
    (lambda: ("not a model", None, None, {}), "model"),
    (lambda: (_mlp(), "sgd", None, {}), "optimizer"),
    (lambda: (_mlp(), None, 42, {}), "loader"),
    (lambda: ("not a model", None, None, None), "model"),
])
def test_accelerate_names_the_argument_of_the_wrong_type(make, name):
    model, optimizer, loader, config = make()
    with pytest.raises(TypeError) as e:
        perfscope.accelerate(model, optimizer, loader, config=config)
    assert name in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("config", [42, 3.5, ["num_workers", 2], b"best.yaml"])
def test_a_configuration_of_the_wrong_type_is_a_config_error(config):
    with pytest.raises(ConfigError, match="config"):
        perfscope.accelerate(_mlp(), config=config)


_SUMMARIES: dict = {}


def _synthetic_summary(tmp_path) -> dict:
    if "synthetic" not in _SUMMARIES:
        tmp_path.mkdir(parents=True, exist_ok=True)
        _rank_trace(tmp_path / "rank0.pt.trace.json", 0)
        _rank_trace(tmp_path / "rank1.pt.trace.json", 1)
        _SUMMARIES["synthetic"] = json.loads(json.dumps(perfscope.analyze(tmp_path).summary()))
    return _SUMMARIES["synthetic"]


def _summary(kind: str, tmp_path) -> dict:
    if kind == "synthetic":
        return _synthetic_summary(tmp_path)
    path = SHARED / kind
    if not path.exists():
        pytest.skip(f"{path} is missing (the shared real traces)")
    if kind not in _SUMMARIES:
        _SUMMARIES[kind] = json.loads(json.dumps(perfscope.analyze(path).summary()))
    return _SUMMARIES[kind]


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree[k]
    tree[path[-1]] = value


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list) and value:
        yield from _leaves(value[0], (*path, 0))  # the first element stands for its list
    else:
        yield path


@pytest.mark.parametrize("where, value", [
    (("steps", 0, "step_time_us"), "abc"),
    (("overall", "fractions", "io"), "abc"),
    (("overall", "step_share", "io-bound"), 1e308),
    (("overall", "median_step_time_us"), -5.0),
    (("overall", "verdict"), "io-bound\nverdict: forged"),
    (("steps",), {"0": {}}),
    (("details", "ranks"), {"rank": 0}),
    (("steps", 0, "rank"), [0]),
    (("data_quality",), [{"action": "dropped", "reason": "x", "count": 1, "examples": {"k": "abc"}}]),
])
def test_a_mistyped_summary_is_a_malformed_summary(tmp_path, capsys, where, value):
    summary = copy.deepcopy(_synthetic_summary(tmp_path / "src"))
    _set(summary, where, value)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    field = ".".join(str(k) for k in where if not isinstance(k, int))
    for argv in (["report", path, "--out", tmp_path / "r.html"], ["diff", path, path, "--out", tmp_path / "d.html"]):
        rc, _, err = _run(capsys, *argv)
        assert rc == 2 and "malformed summary" in err and field.split(".")[-1] in err, err


@pytest.mark.parametrize("number", ["1e999", "-1e999", "Infinity", "NaN"])
def test_a_summary_with_an_infinite_number_is_an_error(tmp_path, capsys, number):
    text = json.dumps(_synthetic_summary(tmp_path / "src")).replace('"step_time_us": 100.0', f'"step_time_us": {number}', 1)
    assert number in text
    path = tmp_path / "summary.json"
    path.write_text(text)
    rc, _, err = _run(capsys, "report", path, "--out", tmp_path / "r.html")
    assert rc == 2 and "malformed summary" in err


@pytest.mark.parametrize("kind", ["synthetic", "two_ranks", "cpu_only_rank34.pt.trace.json.gz"])
def test_fuzzed_summaries_never_end_in_an_internal_error(tmp_path, capsys, kind):
    original = copy.deepcopy(_summary(kind, tmp_path / "src"))
    for t in original.get("traces") or []:
        t["path"] = str(tmp_path / "gone.json")  # the timeline then needs no parse per mutation
    base = tmp_path / "base.json"
    base.write_text(json.dumps(original))
    path = tmp_path / "summary.json"
    sections = [(k,) for k in ("run", "overall", "details", "steps", "traces", "skipped", "notes", "warnings",
                               "data_quality")]
    bad = ("abc", None, [], {"x": 1}, -1, 1e308, True, 0)
    for i, where in enumerate([*_leaves(original), *sections]):
        for value in (bad[i % 8], bad[(i + 3) % 8], bad[(i + 5) % 8]):  # three per field, every one in turn
            mutated = copy.deepcopy(original)
            _set(mutated, where, value)
            path.write_text(json.dumps(mutated))
            for argv in (["report", path, "--out", tmp_path / "r.html"],
                         ["diff", base, path, "--out", tmp_path / "d.html"]):
                rc, _, err = _run(capsys, *argv, context=(argv[0], where, value))  # no internal error
                assert rc in (0, 2), (where, value, err)


# --- 14: runaway counts and knob values --------------------------------------------------------


def test_many_skipped_files_are_summarised_and_other_warnings_still_shown():
    skipped = [{"path": f"t{i}.json", "reason": f"t{i}.json: not a trace", "damaged": False} for i in range(1000)]
    summary = {"skipped": skipped, "warnings": [f"skipped {s['reason']}" for s in skipped] + ["GPU events lost"]}
    lines = format_warnings(summary)
    assert len(lines) <= 8, lines
    assert any("GPU events lost" in line for line in lines)
    assert any("997 more" in line and "Data quality" in line for line in lines)


def test_a_directory_with_many_bad_files_prints_a_few_lines(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    _rank_trace(tmp_path / "runs" / "rank0.pt.trace.json", 0)
    for i in range(40):
        (tmp_path / "runs" / f"bad{i}.json").write_text('{"other": 1}')
    rc, _, err = _run(capsys, "analyze", tmp_path / "runs", "--out", tmp_path / "out")
    assert rc == 0 and len(err.strip().split("\n")) <= 8, err
    assert "37 more" in err


@pytest.mark.parametrize("key, value, good", [
    ("num_workers", 10**12, 1024),
    ("prefetch_factor", 10**6, 128),
    ("bucket_cap_mb", 1e12, 10240.0),
    ("grad_accum_steps", 10**9, 1024),
])
def test_numeric_knobs_have_a_documented_range(key, value, good):
    extra = {"num_workers": 2} if key == "prefetch_factor" else {}
    with pytest.raises(ConfigError) as e:
        load_config({key: value, **extra})
    assert key in str(e.value) and str(good).removesuffix(".0") in str(e.value)
    assert getattr(load_config({key: good, **extra}), key) == good
    doc = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text()
    assert re.search(rf"`{key}` \|[^|]*{re.escape(str(good).removesuffix('.0'))}", doc), f"{key}'s range in docs/runtime.md"


def test_a_configuration_key_given_twice_is_refused_naming_the_line(tmp_path):
    from perfscope.runtime.config import ConfigError, load_config

    path = tmp_path / "twice.yaml"
    path.write_text("num_workers: 2\npin_memory: true\nnum_workers: 4\n")
    with pytest.raises(ConfigError, match=r"line 3: config key 'num_workers' is given twice"):
        load_config(path)
