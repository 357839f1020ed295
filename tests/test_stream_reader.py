"""The streaming trace reader (:func:`perfscope.trace.load.read_table`) gives exactly the table of
the whole-file read (:func:`perfscope.trace.reader.read_trace` then
:func:`perfscope.trace.assemble.build_table`) -- or the same exception, type and message -- whatever
the batch size (cuts between events, inside events, inside strings), serial or with a process
pool: on the real traces, on the damaged files the other tests build, on random events through
both decoders, and on texts made to trip a cutter (see streamkit.py). Where a text is clean JSON
that the stream should read itself, the tests also check that it was not read whole instead
(``must_stream``, :class:`streamkit.FallbackSpy`): the result would be the same, the memory not.

The one intended difference: a value the stream does not read (a number past a float's range in
an unknown ``args`` key) is skipped by msgspec, so the whole-file read's "repaired" entry for it
is absent (:func:`test_a_huge_number_in_a_field_not_read_differs_only_by_the_repaired_entry`).
"""


from __future__ import annotations

import gzip
import json
from concurrent.futures import ProcessPoolExecutor

import pytest
from rawtrace import A100, FILES, NW4
from streamkit import (
    SMALL_BATCHES, event_x, FallbackSpy, assert_same_result, assert_same_table, assert_streams_same, new_read,
    old_read, write,
)
from test_bad_input import GZIP_HEADER
from test_trace_cases_damaged import _many_steps
from test_trace_cases_repair import _gpu_events, corrupt_in_the_middle
from test_trace_fuzz import _base, _mutants
from tracegen import cpu_op, kernel, launch, runtime, step, trace_bytes

from perfscope.trace.table import TraceTable


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as p:
        yield p


# ================================================================ 1. the real traces

BIG = 4 << 20  # text bytes: past this, only the cheaper batch sizes (1,000-byte batches of 35 MB take 20 s)


