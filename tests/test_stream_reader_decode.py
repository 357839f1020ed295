"""The two decoders of the streaming reader agree: random events decoded into typed structs
(msgspec) and into plain dicts (orjson) give the same batch columns, and in a file the same table
as the whole-file read (see test_stream_reader.py for the whole contract)."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ProcessPoolExecutor

import msgspec
import orjson
import pytest
from streamkit import (
    check, doc, dumps, event_x, assert_same_batch, assert_streams_same, write,
)

from perfscope.trace import events as ev


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as p:
        yield p


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
        path = write(tmp_path / f"r{k}.json", doc(_texts(events)))
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
        check(tmp_path, doc(texts or [dumps(event_x())]), name=f"r{k}.json", batches=(None, 1, 50, 300), must_stream=True)


@pytest.mark.parametrize("field", ["pid", "tid", "ts", "dur", "device", "stream", "correlation", "bytes",
                                   "External id"])
@pytest.mark.parametrize("number", [b"1" * 400, b"-" + b"9" * 400, b"1e400"],
                         ids=["400-digits", "-400-digits", "1e400"])
def test_decode_batch_refuses_a_number_orjson_refuses_in_a_field_that_is_read(field, number):
    # orjson cannot read the batch (the whole-file read repairs the number to null): the stream must
    # give up on it (Undecodable: read whole), not fail in another way nor read the number
    e = event_x("odd", 7, 1, cat="kernel", args={"device": 0, "stream": 7, "correlation": 3, "bytes": 8, "External id": 4})
    (e if field in e else e["args"])[field] = "#"
    text = dumps(e).replace(b'"#"', number)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(b"[[" + text + b"]]")
    with pytest.raises(ev.Undecodable):
        ev.decode_batch(text, False)


def test_events_without_pid_tid_or_cat_in_a_typed_batch(tmp_path):
    # absent (or null) pid, tid and cat: texts "None", "None" and "" as in the whole-file read
    events = [dumps({"ph": "X", "name": "a", "ts": 1, "dur": 2}),
              dumps({"ph": "X", "name": "b", "pid": None, "tid": None, "cat": None, "ts": 3, "dur": 1}),
              dumps({"ph": "M", "name": "thread_name", "pid": None, "tid": None, "args": {"name": "main"}}),
              dumps(event_x("c", 5, 1))]
    check(tmp_path, doc(events), batches=(None, 1), must_stream=True)


