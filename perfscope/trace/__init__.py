"""The trace model: Kineto JSON files read into compact columnar tables."""

from perfscope.trace.reader import RawTrace, find_trace_files, read_trace, worker_name
from perfscope.trace.table import TraceTable, build_table

__all__ = ["RawTrace", "TraceTable", "build_table", "find_trace_files", "read_trace", "worker_name"]
