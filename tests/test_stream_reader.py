"""The streaming trace reader (:func:`perfscope.trace.load.read_table`) gives exactly the table of
the whole-file read (:func:`perfscope.trace.reader.read_trace` then
:func:`perfscope.trace.table.build_table`) -- or the same exception, type and message -- whatever
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
import random
import re
from concurrent.futures import ProcessPoolExecutor

import msgspec
import orjson
import pytest
from rawtrace import A100, FILES, NW4
from streamkit import (
    FallbackSpy, assert_same_batch, assert_same_result, assert_same_table, assert_streams_same, describe, new_read,
    old_read, write,
)
from test_bad_input import GZIP_HEADER
from test_trace_cases_damaged import _many_steps
from test_trace_cases_repair import _gpu_events
from test_trace_fuzz import _base, _mutants
from tracegen import cpu_op, kernel, launch, memcpy, runtime, step, trace_bytes

from perfscope.trace import events as ev
from perfscope.trace.stream import CHUNK_BYTES
from perfscope.trace.table import TraceTable

SMALL_BATCHES = (None, 1, 20, 64, 100, 333, 1_000, 7_777)  # None: the default (4 MiB)


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as p:
        yield p


def _x(name="aten::mm", ts=10, dur=5, pid=100, tid=1, cat="cpu_op", **extra) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, **extra}


def _dumps(e) -> bytes:
    return json.dumps(e, ensure_ascii=False).encode()


def _doc(events: list[bytes], head: bytes = b"", tail: bytes = b"", sep: bytes = b",\n  ") -> bytes:
    """A trace text from event texts, with ``head`` before traceEvents and ``tail`` after it
    (each a run of ``"key": value,`` / ``, "key": value``)."""
    return b"{" + head + b'"traceEvents": [\n  ' + sep.join(events) + b"\n]" + tail + b"}\n"


def _gpu_trace(n_steps=4, **meta) -> bytes:
    events = []
    for n in range(n_steps):
        s = 1000 * n
        copy = memcpy("Memcpy HtoD (Pinned -> Device)", s + 5, 20, correlation=100 + n)
        copy["args"]["bytes"] = 4096
        events += [step(n + 1, s, 1000), cpu_op("aten::mm", s + 110, 800),
                   runtime("cudaMemcpyAsync", s + 2, 3, correlation=100 + n), copy,
                   *launch("gemm", s + 120, s + 130, 700, correlation=n + 1)]
    events.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}})
    return trace_bytes(events, **meta)


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
    nan_events = _gpu_events() + [_x("aten::nan", 30, float("nan"))]
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
    win_clean = trace_bytes(hostile + [_x("C:\\new\\tmp\\train.py(1): f", 5, 1, cat="python_function")]).replace(
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
                                           _x(ts="abc"), _x(ts=None)]),
        "args-not-an-object": trace_bytes([step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1),
                                           _x("gemm", 20, 5, pid=0, tid=7, cat="kernel", args="oops")]),
        "out-of-range-values": trace_bytes([
            step(1, 0, 100), cpu_op("aten::mm", 10, 50), cpu_op("aten::huge_dur", 20, 1e17),
            cpu_op("aten::far_future", 1e16, 5),
            {"ph": "X", "cat": ["odd"], "name": ["odd"], "pid": 100, "tid": 1, "ts": 30, "dur": 5}]),
        "list-as-ph": trace_bytes(hostile + [{"ph": [], "name": "x"}, {"ph": {"a": 1}}]),
        "no-dur": trace_bytes(hostile + [runtime("cudaLaunchKernel", 2, 1, correlation=1), k_no_dur]),
        "float-correlation": trace_bytes(hostile + launch("k", 2, 10, 50, correlation=1.5)),
        "shared-correlation": trace_bytes(
            hostile + [e for i in range(4) for e in launch("k", 10 + 200 * i, 50 + 200 * i, 100, correlation=1)]),
        "name-an-object": trace_bytes(hostile + [_x({"x": "ProfilerStep#2"}, 5, 1)]),
        "windows-path-in-a-clean-file": win_clean,
        "far-event": trace_bytes([step(1, 1e12, 100), cpu_op("aten::mm", 1e12, 90), cpu_op("aten::far", -3.9e15, 1)]),
        "ts-1e400": huge,
        "copies": trace_bytes(hostile + launch("gemm", 20, 30, 20, correlation=5) + hostile
                              + launch("gemm", 20, 30, 20, correlation=5)),
        "negative-absurd-zeroed": trace_bytes([
            step(1, 0, 100), cpu_op("aten::mm", 10, 40), cpu_op("aten::negative", 60, -30),
            cpu_op("aten::absurd", 60, 3 * 86_400e6), _x("aten::lost", 0, 0)]),
    }


def _gzip_cases() -> dict[str, bytes]:
    many = gzip.compress(trace_bytes(_many_steps(200), schemaVersion=1))
    corrupt = []
    for n in range(2000):
        corrupt += [step(n + 1, 100 * n, 100), runtime("cudaLaunchKernel", 100 * n + 1, 1, correlation=n + 1),
                    kernel("gemm", 100 * n + 10, 50, correlation=n + 1)]
    raw = bytearray(gzip.compress(trace_bytes(corrupt), compresslevel=1))
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(64)
    hostile = trace_bytes([step(1, 0, 100), cpu_op("aten::mm", 0, 90)])
    return {
        "gzip-cut-at-3/5": many[: len(many) * 3 // 5],
        "gzip-zeroed-in-the-middle": bytes(raw),
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


# ================================================================ 3. typed structs vs plain dicts

BIG_INTS = [2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**63 + 7, 2**64 - 1, 2**64, 2**64 + 5, 10**30,
            -1, -(2**63), -(2**63) - 1, -(2**64) - 3]
TEXTS = ["aten::mm", "", "µs kernel", "名前", "emoji 🚀", "C:\\new\\tmp\\train.py(1): f", "C:\\Users\\me",
         "stream 7", "123", "thread_name", "ProfilerStep#3", "a}, {b", "x}]y", 'q"uote', "tab\tnew\nline"]
FLOATS = [0.0, -0.0, 1.5, 1e-7, 1.7e15 + 0.25, 1700000000000000.123456789012345678, 1e308, 5e-324, 123.0]


def _odd(rng: random.Random):
    """Any JSON value, odd ones often."""
    return rng.choice([None, True, False, rng.choice(BIG_INTS), rng.choice(FLOATS), rng.choice(TEXTS), [1, "a"],
                       {"a": [1, {"b": None}]}, [], {}, rng.randint(-5, 50)])


def _int_like(rng, typed):
    return rng.choice(BIG_INTS + list(range(-2, 9))) if typed else _odd(rng)


def _random_event(rng: random.Random, typed: bool, avoid=()) -> dict:
    """One event; with ``typed`` only values the msgspec structs take (so the typed decode
    succeeds), else anything. ``avoid``: shapes left out ("null ids": pid, tid or cat null or
    absent; "huge external id": an External id past 64 bits), to look past a known difference."""
    e: dict = {}
    if rng.random() < 0.95:
        e["ph"] = rng.choice(["X"] * 6 + ["M", "B", "E", "i", "s", "Q", "", None] + ([] if typed else [5, ["X"], True]))
    if rng.random() < 0.9:
        e["name"] = rng.choice(TEXTS) if typed or rng.random() < 0.6 else _odd(rng)
    if rng.random() < 0.9 or "null ids" in avoid:
        e["cat"] = rng.choice(["cpu_op", "kernel", "gpu_memcpy", "cuda_runtime", "Kernel", "", "weird"]
                              + ([] if "null ids" in avoid else [None]) + ([] if typed else [["odd"], 3]))
    for f in ("pid", "tid"):
        if rng.random() < 0.9 or "null ids" in avoid:
            e[f] = (rng.choice([rng.choice(BIG_INTS), rng.randint(0, 9), rng.choice(TEXTS), None]) if typed
                    else _odd(rng))
            while "null ids" in avoid and e[f] is None:
                e[f] = rng.randint(0, 9)
    for f in ("ts", "dur"):
        if rng.random() < 0.9:
            e[f] = rng.choice([rng.randint(0, 10**6), rng.choice(FLOATS), rng.choice(BIG_INTS)]) if typed \
                else rng.choice([rng.randint(0, 10**6), _odd(rng)])
    r = rng.random()
    if r < 0.1:
        e["args"] = None
    elif r < 0.15 and not typed:
        e["args"] = rng.choice([[1, 2], "oops", 5])
    elif r < 0.9:
        a = {}
        for f in ("device", "stream", "bytes"):
            if rng.random() < 0.6:
                a[f] = _int_like(rng, typed)
        for f in ("correlation", "External id"):
            if rng.random() < 0.6:
                a[f] = rng.choice([_int_like(rng, True), None]) if typed else _odd(rng)
        x = a.get("External id")
        if "huge external id" in avoid and type(x) is int and not -(2**63) <= x < 2**64:
            a["External id"] = 2**63 + 3
        if rng.random() < 0.3:
            a["name"] = rng.choice(TEXTS) if typed else _odd(rng)
        if rng.random() < 0.3:
            a["Input Dims"] = [[rng.randint(1, 9)], {"x": _odd(rng)}]
        e["args"] = a
    if rng.random() < 0.2:
        e["unread"] = _odd(rng)
    return e


def _batches(seed: int, n: int, avoid=()):
    rng = random.Random(seed)
    for _ in range(n):
        typed = rng.random() < 0.6
        yield [_random_event(rng, typed, avoid) for _ in range(rng.randint(0, 12))]


def _texts(events):
    ascii_ = random.Random(len(events)).random() < 0.5
    return [json.dumps(e, ensure_ascii=ascii_).encode() for e in events]


# The full test, and two that leave out the shapes of a known difference each, so that another
# difference is not hidden behind them.
AVOID = {"all": (), "no-null-ids": ("null ids",), "no-null-ids-no-huge-external-id": ("null ids", "huge external id")}


@pytest.mark.parametrize("avoid", sorted(AVOID))
@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_typed_and_plain_decodes_of_random_events_give_the_same_batch(seed, avoid):
    typed_ok = 0
    for k, events in enumerate(_batches(seed, 250, AVOID[avoid])):
        text = b",".join(_texts(events))
        for root_is_list in (False, True):
            prefix, suffix = (b"[", b"]") if root_is_list else (b"[[", b"]]")
            dicts = ev.unwrap(orjson.loads(prefix + text + suffix), root_is_list)
            want = ev.from_dicts(dicts)
            try:
                structs = ev.unwrap((ev._TYPED_LIST if root_is_list else ev._TYPED_ROOT).decode(prefix + text + suffix),
                                    root_is_list)
            except msgspec.ValidationError:
                structs = None
            if structs is not None:
                typed_ok += 1
                assert_same_batch(ev.from_structs(structs), want, f"seed {seed} batch {k} from_structs: {text[:300]!r}")
            assert_same_batch(ev.decode_batch(text, root_is_list), want,
                              f"seed {seed} batch {k} decode_batch: {text[:300]!r}")
    assert typed_ok > 200  # most batches of typed values do decode typed


_LOOKALIKE = re.compile(rb"\}\s*(?:,\s*\{|\])")  # what the cutter takes for the end of an event


@pytest.mark.parametrize("seed", [21, 22])
def test_random_events_in_a_file_give_the_same_table(tmp_path, seed):
    rng = random.Random(seed)
    for k in range(12):
        events = [_random_event(rng, rng.random() < 0.7) for _ in range(rng.randint(1, 40))]
        events += [dict(rng.choice(events)) for _ in range(3)]  # exact copies, somewhere later
        rng.shuffle(events)
        path = write(tmp_path / f"r{k}.json", _doc(_texts(events)))
        assert_streams_same(path, (None, 1, 50, 300))


@pytest.mark.parametrize("seed", [23, 24])
def test_random_typed_events_in_a_file_are_streamed(tmp_path, seed):
    # values the typed structs take, no text that looks like the end of an event, none of the
    # shapes of a known difference (AVOID): the stream reads every batch itself
    rng = random.Random(seed)
    for k in range(8):
        texts = [t for t in _texts([_random_event(rng, True, AVOID["no-null-ids-no-huge-external-id"])
                                    for _ in range(rng.randint(1, 40))]) if not _LOOKALIKE.search(t[:-1])]
        texts += [rng.choice(texts) for _ in range(2)] if texts else []
        _check(tmp_path, _doc(texts or [_dumps(_x())]), name=f"r{k}.json", batches=(None, 1, 50, 300), must_stream=True)


@pytest.mark.parametrize("field", ["pid", "tid", "ts", "dur", "device", "stream", "correlation", "bytes",
                                   "External id"])
@pytest.mark.parametrize("number", [b"1" * 400, b"-" + b"9" * 400, b"1e400"],
                         ids=["400-digits", "-400-digits", "1e400"])
def test_decode_batch_refuses_a_number_orjson_refuses_in_a_field_that_is_read(field, number):
    # orjson cannot read the batch (the whole-file read repairs the number to null): the stream must
    # give up on it (Undecodable: read whole), not fail in another way nor read the number
    e = _x("odd", 7, 1, cat="kernel", args={"device": 0, "stream": 7, "correlation": 3, "bytes": 8, "External id": 4})
    (e if field in e else e["args"])[field] = "#"
    text = _dumps(e).replace(b'"#"', number)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(b"[[" + text + b"]]")
    with pytest.raises(ev.Undecodable):
        ev.decode_batch(text, False)


def test_events_without_pid_tid_or_cat_in_a_typed_batch(tmp_path):
    # absent (or null) pid, tid and cat: texts "None", "None" and "" as in the whole-file read
    events = [_dumps({"ph": "X", "name": "a", "ts": 1, "dur": 2}),
              _dumps({"ph": "X", "name": "b", "pid": None, "tid": None, "cat": None, "ts": 3, "dur": 1}),
              _dumps({"ph": "M", "name": "thread_name", "pid": None, "tid": None, "args": {"name": "main"}}),
              _dumps(_x("c", 5, 1))]
    _check(tmp_path, _doc(events), batches=(None, 1), must_stream=True)


# ================================================================ 4. texts made to trip the cutter


def _clean(n=6) -> list[bytes]:
    copy = dict(memcpy("Memcpy HtoD", 430, 20, correlation=2), args={"bytes": 4096, "device": 0, "stream": 7,
                                                                       "correlation": 2})
    return [_dumps(e) for e in [step(1, 0, 1000), *launch("gemm", 5, 10, 50, correlation=1),
                                cpu_op("aten::mm", 100, 300), runtime("cudaMemcpyAsync", 420, 3, correlation=2),
                                copy][:n]]


def _later(n=6) -> list[bytes]:
    """The events of :func:`_clean` a second later (no copies of them)."""
    return [_dumps(e) for e in [step(2, 1e6, 1000), *launch("gemm", 1e6 + 5, 1e6 + 10, 50, correlation=11),
                                cpu_op("aten::mm", 1e6 + 100, 300)][:n]]


def _check(tmp_path, data: bytes, name="t.json", batches=SMALL_BATCHES, pool=None, gz=False, must_stream=False):
    path = write(tmp_path / name, data, gz=gz)
    with FallbackSpy() as spy:
        assert_streams_same(path, batches, pool=pool)
    if must_stream:
        assert spy.calls == [], "a clean text was read whole instead of streamed"
    return path


@pytest.mark.parametrize("inside", [b"}, {", b"},{", b"}]", b"} ]", b"}\n]", b'}, {"ph": "X"}', b"]}", b"\\\"}, {"])
def test_boundaries_inside_strings(tmp_path, pool, inside):
    s = inside.decode()
    events = _clean() + [_dumps(_x(f"name {s} here", 200, 1)),
                         _dumps(_x("b", 210, 1, args={"unread": f"x{s}y", "name": s})), _dumps(_x(s, 220, 1, cat=s))]
    _check(tmp_path, _doc(events + _clean()), must_stream=True)
    _check(tmp_path, _doc(events + _later()), name="p.json", batches=(None, 1, 100), pool=pool)


def test_nested_lists_of_objects_in_args(tmp_path, pool):
    nested = [
        {"x": [{"a": 1}, {"b": 2}]},
        {"Input Dims": [[{"a": 1}], [{"b": [{"c": 3}, {"d": 4}]}]], "device": 0},
        {"x": {"y": [{"a": [{"b": 1}]}]}, "correlation": 1},
        {"x": [{}, {}, {}], "stream": 7},
    ]
    events = [_dumps(_x(f"n{i}", 200 + i, 1, args=a)) for i, a in enumerate(nested)]
    _check(tmp_path, _doc(_clean() + events + _clean()), must_stream=True)
    _check(tmp_path, _doc(events + _clean() + events), name="u.json", must_stream=True)  # starts and ends with them
    _check(tmp_path, _doc(events + _later() + events), name="p.json", batches=(None, 1, 100), pool=pool)


@pytest.mark.parametrize("inside", [b'"args": {"x": [{"a": 1}]}', b'"args": {"s": "}]"}', b'"args": {"s": "}, {"}'])
@pytest.mark.parametrize("at", ["last", "middle"])
def test_an_event_holding_a_cut_lookalike_streams_wherever_it_is(tmp_path, inside, at):
    odd = _dumps(_x("n", 7, 1))[:-1] + b", " + inside + b"}"
    events = _clean() + [odd] if at == "last" else _clean() + [odd] + _later()
    _check(tmp_path, _doc(events), batches=(None, 1, 100), must_stream=True)


@pytest.mark.parametrize("odd", [{"name": ["a list"]}, {"pid": 1.0}, {"name": None}, {"cat": 5}])
def test_a_batch_of_the_dict_path_cut_inside_an_event_streams(tmp_path, odd):
    # a value the typed structs refuse sends the batch to orjson; a cut inside an event there
    # must be joined as in the typed path, not read whole
    e = _dumps({**_x("n", 7, 1, args={"x": [{"a": 1}, {"b": 2}]}), **odd})
    _check(tmp_path, _doc(_clean() + [e] + _later()), batches=(1, 100, 300), must_stream=True)


def test_header_fields_after_the_events(tmp_path, pool):
    tail = (b',\n"traceName": "t}, {x}]", "baseTimeNanoseconds": 1700000000000000000,\n'
            b'"deviceProperties": [{"id": 0, "name": "NVIDIA A100"}, {"id": 1, "name": "NVIDIA A100"}],\n'
            b'"distributedInfo": {"rank": 1, "world_size": 2, "pg": [{"a": 1}, {"b": 2}]}')
    path = _check(tmp_path, _doc(_clean() * 4, head=b'"schemaVersion": 1, ', tail=tail), pool=pool)
    t = new_read(path, batch_bytes=1)
    assert t.base_time_ns == 1_700_000_000_000_000_000 and t.rank == 1 and len(t.device_properties) == 2


def test_header_fields_after_the_events_are_streamed_at_every_batch_size(tmp_path):
    # a batch whose aim lands past the array's end must not take a "}, {" of the header for a cut
    tail = b', "deviceProperties": [{"id": 0, "name": "NVIDIA A100"}, {"id": 1, "name": "NVIDIA A100"}]'
    data = _doc(_clean() + _later(), tail=tail)
    path = write(tmp_path / "t.json", data)
    expected = old_read(path)
    with FallbackSpy() as spy:
        sizes = range(1, len(data) + 2, 5)
        for b in sizes:
            assert_same_result(expected, new_read(path, batch_bytes=b), f"batch_bytes={b}")
    assert spy.calls == [], f"read whole at {len(spy.calls)} of {len(sizes)} batch sizes"


def test_a_bare_array_root(tmp_path, pool):
    _check(tmp_path, b"[" + b",".join(_clean()) + b"]", pool=pool, must_stream=True)
    _check(tmp_path, b" \n[\n " + b" ,\n ".join(_clean()) + b" \n] \n", name="u.json", must_stream=True)
    _check(tmp_path, b"[]", name="e.json")
    _check(tmp_path, b'[1, "a", ' + b",".join(_clean()) + b", [], null]", name="o.json")  # entries that are not events
    _check(tmp_path, b"[" + b",".join(_clean()) + b"] x", name="g.json")


@pytest.mark.parametrize("text", [b'{"traceEvents": []}', b'{"traceEvents":[ \n ]}',
                                  b'{"a": 1, "traceEvents": [], "b": [{}]}', b'  {  "traceEvents"  :  [  ]  }  ',
                                  b'{"traceEvents": [], "traceName": "x"}'])
def test_an_empty_trace_events(tmp_path, text):
    _check(tmp_path, text)


def test_no_whitespace_and_lots_of_whitespace(tmp_path):
    tight = b'{"schemaVersion":1,"traceEvents":[' + b",".join(orjson.dumps(orjson.loads(e)) for e in _clean()) + b"]}"
    _check(tmp_path, tight, must_stream=True)
    ws = b" \t\r\n" * 40
    loose = (ws + b"{" + ws + b'"traceEvents"' + ws + b":" + ws + b"[" + ws + (ws + b"," + ws).join(_clean() * 3)
             + ws + b"]" + ws + b"," + ws + b'"baseTimeNanoseconds"' + ws + b":" + ws + b"5" + ws + b"}" + ws)
    _check(tmp_path, loose, name="u.json", must_stream=True)


@pytest.mark.parametrize("space", [b"\x0b", b"\x0c", b"\xc2\xa0", b"\x00"])
def test_bytes_that_are_not_json_whitespace_between_events(tmp_path, space):
    # Python's \s also matches \x0b and \x0c; JSON does not allow them (the whole-file read refuses the file)
    events = _clean()
    _check(tmp_path, _doc(events[:3], sep=space + b",") + b"", name="a.json")
    _check(tmp_path, _doc(events[:3], sep=b"," + space), name="b.json")
    _check(tmp_path, b'{"traceEvents": [' + b",".join(events) + space + b"]}", name="c.json")
    _check(tmp_path, b'{"traceEvents"' + space + b': [' + b",".join(events) + b"]}", name="d.json")
    _check(tmp_path, b'{"traceEvents":' + space + b'[' + b",".join(events) + b"]}", name="e.json")


def _members(data: bytes, cuts) -> bytes:
    out, last = b"", 0
    for c in [*cuts, len(data)]:
        out += gzip.compress(data[last:c])
        last = c
    return out


def test_gzip_with_several_members(tmp_path):
    data = _gpu_trace(3, schemaVersion=1, distributedInfo={"rank": 0, "world_size": 1})
    key = data.index(b'"traceEvents"')
    for k, cuts in enumerate([[key + 5], [len(data) // 3, len(data) // 2], list(range(7, len(data), 97)),
                              [0, 0, 1, len(data)], [data.index(b"}") + 1]]):
        _check(tmp_path, _members(data, cuts), name=f"m{k}.json.gz", batches=(None, 1, 100, 1_000), must_stream=True)


@pytest.mark.parametrize("after", [b"\x00" * 4, b"\x00" * 5000, b"junk", b"\x00\x00junk", b"\x1f", b"\x1f\x8b",
                                   b"\x00" * 10 + gzip.compress(b" ")])
def test_gzip_followed_by_other_bytes(tmp_path, after):
    data = gzip.compress(_gpu_trace(2))
    _check(tmp_path, data + after, name="t.json.gz", batches=(None, 1, 100))


def test_a_gzip_member_that_adds_text_after_the_trace(tmp_path):
    data = _gpu_trace(2)
    _check(tmp_path, gzip.compress(data) + gzip.compress(b"\n\n "), name="a.json.gz", must_stream=True)
    _check(tmp_path, gzip.compress(data) + gzip.compress(b'{"x": 1}'), name="b.json.gz")


@pytest.mark.parametrize("text", [
    b'{"traceEvents": [E1, E2], "traceEvents": []}',  # the last key wins in JSON decoders: no events
    b'{"traceEvents": [E1], "traceEvents": [E2]}',
    b'{"traceEvents": [], "traceEvents": [E1, E2]}',
    b'{"traceEvents": [E1, E2], "trace\\u0045vents": []}',  # the same key, spelt with an escape
    b'{"a": {"traceEvents": [E1]}, "traceEvents": []}',  # an array of that name inside a header field
    b'{"a": [{"traceEvents": [E1]}], "traceEvents": [E2]}',
    b'{"a": {"traceEvents": [E1]}, "traceEvents": [E2]}',
    b'{"traceEvents": [E1], "a": {"traceEvents": [E2]}}',
    b'{"a": {"traceEvents": [E1]}}',
], ids=lambda t: t.decode())
def test_a_duplicated_or_nested_trace_events_key(tmp_path, text):
    e1, e2 = _dumps(_x("first", 10, 5)), _dumps(_x("second", 20, 5))
    _check(tmp_path, text.replace(b"E1", e1).replace(b"E2", e2), batches=(None, 1, 100))


def test_exact_copies_in_different_batches_are_dropped_and_counted_the_same(tmp_path, pool):
    base = _clean()
    # copies of typed batches, and of batches that take the dict path (a name that is a list)
    odd = _dumps(_x(["odd", 1], 500, 2))
    near = _dumps(_x("aten::mm", 100, 300, args={"unread": 1}))  # equal columns, other args: not a copy
    events = base + [odd] + base + [near] + base[::-1] + [odd, odd]
    _check(tmp_path, _doc(events), pool=pool)
    # one copy in a typed batch, the other in a dict batch
    _check(tmp_path, _doc(base + [b"\n" + b" " * 400 + odd] + base), name="u.json")


@pytest.mark.parametrize("ext_id", [5, 2**63 + 1, 2**64 - 1, 2**64 + 1, -(2**63) - 1, 10**30])
def test_exact_copies_with_any_external_id_whatever_the_decode_path(tmp_path, ext_id):
    # the copy in the second batch shares it with an event the typed decoder refuses (name: a list)
    copy = _dumps(_x("aten::copied", 50, 5, args={"External id": ext_id}))
    odd = _dumps(_x(["odd"], 60, 5))
    text = _doc([copy, odd, copy])
    _check(tmp_path, text, batches=(None, 1, len(copy) + 2))


def test_u64_correlation_ids_in_different_batches(tmp_path, pool):
    big = [2**63, 2**63 + 1, 2**64 - 1, 2**64 + 1, 5, 2**63 - 1]
    events = []
    for i, c in enumerate(big * 3):
        events += [_dumps(runtime("cudaLaunchKernel", 10 * i, 1, correlation=c)),
                   _dumps(kernel(f"k{i}", 10 * i + 2, 3, correlation=c)), _dumps(cpu_op("aten::x", 10 * i, 1))]
    events.append(_dumps(kernel("nocorr", 900, 1)))
    _check(tmp_path, _doc(events), pool=pool)
    _check(tmp_path, _doc(_clean() + events[:6]), name="u.json")


@pytest.mark.parametrize("where", ["name", "unread", "args-name", "thread-name"])
@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udc00x", b"\\ud83d\\ude80", b"\\ud800\\u0041", b"\\u0000"])
def test_surrogate_and_other_escapes(tmp_path, where, escape):
    e = {"name": b'"aten::' + escape + b'"', "unread": b'"aten::mm", "x": "' + escape + b'"',
         "args-name": b'"aten::mm", "args": {"name": "' + escape + b'"}',
         "thread-name": b'"thread_name", "ph": "M", "args": {"name": "' + escape + b'"}'}[where]
    text = b'{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "name": ' + e + b"}"
    _check(tmp_path, _doc(_clean() + [text] + _clean()), batches=(None, 1, 300))


@pytest.mark.parametrize("where", ["name", "unread", "cat", "header"])
@pytest.mark.parametrize("raw", [b"\xb5", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82"])
def test_bytes_that_are_not_utf8(tmp_path, where, raw):
    odd = {"name": _dumps(_x("k")).replace(b'"k"', b'"k ' + raw + b'"'),
           "unread": _dumps(_x("k", args={"x": "#"})).replace(b"#", raw),
           "cat": _dumps(_x("k", cat="#")).replace(b"#", raw)}.get(where, _dumps(_x("k")))
    head = b'"x": "' + raw + b'", ' if where == "header" else b""
    _check(tmp_path, _doc(_clean() + [odd] + _clean(), head=head), batches=(None, 1, 300))


@pytest.mark.parametrize("depth", [990, 1001, 1019, 1022, 1030, 1500, 5000])
@pytest.mark.parametrize("where", ["unread", "args-unread", "name", "device", "header"])
def test_very_deep_nesting(tmp_path, where, depth):
    deep = b"[" * depth + b"]" * depth
    odd = {"unread": _dumps(_x("deep", extra="#")), "args-unread": _dumps(_x("deep", args={"x": "#", "device": 0})),
           "name": _dumps(_x("#")), "device": _dumps(_x("deep", cat="kernel", args={"device": "#"}))}
    head = b'"x": ' + deep + b", " if where == "header" else b""
    event = odd.get(where, _dumps(_x("deep"))).replace(b'"#"', deep)
    _check(tmp_path, _doc(_clean() + [event] + _clean(), head=head), batches=(None, 1, 300))


def test_truncated_at_every_position(tmp_path):
    data = _doc(_clean() + [_dumps(_x("n", 7, 1, args={"x": [{"a": 1}, {"b": "}, {"}]}))] + _clean(3),
                head=b'"schemaVersion": 1, ', tail=b', "baseTimeNanoseconds": 5')
    for at in range(0, len(data), 5):
        _check(tmp_path, data[:at], name=f"c{at}.json", batches=(None, 1))


def test_truncated_gzip_at_many_positions(tmp_path):
    data = gzip.compress(_gpu_trace(3, schemaVersion=1))
    for at in range(0, len(data), 23):
        _check(tmp_path, data[:at], name=f"c{at}.json.gz", batches=(None, 1, 100))


@pytest.mark.parametrize("last", ["plain", "nested"])
def test_every_batch_size_of_a_small_trace(tmp_path, last):
    # every alignment of the cut with events, separators, the array's end and the file's end
    nested = _dumps(_x("n", 7, 1, args={"x": [{"a": 1}, {"b": 2}]}))
    events = _clean(4) + [nested] + _later(2) if last == "plain" else _clean(4) + [nested]
    data = _doc(events, tail=b', "traceName": "x"')
    path = write(tmp_path / "t.json", data)
    expected = old_read(path)
    with FallbackSpy() as spy:
        for b in range(1, len(data) + 3):
            assert_same_result(expected, new_read(path, batch_bytes=b), f"batch_bytes={b}")
    assert spy.calls == []


def test_a_file_ending_right_after_a_batch_boundary(tmp_path):
    events = _clean()
    for k, data in enumerate([
        b'{"traceEvents": [' + b",".join(events),  # ends after an event
        b'{"traceEvents": [' + b",".join(events) + b",",  # after the comma
        b'{"traceEvents": [' + b",".join(events) + b"]",  # after the array
        b'{"traceEvents": [' + b",".join(events) + b"]}",
        b"[" + b",".join(events),
        b"[" + b",".join(events) + b",",
        b"[" + b",".join(events) + b"]",
    ]):
        batches = (None, 1, len(events[0]), len(events[0]) + 1, len(data) - 18)
        _check(tmp_path, data, name=f"e{k}.json", batches=batches)


def test_a_batch_target_at_the_end_of_a_chunk(tmp_path):
    # a text past one read chunk: cuts aimed at the chunk's end, just before and just after it
    one = _dumps(_x("aten::mm", 10, 5, args={"Input Dims": [[3, 3]], "x": {"a": 1}}))
    n = CHUNK_BYTES // (len(one) + 1) + 50
    events = [one.replace(b'"ts": 10', b'"ts": %d' % i) for i in range(n)]
    data = _doc(events)
    head = data.index(b"[") + 1
    path = write(tmp_path / "t.json", data)
    expected = old_read(path)
    with FallbackSpy() as spy:
        for b in (CHUNK_BYTES - head - 1, CHUNK_BYTES - head, CHUNK_BYTES - head + 1, CHUNK_BYTES // 2 - head):
            assert_same_result(expected, new_read(path, batch_bytes=b), f"batch_bytes={b}")
    assert spy.calls == [], f"read whole {len(spy.calls)} times"


def test_a_huge_number_in_a_field_not_read_differs_only_by_the_repaired_entry(tmp_path):
    # the intended difference: msgspec skips 1e400 in an args key perfscope does not read
    data = _doc(_clean() + [_dumps(_x("big", 7, 1, args={"x": "#"})).replace(b'"#"', b"1e400")] + _later())
    path = write(tmp_path / "t.json", data)
    old = old_read(path)
    assert isinstance(old, TraceTable), describe(old)
    repaired = [e for e in old.quality.entries if e.action == "repaired"]
    assert len(repaired) == 1 and "1e400" in repaired[0].reason
    old.quality.entries.remove(repaired[0])
    old.warnings = [w for w in old.warnings if "1e400" not in w]
    for b in (None, 1, 100):
        new = new_read(path, batch_bytes=b) if b else new_read(path)
        assert isinstance(new, TraceTable), describe(new)
        assert_same_table(old, new, f"batch_bytes={b}")


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1" * 400], ids=["1e400", "-1e400", "400-digits"])
def test_a_huge_number_in_a_field_not_read_of_copied_events(tmp_path, number):
    # exact copies are read again from the file to compare them whole: the text holds the number
    copy = _dumps(_x("copied", 7, 1, args={"x": "#"})).replace(b'"#"', number)
    path = write(tmp_path / "t.json", _doc(_clean() + [copy, copy] + _clean()))
    old = old_read(path)
    assert isinstance(old, TraceTable), describe(old)
    for b in (None, 1):
        new = new_read(path, batch_bytes=b) if b else new_read(path)
        assert isinstance(new, TraceTable), f"batch_bytes={b}: {describe(new)}"
        assert [e.to_dict() for e in new.quality.entries if e.action != "repaired"] == \
            [e.to_dict() for e in old.quality.entries if e.action != "repaired"]


@pytest.mark.parametrize("field", ["ts", "dur", "pid", "tid", "device", "stream", "correlation", "bytes", "External id",
                                   "name", "ph", "cat"])
@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1" * 400, b"18446744073709551616", b"9223372036854775808",
                                    b"-9223372036854775809", b"1.0", b"true"],
                         ids=["1e400", "-1e400", "400-digits", "2**64", "2**63", "-2**63-1", "1.0", "true"])
def test_odd_numbers_in_fields_that_are_read(tmp_path, field, number):
    e = _x("odd", 7, 1, cat="kernel", pid=0, tid=7, args={"device": 0, "stream": 7, "correlation": 3, "bytes": 8,
                                                          "External id": 4})
    if field in e:
        e[field] = "#"
    else:
        e["args"][field] = "#"
    odd = _dumps(e).replace(b'"#"', number)
    _check(tmp_path, _doc(_clean() + [odd] + _later()), batches=(None, 1, 300))  # no copies: see the test above
