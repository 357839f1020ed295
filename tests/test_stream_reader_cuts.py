"""Texts made to trip the streaming reader's cutter (boundaries inside strings and nested lists,
header fields after the events, whitespace, gzip members, duplicate keys, truncation at every
byte...) give the whole-file read's table or error (see test_stream_reader.py)."""

from __future__ import annotations

import gzip
from concurrent.futures import ProcessPoolExecutor

import orjson
import pytest
from streamkit import (
    check, doc, dumps, event_x, gpu_trace, 
    FallbackSpy, assert_same_result, assert_same_table, describe, new_read,
    old_read, write,
)
from tracegen import cpu_op, kernel, launch, memcpy, runtime, step

from perfscope.trace.stream import CHUNK_BYTES
from perfscope.trace.table import TraceTable


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as p:
        yield p


# ================================================================ 4. texts made to trip the cutter


def _clean(n=6) -> list[bytes]:
    copy = dict(memcpy("Memcpy HtoD", 430, 20, correlation=2), args={"bytes": 4096, "device": 0, "stream": 7,
                                                                       "correlation": 2})
    return [dumps(e) for e in [step(1, 0, 1000), *launch("gemm", 5, 10, 50, correlation=1),
                                cpu_op("aten::mm", 100, 300), runtime("cudaMemcpyAsync", 420, 3, correlation=2),
                                copy][:n]]


def _later(n=6) -> list[bytes]:
    """The events of :func:`_clean` a second later (no copies of them)."""
    return [dumps(e) for e in [step(2, 1e6, 1000), *launch("gemm", 1e6 + 5, 1e6 + 10, 50, correlation=11),
                                cpu_op("aten::mm", 1e6 + 100, 300)][:n]]


@pytest.mark.parametrize("inside", [b"}, {", b"},{", b"}]", b"} ]", b"}\n]", b'}, {"ph": "X"}', b"]}", b"\\\"}, {"])
def test_boundaries_inside_strings(tmp_path, pool, inside):
    s = inside.decode()
    events = _clean() + [dumps(event_x(f"name {s} here", 200, 1)),
                         dumps(event_x("b", 210, 1, args={"unread": f"x{s}y", "name": s})), dumps(event_x(s, 220, 1, cat=s))]
    check(tmp_path, doc(events + _clean()), must_stream=True)
    check(tmp_path, doc(events + _later()), name="p.json", batches=(None, 1, 100), pool=pool)


def test_nested_lists_of_objects_in_args(tmp_path, pool):
    nested = [
        {"x": [{"a": 1}, {"b": 2}]},
        {"Input Dims": [[{"a": 1}], [{"b": [{"c": 3}, {"d": 4}]}]], "device": 0},
        {"x": {"y": [{"a": [{"b": 1}]}]}, "correlation": 1},
        {"x": [{}, {}, {}], "stream": 7},
    ]
    events = [dumps(event_x(f"n{i}", 200 + i, 1, args=a)) for i, a in enumerate(nested)]
    check(tmp_path, doc(_clean() + events + _clean()), must_stream=True)
    check(tmp_path, doc(events + _clean() + events), name="u.json", must_stream=True)  # starts and ends with them
    check(tmp_path, doc(events + _later() + events), name="p.json", batches=(None, 1, 100), pool=pool)


@pytest.mark.parametrize("inside", [b'"args": {"x": [{"a": 1}]}', b'"args": {"s": "}]"}', b'"args": {"s": "}, {"}'])
@pytest.mark.parametrize("at", ["last", "middle"])
def test_an_event_holding_a_cut_lookalike_streams_wherever_it_is(tmp_path, inside, at):
    odd = dumps(event_x("n", 7, 1))[:-1] + b", " + inside + b"}"
    events = _clean() + [odd] if at == "last" else _clean() + [odd] + _later()
    check(tmp_path, doc(events), batches=(None, 1, 100), must_stream=True)


@pytest.mark.parametrize("odd", [{"name": ["a list"]}, {"pid": 1.0}, {"name": None}, {"cat": 5}])
def test_a_batch_of_the_dict_path_cut_inside_an_event_streams(tmp_path, odd):
    # a value the typed structs refuse sends the batch to orjson; a cut inside an event there
    # must be joined as in the typed path, not read whole
    e = dumps({**event_x("n", 7, 1, args={"x": [{"a": 1}, {"b": 2}]}), **odd})
    check(tmp_path, doc(_clean() + [e] + _later()), batches=(1, 100, 300), must_stream=True)