@pytest.mark.parametrize("name", FILES)
def test_a_real_trace_streams_the_same_table(shared_traces, pool, name):
    path = shared_traces / name
    raw = path.read_bytes()
    size = len(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    expected = old_read(path)
    assert isinstance(expected, TraceTable) and expected.n_events > 0
    if size <= BIG:
        serial, pooled = (None, 1_000, 7_777, 65_536), (None, 1_000, 65_536)
    else:  # 7,777-byte batches on one big file of each format (2021 and current): 5,000 cuts each
        serial, pooled = (None, 65_536) + ((7_777,) if name in (A100, NW4) else ()), (65_536,)
    with FallbackSpy() as spy:
        assert_streams_same(path, serial, expected=expected)
        for b in pooled:
            kw = {} if b is None else {"batch_bytes": b}
            assert_same_result(expected, new_read(path, pool=pool, **kw), f"{name} pooled batch_bytes={b}")
    assert spy.calls == [], "a clean real trace was read whole instead of streamed"


def test_a_real_trace_reports_progress_up_to_its_size(shared_traces):
    path = shared_traces / "hta/amd_mi250_rocm_train.json.gz"
    seen = []
    assert_same_table(old_read(path), new_read(path, batch_bytes=1_000, progress=seen.append), "progress")
    assert seen and seen == sorted(seen) and seen[-1] == path.stat().st_size


# ================================================================ 2. the damaged files of the other tests


def _repair_cases() -> dict[str, bytes]:
    """The damaged texts of test_trace_cases_repair.py / _damaged.py / _hostile.py / test_bad_input.py."""
    gpu = trace_bytes(_gpu_events())
    text = gpu.decode()
    win = ['C:\\Users\\me\\train.py(12): forward', 'C:\\temp\\new.py(3): <module>']
    py = ",\n".join("  " + json.dumps({"ph": "X", "cat": "python_function", "name": n, "pid": 100, "tid": 1,
                                        "ts": 20 + k, "dur": 1}).replace("\\\\", "\\") for k, n in enumerate(win))
    nan_events = _gpu_events() + [event_x("aten::nan", 30, float("nan"))]
    meta = {"distributedInfo": {"rank": 3, "world_size": 8}, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100", "bw": float("inf")}]}
    nan_text = ("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in meta.items())
                + '  "traceEvents": [\n' + ",\n".join("  " + json.dumps(e) for e in nan_events) + "\n  ]\n}\n")
    deep = ('{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 100, "tid": 1, "ts": 5, "dur": 1, "args": {"x": '
            + "[" * 1500 + "]" * 1500 + "}}")
    deep_text = trace_bytes(_gpu_events(), distributedInfo={"rank": 1, "world_size": 2}).decode().replace(
        '  "traceEvents": [\n', '  "traceEvents": [\n  ' + deep + ",\n")
    lines = gpu.split(b"\n")
    k = next(i for i, line in enumerate(lines) if b'"k2"' in line)
    lines[k] = lines[k].replace(b'"k2"', b'@"k2"', 1)
    three = []
    for n in range(3):
        three += [step(n + 1, 100 * n, 100), *launch("gemm", 100 * n + 1, 100 * n + 10, 50, correlation=n + 1)]
    three = trace_bytes(three)
    few = trace_bytes(_many_steps(3), schemaVersion=1)
    braces = trace_bytes([step(1, 0, 100), cpu_op("aten::mm", 0, 90), step(2, 100, 100), cpu_op("aten::mm", 100, 90)])
    tail = b',\n  {"ph": "X", "cat": "cpu_op", "name": "aten::x", "args": {"Input Dims": [' + b'{"a": 1}, ' * 70
    hostile = [step(1, 0, 100), cpu_op("aten::mm", 0, 90)]
    k_no_dur = kernel("gemm", 10, 50, correlation=1)
    del k_no_dur["dur"]
    win_clean = trace_bytes(hostile + [event_x("C:\\new\\tmp\\train.py(1): f", 5, 1, cat="python_function")]).replace(
        b"C:\\\\new\\\\tmp\\\\train", b"C:\\new\\tmp\\train")
    huge = trace_bytes(hostile + [cpu_op("aten::huge", 5, 1)]).replace(
        b'"aten::huge", "pid": 100, "tid": 1, "ts": 5', b'"aten::huge", "pid": 100, "tid": 1, "ts": 1e400')
    return {
        "na-value": gpu.replace(b'"correlation": 1}', b'"correlation": 1, "bandwidth (GB/s)": N/A}', 1),
        "windows-raw-backslashes": text.replace('  "traceEvents": [\n', '  "traceEvents": [\n' + py + ",\n").encode(),
        "control-characters": gpu.replace(b'"name": "gemm"', b'"name": "ge\x01m\tm"', 1),
        "latin1-name": gpu.replace(b'"name": "k2"', b'"name": "k2 10\xb5s"', 1),
        "nan-infinity-header": nan_text.encode(),
        "nested-past-the-depth": deep_text.encode(),
        "stray-byte": b"\n".join(lines),
        "truncated-in-last-kernel": three[: three.rfind(b'"name": "gemm"')],
        "truncated-in-last-event": few[: few.rfind(b'"name"') + 3],
        "truncated-after-many-braces": braces[: braces.rfind(b"\n  ]")] + tail,
        "zero-bytes-after": gpu + b"\x00" * 4096,
        "html": b"<html>oops</html>",
        "garbage": b"\x00\x01\x02 not a trace \xff",
        "hello": b"hello",
        "at-sign": b'{"traceEvents": [@]}',
        "empty-file": b"",
        "spaces-only": b"  \n\t ",
        "empty-trace": b'{"traceEvents": []}',
        "metadata-only": trace_bytes([
            {"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}}]),
        "ts-string-and-null": trace_bytes([step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1),
                                           event_x(ts="abc"), event_x(ts=None)]),
        "args-not-an-object": trace_bytes([step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1),
                                           event_x("gemm", 20, 5, pid=0, tid=7, cat="kernel", args="oops")]),
        "out-of-range-values": trace_bytes([
            step(1, 0, 100), cpu_op("aten::mm", 10, 50), cpu_op("aten::huge_dur", 20, 1e17),
            cpu_op("aten::far_future", 1e16, 5),
            {"ph": "X", "cat": ["odd"], "name": ["odd"], "pid": 100, "tid": 1, "ts": 30, "dur": 5}]),
        "list-as-ph": trace_bytes(hostile + [{"ph": [], "name": "x"}, {"ph": {"a": 1}}]),
        "no-dur": trace_bytes(hostile + [runtime("cudaLaunchKernel", 2, 1, correlation=1), k_no_dur]),
        "float-correlation": trace_bytes(hostile + launch("k", 2, 10, 50, correlation=1.5)),
        "shared-correlation": trace_bytes(
            hostile + [e for i in range(4) for e in launch("k", 10 + 200 * i, 50 + 200 * i, 100, correlation=1)]),
        "name-an-object": trace_bytes(hostile + [event_x({"x": "ProfilerStep#2"}, 5, 1)]),
        "windows-path-in-a-clean-file": win_clean,
        "far-event": trace_bytes([step(1, 1e12, 100), cpu_op("aten::mm", 1e12, 90), cpu_op("aten::far", -3.9e15, 1)]),
        "ts-1e400": huge,
        "copies": trace_bytes(hostile + launch("gemm", 20, 30, 20, correlation=5) + hostile
                              + launch("gemm", 20, 30, 20, correlation=5)),
        "negative-absurd-zeroed": trace_bytes([
            step(1, 0, 100), cpu_op("aten::mm", 10, 40), cpu_op("aten::negative", 60, -30),
            cpu_op("aten::absurd", 60, 3 * 86_400e6), event_x("aten::lost", 0, 0)]),
    }


def _gzip_cases() -> dict[str, bytes]:
    many = gzip.compress(trace_bytes(_many_steps(200), schemaVersion=1))
    hostile = trace_bytes([step(1, 0, 100), cpu_op("aten::mm", 0, 90)])
    return {
        "gzip-cut-at-3/5": many[: len(many) * 3 // 5],
        "gzip-zeroed-in-the-middle": corrupt_in_the_middle(),
        "gzip-garbage": b"\x1f\x8b\x08\x00garbage",
        "gzip-invalid-deflate": GZIP_HEADER + b"\xff" * 64,
        "gzip-then-junk": gzip.compress(hostile) + b"junk",
    }


@pytest.mark.parametrize("case", sorted(_repair_cases()))
def test_a_damaged_case_of_the_other_tests_gives_the_same_result(tmp_path, case):
    path = write(tmp_path / "t.json", _repair_cases()[case])
    assert_streams_same(path, (None, 1, 64, 1_000))


@pytest.mark.parametrize("case", sorted(_gzip_cases()))
def test_a_damaged_gzip_case_of_the_other_tests_gives_the_same_result(tmp_path, case):
    path = write(tmp_path / "t.json.gz", _gzip_cases()[case])
    assert_streams_same(path, (None, 100, 7_777))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_mutants_of_the_fuzz_test_give_the_same_result(tmp_path, seed):
    failed = []
    for k, (kind, text) in enumerate(_mutants(seed, 150)):
        path = write(tmp_path / f"m{k}.json", text)
        try:
            assert_streams_same(path, (None, 1, 64))
        except AssertionError as e:
            failed.append(f"{kind} #{k}: {str(e)[:400]}")
    assert not failed, f"{len(failed)} of 150 mutants differ:\n" + "\n".join(failed[:5])


def test_the_fuzz_base_trace_streams_without_the_whole_file_read(tmp_path):
    path = write(tmp_path / "t.json", _base())
    with FallbackSpy() as spy:
        assert_streams_same(path, SMALL_BATCHES)
    assert spy.calls == []


def test_a_damaged_case_gives_the_same_result_with_a_pool(tmp_path, pool):
    cases = _repair_cases()
    for case in ("truncated-after-many-braces", "stray-byte", "nested-past-the-depth", "copies", "na-value"):
        path = write(tmp_path / f"{case}.json", cases[case])
        assert_streams_same(path, (None, 1, 64), pool=pool)


