"""Hand-written trace cases: JSON damage that real writers leave inside a trace is repaired and
counted, told apart from truncation; damage that cannot be repaired names the file, line and
column (see tracekit.py for the conventions)."""

from __future__ import annotations

import gzip
import json

import pytest
from tracegen import kernel, launch, runtime, step, trace_bytes
from tracekit import check_partition, only_row

import perfscope
from perfscope.errors import TraceFormatError
from perfscope.trace.decode import TraceDamagedError


def _gpu_events():
    # step [0, 100): gemm [10, 70) launched at 2, a copy-ish kernel [80, 90) launched at 5
    return [step(1, 0, 100), *launch("gemm", 2, 10, 60, correlation=1), *launch("k2", 5, 80, 10, correlation=2)]


def _write(tmp_path, data: bytes, name="t.json"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _quality(a, action=None):
    return [e for e in a.traces[0].data_quality if action is None or e.action == action]


def test_unquoted_na_value_is_read_as_null_and_every_event_kept(tmp_path):
    data = trace_bytes(_gpu_events()).replace(b'"correlation": 1}', b'"correlation": 1, "bandwidth (GB/s)": N/A}', 1)
    assert b"N/A" in data
    a = perfscope.analyze(_write(tmp_path, data))
    row = only_row(a)
    assert row["mode"] == "gpu"  # not a CPU-only analysis of half the file
    assert a.traces[0].events == 5
    assert row["compute_us"] == pytest.approx(70)  # 60 + 10
    (entry,) = _quality(a, "repaired")
    assert entry.count == 1 and entry.unit == "value"
    assert any(w.startswith("t.json: 1 value repaired: N/A, NaN, Infinity or a number too large") for w in a.warnings)
    assert not any("truncated" in w for w in a.warnings)


def test_windows_paths_with_single_backslashes_keep_their_literal_names(tmp_path):
    # \U and \m are invalid escapes; \t and \n would silently become a tab and a newline.
    names = ['C:\\Users\\me\\train.py(12): forward', 'C:\\temp\\new.py(3): <module>']
    py = [{"ph": "X", "cat": "python_function", "name": n, "pid": 100, "tid": 1, "ts": 20 + k, "dur": 1}
          for k, n in enumerate(names)]
    text = trace_bytes(_gpu_events()).decode()
    raw = ",\n".join("  " + json.dumps(e).replace("\\\\", "\\") for e in py)  # written raw, as Windows Kineto did
    text = text.replace('  "traceEvents": [\n', '  "traceEvents": [\n' + raw + ",\n")
    a = perfscope.analyze(_write(tmp_path, text.encode()))
    table = a.tables[next(iter(a.tables))]
    assert set(names) <= set(table.names)
    (entry,) = _quality(a, "repaired")
    assert entry.count == 2 and "backslashes" in entry.reason


def test_raw_control_characters_in_names_are_kept_with_the_name(tmp_path):
    data = trace_bytes(_gpu_events()).replace(b'"name": "gemm"', b'"name": "ge\x01m\tm"', 1)
    a = perfscope.analyze(_write(tmp_path, data))
    table = a.tables[next(iter(a.tables))]
    assert "ge\x01m\tm" in set(table.names)
    assert only_row(a)["compute_us"] == pytest.approx(70)
    assert _quality(a, "repaired")[0].reason.startswith("raw control characters")


def test_latin1_bytes_in_a_kernel_name_are_read_as_latin1(tmp_path):
    data = trace_bytes(_gpu_events()).replace(b'"name": "k2"', b'"name": "k2 10\xb5s"', 1)
    a = perfscope.analyze(_write(tmp_path, data))
    assert "k2 10µs" in set(a.tables[next(iter(a.tables))].names)
    assert a.details.top_kernels[1].name == "k2 10µs"
    (entry,) = _quality(a, "repaired")
    assert entry.count == 1 and entry.examples == {"k2 10µs": 1}  # the string, as repaired


def test_non_standard_numbers_keep_the_header(tmp_path):
    # Python's json.dump writes NaN and Infinity unquoted: valid for Python, not JSON.
    events = _gpu_events() + [{"ph": "X", "cat": "cpu_op", "name": "aten::nan", "pid": 100, "tid": 1,
                               "ts": 30, "dur": float("nan")}]
    meta = {"distributedInfo": {"rank": 3, "world_size": 8}, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100", "bw": float("inf")}]}
    head = "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in meta.items())
    body = ",\n".join("  " + json.dumps(e) for e in events)
    text = "{\n" + head + '  "traceEvents": [\n' + body + "\n  ]\n}\n"
    assert "NaN" in text and "Infinity" in text
    a = perfscope.analyze(_write(tmp_path, text.encode()))
    t = a.traces[0]
    assert t.rank == 3 and t.world_size == 8 and t.devices == ["NVIDIA A100"]
    assert t.base_time_ns == 1_700_000_000_000_000_000
    dropped = _quality(a, "dropped")
    assert dropped[0].examples == {"aten::nan": 1}  # its dur became null: no usable time


def test_values_nested_past_the_decoder_depth_drop_that_event_only(tmp_path):
    text = trace_bytes(_gpu_events(), distributedInfo={"rank": 1, "world_size": 2}).decode()
    deep = '{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 100, "tid": 1, "ts": 5, "dur": 1, "args": {"x": ' \
           + "[" * 1500 + "]" * 1500 + "}}"
    text = text.replace('  "traceEvents": [\n', '  "traceEvents": [\n  ' + deep + ",\n")
    a = perfscope.analyze(_write(tmp_path, text.encode()))
    assert a.traces[0].rank == 1  # the header survives
    assert a.traces[0].events == 5
    (entry,) = _quality(a, "dropped")
    assert entry.count == 1 and "nested deeper" in entry.reason
    assert not any("truncated" in w for w in a.warnings)


def test_damage_that_cannot_be_repaired_names_file_line_and_column(tmp_path):
    data = trace_bytes(_gpu_events())
    lines = data.split(b"\n")
    k = next(i for i, line in enumerate(lines) if b'"k2"' in line)
    col = lines[k].index(b'"k2"') + 1  # 1-based column of the stray byte inserted before it
    lines[k] = lines[k].replace(b'"k2"', b'@"k2"', 1)
    path = _write(tmp_path, b"\n".join(lines))
    with pytest.raises(TraceDamagedError, match=rf"t\.json:{k + 1}:{col}: invalid JSON that cannot be repaired"):
        perfscope.analyze(path)


def test_truncation_is_still_recovered_and_the_cut_step_is_incomplete(tmp_path):
    events = []
    for n in range(3):  # steps [0,100) [100,200) [200,300), a kernel in each
        events += [step(n + 1, 100 * n, 100), *launch("gemm", 100 * n + 1, 100 * n + 10, 50, correlation=n + 1)]
    data = trace_bytes(events)
    cut = data.rfind(b'"name": "gemm"')  # inside the last kernel
    a = perfscope.analyze(_write(tmp_path, data[:cut]))
    assert list(a.steps["step"]) == [1, 2, 3]
    # the last complete event is step 3's launch call at 201: step 3 ends after it
    assert a.steps["status"].tolist() == ["ok", "ok", "incomplete"]
    assert "truncated" in a.steps["status_reason"].iloc[2]
    assert a.steps["verdict"].iloc[2] is None
    assert any("t.json: 1 file truncated: it ends early; read its 8 complete events" in w for w in a.warnings)  # 9 - the cut kernel
    check_partition(a.steps)


def test_zero_bytes_after_the_text_are_counted(tmp_path):
    a = perfscope.analyze(_write(tmp_path, trace_bytes(_gpu_events()) + b"\x00" * 4096))
    assert only_row(a)["compute_us"] == pytest.approx(70)
    assert any("4,096 bytes not read: zero bytes at the end" in w for w in a.warnings)


def corrupt_in_the_middle() -> bytes:
    """A gzip trace of 2,000 steps with a zeroed block inside its deflate stream."""
    events = []
    for n in range(2000):
        events += [step(n + 1, 100 * n, 100), runtime("cudaLaunchKernel", 100 * n + 1, 1, correlation=n + 1),
                   kernel("gemm", 100 * n + 10, 50, correlation=n + 1)]
    raw = bytearray(gzip.compress(trace_bytes(events), compresslevel=1))
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(64)
    return bytes(raw)


def test_a_gzip_stream_corrupt_in_the_middle_keeps_what_precedes_it(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(corrupt_in_the_middle())
    try:
        a = perfscope.analyze(path)
    except TraceFormatError as e:  # acceptable only as a clear one-line error
        assert "t.json.gz" in str(e)
        return
    assert 0 < a.traces[0].events < 3 * 2000
    assert any("gzip" in w for w in a.warnings) and any("truncated" in w for w in a.warnings)


def test_not_json_at_all_is_not_called_a_damaged_trace(tmp_path):
    path = _write(tmp_path, b"<html>oops</html>")
    with pytest.raises(TraceFormatError) as e:
        perfscope.analyze(path)
    assert not isinstance(e.value, TraceDamagedError)
    assert "t.json:1:1" in str(e.value)


def _kineto_layout(events) -> bytes:
    """Events as PyTorch's profiler writes them: one key per line, the name unescaped."""
    def one(e):
        lines = [f'    "{k}": "{v}"' if k == "name" else f'    {json.dumps(k)}: {json.dumps(v)}' for k, v in e.items()]
        return "  {\n" + ",\n".join(lines) + "\n  }"
    return ('{\n  "traceEvents": [\n' + ",\n".join(one(e) for e in events) + "\n  ]\n}\n").encode()


QUOTED_NAMES = ['say "hi" now', 'end"', '"', 'C:\\data "x"\\load', '"a", "b"']


def test_names_with_unescaped_quotes_are_read_literally_and_counted(tmp_path):
    ranges = [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 100, "tid": 1, "ts": 20 + 5 * k, "dur": 2}
              for k, n in enumerate(QUOTED_NAMES)]
    data = _kineto_layout(_gpu_events() + ranges)
    assert b'"name": "say "hi" now",' in data  # the damage as the profiler writes it
    a = perfscope.analyze(_write(tmp_path, data))
    table = a.tables[next(iter(a.tables))]
    assert set(QUOTED_NAMES) <= set(table.names)
    assert a.traces[0].events == 5 + len(QUOTED_NAMES)
    (entry,) = [e for e in _quality(a, "repaired") if "double quotes" in e.reason]
    assert entry.count == len(QUOTED_NAMES) and entry.unit == "string"
    assert any("strings repaired: double quotes inside a name" in w for w in a.warnings)


def test_a_line_of_sound_pairs_is_not_taken_for_a_quoted_name(tmp_path):
    # Two pairs on one line parse as they are; a repair elsewhere (N/A) must leave them alone.
    data = trace_bytes(_gpu_events()).replace(b'"correlation": 1}', b'"correlation": 1, "bw": N/A}', 1)
    data = data.replace(b'  "traceEvents": [\n', b'  "a": "x", "b": "y",\n  "traceEvents": [\n', 1)
    a = perfscope.analyze(_write(tmp_path, data))
    assert not [e for e in _quality(a) if "double quotes" in e.reason]
    assert a.traces[0].events == 5


def test_damage_after_a_quote_repair_is_placed_in_the_original_file(tmp_path):
    ranges = [{"ph": "X", "cat": "user_annotation", "name": 'a "b" c', "pid": 100, "tid": 1, "ts": 20, "dur": 2}]
    lines = _kineto_layout(ranges + _gpu_events()).split(b"\n")
    k = next(i for i, line in enumerate(lines) if b'"k2"' in line)
    col = lines[k].index(b'"k2"') + 1
    lines[k] = lines[k].replace(b'"k2"', b'@"k2"', 1)
    with pytest.raises(TraceDamagedError, match=rf"t\.json:{k + 1}:{col}: invalid JSON that cannot be repaired"):
        perfscope.analyze(_write(tmp_path, b"\n".join(lines)))


def test_a_profile_with_a_quoted_record_function_name_is_analyzed(tmp_path):
    import torch
    from torch.profiler import profile, record_function

    with profile() as prof:
        for name in ('load "batch"', 'end"'):
            with record_function(name):
                torch.ones(64).add_(1)
    path = tmp_path / "rank0.json"
    prof.export_chrome_trace(str(path))
    assert b'"say' not in path.read_bytes() and b'load "batch"' in path.read_bytes()  # written unescaped
    a = perfscope.analyze(path)
    table = a.tables[next(iter(a.tables))]
    assert {'load "batch"', 'end"'} <= set(table.names)
    assert [e for e in _quality(a, "repaired") if "double quotes" in e.reason][0].count == 2