def test_header_fields_after_the_events(tmp_path, pool):
    tail = (b',\n"traceName": "t}, {x}]", "baseTimeNanoseconds": 1700000000000000000,\n'
            b'"deviceProperties": [{"id": 0, "name": "NVIDIA A100"}, {"id": 1, "name": "NVIDIA A100"}],\n'
            b'"distributedInfo": {"rank": 1, "world_size": 2, "pg": [{"a": 1}, {"b": 2}]}')
    path = check(tmp_path, doc(_clean() * 4, head=b'"schemaVersion": 1, ', tail=tail), pool=pool)
    t = new_read(path, batch_bytes=1)
    assert t.base_time_ns == 1_700_000_000_000_000_000 and t.rank == 1 and len(t.device_properties) == 2


def test_header_fields_after_the_events_are_streamed_at_every_batch_size(tmp_path):
    # a batch whose aim lands past the array's end must not take a "}, {" of the header for a cut
    tail = b', "deviceProperties": [{"id": 0, "name": "NVIDIA A100"}, {"id": 1, "name": "NVIDIA A100"}]'
    data = doc(_clean() + _later(), tail=tail)
    path = write(tmp_path / "t.json", data)
    expected = old_read(path)
    with FallbackSpy() as spy:
        sizes = range(1, len(data) + 2, 5)
        for b in sizes:
            assert_same_result(expected, new_read(path, batch_bytes=b), f"batch_bytes={b}")
    assert spy.calls == [], f"read whole at {len(spy.calls)} of {len(sizes)} batch sizes"


def test_a_bare_array_root(tmp_path, pool):
    check(tmp_path, b"[" + b",".join(_clean()) + b"]", pool=pool, must_stream=True)
    check(tmp_path, b" \n[\n " + b" ,\n ".join(_clean()) + b" \n] \n", name="u.json", must_stream=True)
    check(tmp_path, b"[]", name="e.json")
    check(tmp_path, b'[1, "a", ' + b",".join(_clean()) + b", [], null]", name="o.json")  # entries that are not events
    check(tmp_path, b"[" + b",".join(_clean()) + b"] x", name="g.json")


@pytest.mark.parametrize("text", [b'{"traceEvents": []}', b'{"traceEvents":[ \n ]}',
                                  b'{"a": 1, "traceEvents": [], "b": [{}]}', b'  {  "traceEvents"  :  [  ]  }  ',
                                  b'{"traceEvents": [], "traceName": "x"}'])
def test_an_empty_trace_events(tmp_path, text):
    check(tmp_path, text)


def test_no_whitespace_and_lots_of_whitespace(tmp_path):
    tight = b'{"schemaVersion":1,"traceEvents":[' + b",".join(orjson.dumps(orjson.loads(e)) for e in _clean()) + b"]}"
    check(tmp_path, tight, must_stream=True)
    ws = b" \t\r\n" * 40
    loose = (ws + b"{" + ws + b'"traceEvents"' + ws + b":" + ws + b"[" + ws + (ws + b"," + ws).join(_clean() * 3)
             + ws + b"]" + ws + b"," + ws + b'"baseTimeNanoseconds"' + ws + b":" + ws + b"5" + ws + b"}" + ws)
    check(tmp_path, loose, name="u.json", must_stream=True)


@pytest.mark.parametrize("space", [b"\x0b", b"\x0c", b"\xc2\xa0", b"\x00"])
def test_bytes_that_are_not_json_whitespace_between_events(tmp_path, space):
    # Python's \s also matches \x0b and \x0c; JSON does not allow them (the whole-file read refuses the file)
    events = _clean()
    check(tmp_path, doc(events[:3], sep=space + b",") + b"", name="a.json")
    check(tmp_path, doc(events[:3], sep=b"," + space), name="b.json")
    check(tmp_path, b'{"traceEvents": [' + b",".join(events) + space + b"]}", name="c.json")
    check(tmp_path, b'{"traceEvents"' + space + b': [' + b",".join(events) + b"]}", name="d.json")
    check(tmp_path, b'{"traceEvents":' + space + b'[' + b",".join(events) + b"]}", name="e.json")


def _members(data: bytes, cuts) -> bytes:
    out, last = b"", 0
    for c in [*cuts, len(data)]:
        out += gzip.compress(data[last:c])
        last = c
    return out


