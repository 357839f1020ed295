"""The analysis builds the record's structs at their source: ``details`` and its sections,
``traces[]`` and ``skipped[]`` are the schema's structs, and ``summary.json`` holds exactly what
msgspec encodes of them (a sparse struct without the fields it lacks, every number a plain one)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import perfscope
from perfscope.record.schema import Details, Skipped, TraceEntry
from tracegen import cpu_op, step, write_trace

EVAL_TRACES = Path(__file__).resolve().parents[1] / "evals" / "traces"
# The sections that stay mappings, each for the reason docs/architecture.md gives (a device rank's
# memory fields are not a host rank's; telemetry without samples is `{"skipped": why}`), and the
# mappings the schema declares as such.
MAPPINGS = {"memory", "telemetry", "knobs", "last_counts"}
# What the summary adds to the analysis's details (the price and the energy of a step).
ADDED_BY_THE_SUMMARY = {"cost", "energy"}


def _encoded(value):
    return msgspec.json.decode(msgspec.json.encode(value))


@pytest.mark.parametrize("name", ["gpu-comm", "gpu-io", "gpu-kernels-lost", "cpu-io", "cpu-nested-steps"])
def test_the_summary_holds_the_analysis_structs_as_msgspec_encodes_them(name):
    a = perfscope.analyze(EVAL_TRACES / f"{name}.json.gz")
    summary = a.summary()
    assert isinstance(a.details, Details) and a.traces and all(isinstance(t, TraceEntry) for t in a.traces)
    for field in msgspec.structs.fields(Details):
        value = getattr(a.details, field.name)
        if field.name in MAPPINGS or value is None or isinstance(value, (bool, int, float, str)):
            continue
        items = value if isinstance(value, list) else [value]
        assert all(isinstance(v, msgspec.Struct) for v in items), field.name
    encoded = _encoded(a.details)
    written = summary["details"]
    assert list(written) == list(encoded)  # the schema's order
    assert {k: v for k, v in written.items() if k not in ADDED_BY_THE_SUMMARY} == \
        {k: v for k, v in encoded.items() if k not in ADDED_BY_THE_SUMMARY}
    assert summary["traces"] == _encoded(a.traces)


def test_a_sparse_part_is_written_without_the_fields_its_trace_lacks(tmp_path):
    path = write_trace(tmp_path / "t.json", [step(1, 0, 100), cpu_op("aten::mm", 10, 50)],
                       distributedInfo={"rank": 0, "world_size": 1})
    (trace,) = perfscope.analyze(path).summary()["traces"]
    assert trace["distributed_info"] == {"rank": 0, "world_size": 1}  # no backend, no nccl_version: not null
    assert trace["memory_capacity"] == {}  # no host record


def test_a_file_left_out_of_a_directory_is_a_skipped_entry(tmp_path):
    write_trace(tmp_path / "rank0.json", [step(1, 0, 100), cpu_op("aten::mm", 10, 50)])
    (tmp_path / "rank1.json").write_text('{"traceEvents": [', encoding="utf-8")
    a = perfscope.analyze(tmp_path)
    (skipped,) = a.skipped
    assert isinstance(skipped, Skipped) and skipped.path.endswith("rank1.json")
    assert a.summary()["skipped"] == [_encoded(skipped)]


def test_the_kineto_header_is_read_once_into_structs_its_damaged_parts_as_absent(tmp_path):
    from perfscope.trace.header import Device, ProcessGroupConfig
    from perfscope.trace.load import read_table

    devices = [{"name": "NVIDIA A100", "totalGlobalMem": 80 * 2**30, "computeMajor": 8, "computeMinor": 0,
                "warpSize": 32}, {"name": ["x"], "totalGlobalMem": "big", "computeMajor": 9.5}, "not a device"]
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}, {"pg_name": 1, "ranks": "0,1"},
              7]
    path = write_trace(tmp_path / "rank0.json", [step(1, 0, 100), cpu_op("aten::mm", 10, 50)],
                       deviceProperties=devices,
                       distributedInfo={"rank": 0, "world_size": 2, "backend": "nccl", "pg_config": groups})
    table = read_table(path)
    assert table.device_properties == [
        Device(name="NVIDIA A100", total_memory_bytes=80 * 2**30, compute_major=8, compute_minor=0, warp_size=32),
        Device()]  # every field of the second of the wrong type; the third not an object
    assert table.process_groups == [ProcessGroupConfig(pg_name="0", pg_desc="default_pg", pg_size=2, ranks=[0, 1]),
                                    ProcessGroupConfig(pg_name=1)]
    assert any("2 deviceProperties entries" in w for w in table.warnings)
    (trace,) = perfscope.analyze(path).summary()["traces"]
    assert trace["devices"] == ["NVIDIA A100"]
    assert trace["distributed_info"] == {"backend": "nccl", "rank": 0, "world_size": 2}  # pg_config read apart
