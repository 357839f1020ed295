"""The kernel or the ATen formulation of window attention: whichever is faster on this machine, per shape.

The kernel is built for the CPU it runs on (``-march=native``), and what that gives differs by
CPU: at Swin-T's stage-1 shapes, fp32, one thread, it ran 1.75x eager PyTorch where the CPU has
AVX-512 and 0.30x in an AVX2 build (GCC lowers its 16-float vectors to stack traffic there: see
``docs/fused_ops.md``). So the first call of a shape times both, forward and backward, interleaved
(one warm-up call each, then :data:`ROUNDS` rounds), on that call's own inputs, and the faster
runs from then on: the operator is never slower than what it replaces by more than the timing's
noise.

Choices are kept per process and in ``choices.json`` in the kernel's cache folder
(:func:`perfscope.fused_ops.native.cache_dir`, checked as the library is), keyed by the CPU, the
library built for it, the intra-op threads, the dtype and the shape; a later process reads them
instead of timing again. ``PERFSCOPE_NATIVE_CHOICE=kernel`` (or ``aten``) skips the timing and
runs that path (the kernel's own tests use ``kernel``). :func:`perfscope.fused_ops.native.status`
names each choice with its timings.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from perfscope.atomic import RecordFileError, read_bounded
from perfscope.fused_ops import native

ROUNDS = 3  # timed calls of each, after one warm-up each
FILE = "choices.json"
MAX_FILE_BYTES = 1 << 20  # a few hundred shapes; anything larger is not ours
MAX_KEPT = 512  # choices kept in the file (the oldest go first)
PATHS = ("kernel", "aten")

_lock = threading.Lock()
_chosen: dict[str, dict] = {}  # key -> {"path", "kernel_ms", "aten_ms", "shape"}


@dataclass(frozen=True)
class Formulation:
    """The ATen formulation's two halves, as the operator defines them (``(q, k, v, bias, mask,
    scale) -> (out, probs)`` and ``(grad_out, q, k, v, probs, scale) -> (grad_q, grad_k, grad_v,
    grad_bias)``)."""

    forward: Callable
    backward: Callable


def _forced() -> str | None:
    value = os.environ.get("PERFSCOPE_NATIVE_CHOICE", "").strip().lower()
    return value if value in PATHS else None


def key(q: torch.Tensor, windows: int) -> str:
    """The choice's key: the library (its build flags and CPU are in its name), the intra-op
    threads, the dtype and ``(B * nW, heads, N, head_dim)`` with the mask's windows."""
    bw, heads, n, d = q.shape
    library = native.library_name() or "-"
    return f"{library}|t{torch.get_num_threads()}|{str(q.dtype).removeprefix('torch.')}|{bw}x{heads}x{n}x{d}|w{windows}"


def kernel_wins(q, k, v, bias, mask, scale: float, aten: Formulation) -> bool:
    """Whether the kernel runs this forward (and its backward): the kept choice for the shape,
    else both timed now on these inputs (:func:`decide`)."""
    forced = _forced()
    if forced is not None:
        return forced == "kernel"
    name = key(q, 1 if mask is None else mask.shape[0])
    with _lock:
        if name not in _chosen:
            _load()
        if name not in _chosen:
            _chosen[name] = decide(q, k, v, bias, mask, scale, aten)
            _save(name)
        return _chosen[name]["path"] == "kernel"


def kernel_chosen(q, windows: int) -> bool:
    """The backward's side: the path its forward chose (the kernel where none was chosen)."""
    forced = _forced()
    if forced is not None:
        return forced == "kernel"
    entry = _chosen.get(key(q, windows))
    return entry is None or entry["path"] == "kernel"


def decide(q, k, v, bias, mask, scale: float, aten: Formulation) -> dict:
    """Time the kernel's forward and backward against the ATen formulation's on these inputs,
    interleaved; ``{"path", "kernel_ms", "aten_ms", "shape"}`` (median milliseconds a call)."""
    with torch.no_grad():
        q, k, v, bias = (t.detach() for t in (q, k, v, bias))
        mask = None if mask is None else mask.detach()

        def kernel() -> None:
            out, probs = native.forward(q, k, v, bias, mask, scale)
            native.backward(out, q, k, v, probs, scale)

        def formulation() -> None:
            out, probs = aten.forward(q, k, v, bias, mask, scale)
            aten.backward(out.contiguous(), q, k, v, probs, scale)

        times: dict[str, list[float]] = {"kernel": [], "aten": []}
        runs = {"kernel": kernel, "aten": formulation}
        for fn in runs.values():
            fn()  # warm-up: first-touch of the scratch memory, oneDNN's primitive cache
        for _ in range(ROUNDS):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    med = {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}
    return {"path": "kernel" if med["kernel"] <= med["aten"] else "aten", "kernel_ms": round(med["kernel"], 3),
            "aten_ms": round(med["aten"], 3), "shape": list(q.shape)}


def choices() -> dict[str, dict]:
    """The choices made or read in this process, by key (a copy)."""
    with _lock:
        return {k: dict(v) for k, v in _chosen.items()}


def describe() -> str:
    """The choices in one line each: shape, dtype, the path and both timings."""
    lines = []
    for name, c in sorted(choices().items()):
        _, threads, dtype, shape, windows = name.split("|")
        path = "the kernel" if c["path"] == "kernel" else "the ATen formulation"
        lines.append(f"{dtype} {shape} ({windows.removeprefix('w')} mask windows, {threads.removeprefix('t')} "
                     f"threads): {path} (kernel {c['kernel_ms']:.2f} ms, ATen {c['aten_ms']:.2f} ms a call)")
    return "\n".join(lines)


def _path():
    return native.cache_dir() / FILE


def _valid(entry) -> bool:
    return (isinstance(entry, dict) and entry.get("path") in PATHS
            and all(isinstance(entry.get(f), (int, float)) and not isinstance(entry.get(f), bool)
                    for f in ("kernel_ms", "aten_ms")))


def _read_stored(path) -> dict[str, dict]:
    """The valid choices of the file at ``path``, checked as the library is and read to
    :data:`MAX_FILE_BYTES` at most.

    Raises:
        OSError, ValueError, Untrusted, RecordFileError: missing, unreadable, not ours, too large
            or not JSON (the callers keep to memory then).
    """
    native.check_cache_file(path)
    stored = json.loads(read_bounded(path, MAX_FILE_BYTES))
    if not isinstance(stored, dict):
        return {}
    return {name: entry for name, entry in stored.items() if isinstance(name, str) and _valid(entry)}


def _load() -> None:
    """Read the kept choices (a file that is not ours, too large or malformed is ignored)."""
    try:
        stored = _read_stored(_path())
    except (OSError, ValueError, native.Untrusted, RecordFileError):
        return
    for name, entry in stored.items():
        _chosen.setdefault(name, entry)


def _save(name: str) -> None:
    """Add one choice to the file (atomically; silently kept in memory only where it cannot be
    written: the choice is remade by the next process)."""
    path = _path()
    try:
        native.check_cache_folder()
        stored = _read_stored(path) if path.exists() else {}
        stored[name] = _chosen[name]
        while len(stored) > MAX_KEPT:
            stored.pop(next(iter(stored)))
        tmp = path.with_name(f".{FILE}.{os.getpid()}.{hashlib.sha1(name.encode()).hexdigest()[:8]}")
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
                json.dump(stored, f)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()  # what a failed write left
    except (OSError, ValueError, native.Untrusted, RecordFileError):
        return


native.add_status_lines(describe)


def forget() -> None:
    """Drop this process's choices (the tests time again)."""
    with _lock:
        _chosen.clear()