def test_gzip_with_several_members(tmp_path):
    data = gpu_trace(3, schemaVersion=1, distributedInfo={"rank": 0, "world_size": 1})
    key = data.index(b'"traceEvents"')
    for k, cuts in enumerate([[key + 5], [len(data) // 3, len(data) // 2], list(range(7, len(data), 97)),
                              [0, 0, 1, len(data)], [data.index(b"}") + 1]]):
        check(tmp_path, _members(data, cuts), name=f"m{k}.json.gz", batches=(None, 1, 100, 1_000), must_stream=True)


@pytest.mark.parametrize("after", [b"\x00" * 4, b"\x00" * 5000, b"junk", b"\x00\x00junk", b"\x1f", b"\x1f\x8b",
                                   b"\x00" * 10 + gzip.compress(b" ", mtime=0)])
def test_gzip_followed_by_other_bytes(tmp_path, after):
    data = gzip.compress(gpu_trace(2))
    check(tmp_path, data + after, name="t.json.gz", batches=(None, 1, 100))


def test_a_gzip_member_that_adds_text_after_the_trace(tmp_path):
    data = gpu_trace(2)
    check(tmp_path, gzip.compress(data) + gzip.compress(b"\n\n "), name="a.json.gz", must_stream=True)
    check(tmp_path, gzip.compress(data) + gzip.compress(b'{"x": 1}'), name="b.json.gz")


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
    e1, e2 = dumps(event_x("first", 10, 5)), dumps(event_x("second", 20, 5))
    check(tmp_path, text.replace(b"E1", e1).replace(b"E2", e2), batches=(None, 1, 100))


def test_exact_copies_in_different_batches_are_dropped_and_counted_the_same(tmp_path, pool):
    base = _clean()
    # copies of typed batches, and of batches that take the dict path (a name that is a list)
    odd = dumps(event_x(["odd", 1], 500, 2))
    near = dumps(event_x("aten::mm", 100, 300, args={"unread": 1}))  # equal columns, other args: not a copy
    events = base + [odd] + base + [near] + base[::-1] + [odd, odd]
    check(tmp_path, doc(events), pool=pool)
    # one copy in a typed batch, the other in a dict batch
    check(tmp_path, doc(base + [b"\n" + b" " * 400 + odd] + base), name="u.json")


@pytest.mark.parametrize("ext_id", [5, 2**63 + 1, 2**64 - 1, 2**64 + 1, -(2**63) - 1, 10**30])
def test_exact_copies_with_any_external_id_whatever_the_decode_path(tmp_path, ext_id):
    # the copy in the second batch shares it with an event the typed decoder refuses (name: a list)
    copy = dumps(event_x("aten::copied", 50, 5, args={"External id": ext_id}))
    odd = dumps(event_x(["odd"], 60, 5))
    text = doc([copy, odd, copy])
    check(tmp_path, text, batches=(None, 1, len(copy) + 2))


def test_u64_correlation_ids_in_different_batches(tmp_path, pool):
    big = [2**63, 2**63 + 1, 2**64 - 1, 2**64 + 1, 5, 2**63 - 1]
    events = []
    for i, c in enumerate(big * 3):
        events += [dumps(runtime("cudaLaunchKernel", 10 * i, 1, correlation=c)),
                   dumps(kernel(f"k{i}", 10 * i + 2, 3, correlation=c)), dumps(cpu_op("aten::x", 10 * i, 1))]
    events.append(dumps(kernel("nocorr", 900, 1)))
    check(tmp_path, doc(events), pool=pool)
    check(tmp_path, doc(_clean() + events[:6]), name="u.json")


@pytest.mark.parametrize("where", ["name", "unread", "args-name", "thread-name"])
@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udc00x", b"\\ud83d\\ude80", b"\\ud800\\u0041", b"\\u0000"])
def test_surrogate_and_other_escapes(tmp_path, where, escape):
    e = {"name": b'"aten::' + escape + b'"', "unread": b'"aten::mm", "x": "' + escape + b'"',
         "args-name": b'"aten::mm", "args": {"name": "' + escape + b'"}',
         "thread-name": b'"thread_name", "ph": "M", "args": {"name": "' + escape + b'"}'}[where]
    text = b'{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "name": ' + e + b"}"
    check(tmp_path, doc(_clean() + [text] + _clean()), batches=(None, 1, 300))


@pytest.mark.parametrize("where", ["name", "unread", "cat", "header"])
@pytest.mark.parametrize("raw", [b"\xb5", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82"])
def test_bytes_that_are_not_utf8(tmp_path, where, raw):
    odd = {"name": dumps(event_x("k")).replace(b'"k"', b'"k ' + raw + b'"'),
           "unread": dumps(event_x("k", args={"x": "#"})).replace(b"#", raw),
           "cat": dumps(event_x("k", cat="#")).replace(b"#", raw)}.get(where, dumps(event_x("k")))
    head = b'"x": "' + raw + b'", ' if where == "header" else b""
    check(tmp_path, doc(_clean() + [odd] + _clean(), head=head), batches=(None, 1, 300))


@pytest.mark.parametrize("depth", [990, 1001, 1019, 1022, 1030, 1500, 5000])
@pytest.mark.parametrize("where", ["unread", "args-unread", "name", "device", "header"])
def test_very_deep_nesting(tmp_path, where, depth):
    deep = b"[" * depth + b"]" * depth
    odd = {"unread": dumps(event_x("deep", extra="#")), "args-unread": dumps(event_x("deep", args={"x": "#", "device": 0})),
           "name": dumps(event_x("#")), "device": dumps(event_x("deep", cat="kernel", args={"device": "#"}))}
    head = b'"x": ' + deep + b", " if where == "header" else b""
    event = odd.get(where, dumps(event_x("deep"))).replace(b'"#"', deep)
    check(tmp_path, doc(_clean() + [event] + _clean(), head=head), batches=(None, 1, 300))


def test_truncated_at_every_position(tmp_path):
    data = doc(_clean() + [dumps(event_x("n", 7, 1, args={"x": [{"a": 1}, {"b": "}, {"}]}))] + _clean(3),
                head=b'"schemaVersion": 1, ', tail=b', "baseTimeNanoseconds": 5')
    for at in range(0, len(data), 5):
        check(tmp_path, data[:at], name=f"c{at}.json", batches=(None, 1))


def test_truncated_gzip_at_many_positions(tmp_path):
    data = gzip.compress(gpu_trace(3, schemaVersion=1))
    for at in range(0, len(data), 23):
        check(tmp_path, data[:at], name=f"c{at}.json.gz", batches=(None, 1, 100))


@pytest.mark.parametrize("last", ["plain", "nested"])
def test_every_batch_size_of_a_small_trace(tmp_path, last):
    # every alignment of the cut with events, separators, the array's end and the file's end
    nested = dumps(event_x("n", 7, 1, args={"x": [{"a": 1}, {"b": 2}]}))
    events = _clean(4) + [nested] + _later(2) if last == "plain" else _clean(4) + [nested]
    data = doc(events, tail=b', "traceName": "x"')
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
        check(tmp_path, data, name=f"e{k}.json", batches=batches)


def test_a_batch_target_at_the_end_of_a_chunk(tmp_path):
    # a text past one read chunk: cuts aimed at the chunk's end, just before and just after it
    one = dumps(event_x("aten::mm", 10, 5, args={"Input Dims": [[3, 3]], "x": {"a": 1}}))
    n = CHUNK_BYTES // (len(one) + 1) + 50
    events = [one.replace(b'"ts": 10', b'"ts": %d' % i) for i in range(n)]
    data = doc(events)
    head = data.index(b"[") + 1
    path = write(tmp_path / "t.json", data)
    expected = old_read(path)
    with FallbackSpy() as spy:
        for b in (CHUNK_BYTES - head - 1, CHUNK_BYTES - head, CHUNK_BYTES - head + 1, CHUNK_BYTES // 2 - head):
            assert_same_result(expected, new_read(path, batch_bytes=b), f"batch_bytes={b}")
    assert spy.calls == [], f"read whole {len(spy.calls)} times"


def test_a_huge_number_in_a_field_not_read_differs_only_by_the_repaired_entry(tmp_path):
    # the intended difference: msgspec skips 1e400 in an args key perfscope does not read
    data = doc(_clean() + [dumps(event_x("big", 7, 1, args={"x": "#"})).replace(b'"#"', b"1e400")] + _later())
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
    copy = dumps(event_x("copied", 7, 1, args={"x": "#"})).replace(b'"#"', number)
    path = write(tmp_path / "t.json", doc(_clean() + [copy, copy] + _clean()))
    old = old_read(path)
    assert isinstance(old, TraceTable), describe(old)
    for b in (None, 1):
        new = new_read(path, batch_bytes=b) if b else new_read(path)
        assert isinstance(new, TraceTable), f"batch_bytes={b}: {describe(new)}"
        assert [e.to_record() for e in new.quality.entries if e.action != "repaired"] == \
            [e.to_record() for e in old.quality.entries if e.action != "repaired"]


@pytest.mark.parametrize("field", ["ts", "dur", "pid", "tid", "device", "stream", "correlation", "bytes", "External id",
                                   "name", "ph", "cat"])
@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1" * 400, b"18446744073709551616", b"9223372036854775808",
                                    b"-9223372036854775809", b"1.0", b"true"],
                         ids=["1e400", "-1e400", "400-digits", "2**64", "2**63", "-2**63-1", "1.0", "true"])
def test_odd_numbers_in_fields_that_are_read(tmp_path, field, number):
    e = event_x("odd", 7, 1, cat="kernel", pid=0, tid=7, args={"device": 0, "stream": 7, "correlation": 3, "bytes": 8,
                                                          "External id": 4})
    if field in e:
        e[field] = "#"
    else:
        e["args"][field] = "#"
    odd = dumps(e).replace(b'"#"', number)
    check(tmp_path, doc(_clean() + [odd] + _later()), batches=(None, 1, 300))  # no copies: see the test above

