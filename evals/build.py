"""Write the eval's hand-made traces (``evals/traces/*.json.gz``) from first principles.

Each builder lays out steps whose shares are known by construction -- a DataLoader fetch of a
given length, kernels back to back or separated by launch gaps, an exposed all-reduce, a host
record of the waits for a core -- or damages a sound trace the way real files get damaged
(truncated, kernels lost, steps nested). ``evals/cases.yaml`` states what a careful reader of each
trace would conclude; ``evals/score.py`` grades perfscope's answers against it.

Run ``python evals/build.py`` after changing a builder; the files are committed so that the eval
reads the same bytes everywhere. Times are microseconds.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the synthetic-trace helpers the tests use

from tracegen import cpu_op, dataloader, kernel, launch, runtime, step, trace_bytes  # noqa: E402

from perfscope.record.host_steps import HOST_STEPS_KEY  # noqa: E402

STEPS = 6


def gpu_steps(*, fetch: int, kernels: int, kernel_us: int, gap_us: int, comm_us: int = 0) -> list[dict]:
    """GPU steps: a ``fetch`` µs DataLoader wait on the host, then ``kernels`` kernels of
    ``kernel_us`` each, each launched ``gap_us`` after the previous one ended (the GPU idles while
    the host launches), then an all-reduce of ``comm_us`` that nothing overlaps."""
    events, t, corr = [], 0, 0
    for n in range(STEPS):
        start, cursor = t, t + fetch
        if fetch:
            events.append(dataloader(t, fetch))
        for i in range(kernels):
            corr += 1
            events += launch(f"gemm_{i % 3}", cursor + gap_us - 5, cursor + gap_us, kernel_us, corr)
            cursor += gap_us + kernel_us
        if comm_us:
            corr += 1
            events += [runtime("cudaLaunchKernel", cursor + 1, 3, corr),
                       kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                              cursor + 5, comm_us, corr, stream=20)]
            cursor += 5 + comm_us
        length = cursor - start + 10
        events.append(step(n + 1, start, length))
        t = start + length
    return events


def cpu_steps(*, fetch: int, ops: int, op_us: int, gap_us: int) -> list[dict]:
    """CPU steps: a ``fetch`` µs DataLoader fetch, then ``ops`` operators of ``op_us`` each with
    ``gap_us`` of framework overhead before each."""
    events, t = [], 0
    for n in range(STEPS):
        start, cursor = t, t + fetch
        events.append(dataloader(t, fetch) if fetch else cpu_op("aten::empty", t, 1))
        cursor = max(cursor, t + 1)
        for i in range(ops):
            events.append(cpu_op(("aten::mm", "aten::add", "aten::relu")[i % 3], cursor + gap_us, op_us))
            cursor += gap_us + op_us
        length = cursor - start + 2
        events.append(step(n + 1, start, length))
        t = start + length
    return events


def host_record(events: list[dict], *, waits: float, fetch: int) -> dict:
    """The host record ``perfscope profile`` writes beside a trace: each step waited ``waits`` of
    its time outside the fetch for a core (a thread waiting for data sleeps, so the fetch holds
    no such wait)."""
    rows = []
    for e in events:
        if e["name"].startswith("ProfilerStep#"):
            wall = e["dur"]
            wait = int((wall - fetch) * waits)
            rows.append({"step": int(e["name"].split("#")[1]), "wall_us": wall, "thread_cpu_us": wall - wait - fetch,
                         "process_cpu_us": wall - wait - fetch, "run_queue_us": wait})
    return {HOST_STEPS_KEY: {"version": 1, "steps": rows}}


def nested_steps() -> list[dict]:
    """Step markers that overlap each other: no step has a sound extent."""
    events = cpu_steps(fetch=0, ops=10, op_us=100, gap_us=5)
    return [*events, step(3, 50, 2000), step(4, 900, 2000)]


def no_gpu_activity() -> list[dict]:
    """A CUDA run whose kernels the profiler lost: launches and no GPU event."""
    return [step(1, 0, 100_000), *(runtime("cudaLaunchKernel", 10 + 50 * i, 5, correlation=i + 1) for i in range(50))]


def truncated(data: bytes, keep: float) -> bytes:
    """The first ``keep`` of a file's bytes, as a run killed while writing leaves it."""
    return data[: int(len(data) * keep)]


def build() -> dict[str, bytes]:
    """Every eval trace: name -> bytes as written (before gzip)."""
    gpu_io = gpu_steps(fetch=3000, kernels=20, kernel_us=200, gap_us=10)
    cpu_io = cpu_steps(fetch=4000, ops=12, op_us=200, gap_us=10)
    cpu_compute = cpu_steps(fetch=0, ops=30, op_us=300, gap_us=5)
    contended = cpu_steps(fetch=300, ops=12, op_us=150, gap_us=10)  # 300 of ~2.2 ms: io only without waits
    return {
        "gpu-io": trace_bytes(gpu_io),
        "gpu-launch": trace_bytes(gpu_steps(fetch=0, kernels=200, kernel_us=4, gap_us=12)),
        "gpu-compute": trace_bytes(gpu_steps(fetch=0, kernels=40, kernel_us=500, gap_us=2)),
        "gpu-comm": trace_bytes(gpu_steps(fetch=0, kernels=20, kernel_us=300, gap_us=2, comm_us=4000)),
        "gpu-kernels-lost": trace_bytes(no_gpu_activity()),
        "cpu-io": trace_bytes(cpu_io),
        "cpu-compute": trace_bytes(cpu_compute),
        "cpu-launch": trace_bytes(cpu_steps(fetch=0, ops=300, op_us=4, gap_us=12)),
        "cpu-io-contended": trace_bytes(contended, **host_record(contended, waits=0.6, fetch=300)),
        "cpu-compute-contended": trace_bytes(cpu_compute, **host_record(cpu_compute, waits=0.5, fetch=0)),
        "cpu-io-truncated": truncated(trace_bytes(cpu_io), 0.7),
        "gpu-io-truncated": truncated(trace_bytes(gpu_io), 0.8),
        "cpu-nested-steps": trace_bytes(nested_steps()),
        "metadata-only": b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]}',
    }


def main() -> None:
    out = HERE / "traces"
    out.mkdir(exist_ok=True)
    for name, data in build().items():
        # mtime=0: the same bytes on every build
        (out / f"{name}.json.gz").write_bytes(gzip.compress(data, mtime=0))
    print(f"wrote {len(build())} traces to {out}")


if __name__ == "__main__":
    main()
