"""The trace model: Kineto JSON files read into compact columnar tables."""

from perfscope.trace.reader import RawTrace, find_trace_files, read_trace, worker_name
from perfscope.trace.assemble import build_table
from perfscope.trace.table import TraceTable

__all__ = ["RawTrace", "TraceTable", "build_table", "find_trace_files", "read_trace", "worker_name"]
