"""Tiny helpers that write synthetic Kineto (PyTorch profiler) traces for tests.

Every helper returns one Chrome-trace duration event (``"ph": "X"``); times are microseconds.
The default spellings are those of current Kineto (``cpu_op``, ``kernel``, ``gpu_memcpy``...);
pass ``cat=`` (and ``tid="stream 7"``) to write the capitalised 2021 ones.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

MAIN_TID = 1
HOST_PID = 100


def event(cat, name, ts, dur, pid=HOST_PID, tid=MAIN_TID, **args) -> dict:
    """One ``"ph": "X"`` event; ``None`` args are left out."""
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    args = {k: v for k, v in args.items() if v is not None}
    if args:
        e["args"] = args
    return e


def cpu_op(name, ts, dur, tid=MAIN_TID, cat="cpu_op"):
    return event(cat, name, ts, dur, tid=tid)


def annotation(name, ts, dur, tid=MAIN_TID, cat="user_annotation"):
    """A record_function range: ``ProfilerStep#N``, ``Optimizer.step#SGD.step``, DataLoader..."""
    return event(cat, name, ts, dur, tid=tid)


def step(n, ts, dur, tid=MAIN_TID, cat="user_annotation"):
    return annotation(f"ProfilerStep#{n}", ts, dur, tid=tid, cat=cat)


def dataloader(ts, dur, tid=MAIN_TID, cat="user_annotation"):
    return annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts, dur, tid=tid, cat=cat)


def runtime(name, ts, dur, correlation, tid=MAIN_TID, cat="cuda_runtime"):
    """A CUDA runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``...) linked by ``correlation``."""
    return event(cat, name, ts, dur, tid=tid, correlation=correlation)


def _gpu(cat, name, ts, dur, correlation, stream, device, tid, with_args):
    if not with_args:  # 2021 layout: device in pid, stream in tid ("stream 7")
        return event(cat, name, ts, dur, pid=device, tid=tid if tid is not None else f"stream {stream}",
                     correlation=correlation)
    return event(cat, name, ts, dur, pid=device, tid=stream if tid is None else tid,
                 correlation=correlation, device=device, stream=stream)


def kernel(name, ts, dur, correlation=None, stream=7, device=0, cat="kernel", tid=None, with_args=True):
    return _gpu(cat, name, ts, dur, correlation, stream, device, tid, with_args)


def memcpy(name, ts, dur, correlation=None, stream=7, device=0, cat="gpu_memcpy", tid=None, with_args=True):
    return _gpu(cat, name, ts, dur, correlation, stream, device, tid, with_args)


def memset(name, ts, dur, correlation=None, stream=7, device=0, cat="gpu_memset", tid=None, with_args=True):
    return _gpu(cat, name, ts, dur, correlation, stream, device, tid, with_args)


def launch(name, launch_ts, ts, dur, correlation, stream=7, device=0, call_dur=1):
    """``cudaLaunchKernel`` at ``launch_ts`` on the main thread and the kernel it runs at ``ts``."""
    return [runtime("cudaLaunchKernel", launch_ts, call_dur, correlation),
            kernel(name, ts, dur, correlation, stream=stream, device=device)]


def trace_bytes(events, **meta) -> bytes:
    """The trace as Kineto lays it out: metadata first, then one event per line."""
    head = "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in meta.items())
    body = ",\n".join("  " + json.dumps(e) for e in events)
    return ("{\n" + head + '  "traceEvents": [\n' + body + "\n  ]\n}\n").encode()


def write_trace(path, events, **meta) -> Path:
    """Write ``events`` (plus top-level ``meta`` such as ``distributedInfo``) to ``path``;
    gzip-compressed when the name ends in ``.gz``."""
    path = Path(path)
    data = trace_bytes(events, **meta)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
