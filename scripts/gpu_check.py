"""Exercise the acceleration runtime's CUDA paths on one GPU and print a verdict table.

Checks (each prints PASS, FAIL or SKIP with a number and a reason):

* ``device_prefetch_overlap``: a short loop profiled by perfscope (``perfscope.collect.collect``),
  batches fed by :class:`perfscope.runtime.data.DevicePrefetcher` from pinned memory; perfscope's
  own analysis (``perfscope.analyze``) of the trace must show the host-to-device copies hidden
  under compute (``exposed_h2d_us`` small next to ``h2d_us``), against a baseline with blocking copies.
* ``fp16_O2_scaling``: ``perfscope.accelerate`` at ``amp_level: O2, amp_dtype: fp16``: half weights,
  fp32 norm layers and master weights, loss going down, no NaN, the GradScaler's scale updated.
* ``tf32``: ``patched({"tf32": True})`` changes fp32 matmul results slightly (TF32 rounding) and
  speeds them up; the flag is restored afterwards.
* ``nccl_hierarchical_hook``: a world-size-1 NCCL group, DDP built under
  ``patched({"hierarchical_allreduce": True, "grad_compression": "fp16", ...})``: the hierarchical
  hook is registered, runs on every backward, and gives the local gradient.

* ``fused_window_attention``, ``fused_optimizers``: the fused operators on CUDA, numerics against
  their references and speed (``scripts/gpu_fused_checks.py``).
* ``memory_and_telemetry``: the prefetch loop profiled once more: the summary's memory view must be
  the CUDA allocator's (peak reserved above allocated, both above the 32 MiB batches, under the
  device's capacity), and NVML telemetry sampled beside the window, aligned through the step starts,
  with utilisation per step and the sampler under 1% of a core.

Without CUDA every check is SKIP and the exit status is 0; any FAIL makes it 1. Usage::

    python scripts/gpu_check.py            # about a minute on one GPU
    python scripts/gpu_check.py --keep DIR # and copy the profiled loops' traces into DIR
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHECKS = ("device_prefetch_overlap", "fp16_O2_scaling", "tf32", "nccl_hierarchical_hook", "fused_window_attention",
          "fused_optimizers", "memory_and_telemetry")


KEEP: Path | None = None  # --keep DIR: where the profiled loops' traces are copied


class Skip(Exception):
    """The check cannot run here (the reason is the message)."""


PREFETCH_SCRIPT = """
import sys, torch, perfscope
from perfscope.runtime.data import DevicePrefetcher
prefetch, sync, inner = sys.argv[1] == "1", sys.argv[2] == "1", int(sys.argv[3])
dev = torch.device("cuda")
batches = [torch.randn(2048, 4096).pin_memory() for _ in range(4)]   # 32 MiB each
w = torch.randn(4096, 4096, device=dev) / 64
def loader():
    for i in range(24):
        yield batches[i % len(batches)]
it = DevicePrefetcher(loader(), dev) if prefetch else (b.to(dev) for b in loader())
for x in it:
    y = x @ w
    for _ in range(inner):
        y = torch.tanh(y @ w)
    if sync:
        y.sum().item()   # a loss read every step, as many loops do: the host waits for the GPU
    perfscope.step()
torch.cuda.synchronize()
"""


def _profiled_loop(tmp: Path, name: str, prefetch: bool, sync: bool, inner: int):
    """The loop above, profiled by perfscope: ``(summary, error)``."""
    import perfscope
    from perfscope.collect import ProfileSchedule, collect

    script = tmp / "prefetch_loop.py"
    script.write_text(PREFETCH_SCRIPT)
    args = ["1" if prefetch else "0", "1" if sync else "0", str(inner)]
    result = collect(script, args, out_dir=tmp / name, schedule=ProfileSchedule(skip_first=4, warmup=2, active=8))
    if result.error or not result.trace_files:
        return None, f"profiled loop failed: {result.error or 'no trace'}"
    if KEEP is not None:
        trace = Path(result.trace_files[0])
        shutil.copyfile(trace, KEEP / f"{name}{''.join(trace.suffixes[-2:])}")
    return perfscope.analyze(result.trace_files[0]).summary(), None


def check_prefetch(tmp: Path) -> tuple[str, str]:
    """Exposed share of the host-to-device copy time: blocking copies, then DevicePrefetcher in a
    loop that reads its loss every step and in one that does not. Where the host waits for the
    GPU every step, the next batch's copy starts while the host is still on its way to the next
    launch, and that part of it stays exposed; without the wait the copies run under compute."""
    try:
        import perfscope.runtime.data  # noqa: F401
    except ImportError as exc:
        raise Skip(f"perfscope.runtime.data not importable: {exc}") from None
    shares = {}
    for name, label, prefetch, sync in (("blocking", "blocking", False, True),
                                        ("prefetch_sync", "prefetch, loss read each step", True, True),
                                        ("prefetch_nosync", "prefetch, no per-step read", True, False)):
        summary, error = _profiled_loop(tmp, name, prefetch, sync, 6)
        if error:
            return "FAIL", error
        steps = summary["steps"]
        h2d = sum(s.get("h2d_us", 0) or 0 for s in steps)
        exposed = sum(s.get("exposed_h2d_us", 0) or 0 for s in steps)
        if h2d <= 0:
            return "FAIL", f"no host-to-device copies in the trace ({label}); step keys: {sorted(steps[0])[:8]}..."
        shares[label] = (exposed / h2d, h2d / len(steps))
    number = "exposed/h2d: " + ", ".join(f"{label} {share:.0%}" for label, (share, _) in shares.items())
    number += f" (h2d {shares['blocking'][1]:.0f} us/step)"
    base = shares["blocking"][0]
    ok = shares["prefetch, no per-step read"][0] <= 0.25 and shares["prefetch, loss read each step"][0] < 0.5 * base
    return ("PASS" if ok else "FAIL"), number


def check_memory_telemetry(tmp: Path) -> tuple[str, str]:
    """The memory view and NVML telemetry of a loop with steps of about 0.2 s (150 products of
    2048 x 4096 x 4096 in fp32), so that the 10 per second samples cover each step."""
    summary, error = _profiled_loop(tmp, "memtel", True, True, 150)
    if error:
        return "FAIL", error
    d = summary["details"]
    m, t = d.get("memory") or {}, d.get("telemetry") or {}
    if m.get("kind") != "device":
        return "FAIL", f"memory view is {m.get('kind')!r}, not the device's"
    (r,) = m["ranks"]
    mem_ok = 32 * 2**20 < r["peak_allocated_bytes"] <= r["peak_reserved_bytes"] < (m["capacity_bytes"] or 0)
    number = (f"peak allocated {r['peak_allocated_bytes'] / 2**20:.0f} MiB, reserved {r['peak_reserved_bytes'] / 2**20:.0f} "
              f"MiB of {m['capacity_bytes'] / 2**30:.0f} GiB")
    if t.get("skipped"):
        return "FAIL", number + f"; telemetry skipped: {t['skipped']}"
    align = (t.get("alignment") or [{}])[0]
    tel_ok = (t.get("samples", 0) >= 5 and (t.get("gpu_util_pct") or 0) >= 50 and align.get("source") == "step starts"
              and (t.get("sampler_cpu_share") or 0) < 0.01)
    number += (f"; {t.get('samples')} NVML samples, utilisation {t.get('gpu_util_pct') or 0:.0f}%, SM clock "
               f"{(t.get('sm_clock_mhz') or {}).get('median')}, offset {align.get('offset_us', 0):.0f} us "
               f"({align.get('source')}), sampler {100 * (t.get('sampler_cpu_share') or 0):.2f}% of a core, "
               f"throttled {100 * (t.get('throttled_share') or 0):.0f}%")
    return ("PASS" if mem_ok and tel_ok else "FAIL"), number


def check_fp16_o2(tmp: Path) -> tuple[str, str]:
    import torch
    from torch import nn

    import perfscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt, _ = perfscope.accelerate(model, opt, config={"amp_level": "O2", "amp_dtype": "fp16"})
    acc = perfscope.accelerator()
    if acc.scaler is None:
        return "FAIL", "no GradScaler for fp16"
    acc.scaler.set_growth_interval(10)  # so the scale visibly updates within the run
    dtypes = {type(m).__name__: m.weight.dtype for m in model.modules() if hasattr(m, "weight")}
    masters = {p.dtype for g in opt.param_groups for p in g["params"]}
    x = torch.randn(512, 64, device="cuda")
    target = (x[:, :8].sum(1, keepdim=True)).cuda()
    scales, losses = [acc.scaler.get_scale()], []
    for _ in range(60):
        with perfscope.autocast():
            loss = nn.functional.mse_loss(model(x).float(), target)
        perfscope.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        scales.append(acc.scaler.get_scale())
    problems = []
    if dtypes.get("Linear") != torch.float16:
        problems.append(f"Linear weights {dtypes.get('Linear')}")
    if dtypes.get("LayerNorm") != torch.float32:
        problems.append(f"LayerNorm weights {dtypes.get('LayerNorm')}")
    if masters != {torch.float32}:
        problems.append(f"optimizer params {masters}")
    if any(math.isnan(v) for v in losses):
        problems.append("NaN loss")
    if not losses[-1] < 0.5 * losses[0]:
        problems.append(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} (not halved)")
    if len(set(scales)) < 2:
        problems.append(f"scale never updated ({scales[0]})")
    number = f"loss {losses[0]:.3f}->{losses[-1]:.3f}, scale {scales[0]:.0f}->{scales[-1]:.0f}, skipped {acc.steps_skipped}"
    return ("FAIL" if problems else "PASS"), number + ("; " + "; ".join(problems) if problems else "")


def check_tf32(tmp: Path) -> tuple[str, str]:
    import torch

    from perfscope.runtime.patching import patched

    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise Skip(f"TF32 needs compute capability 8.0+, this GPU is {major}.{minor}")
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")

    def run():
        (a @ b).sum().item()  # warm up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        return c, (time.perf_counter() - t0) / 20

    before = torch.backends.cuda.matmul.allow_tf32
    with patched({"tf32": False}):
        exact, t_fp32 = run()
    with patched({"tf32": True}):
        fast, t_tf32 = run()
    restored = torch.backends.cuda.matmul.allow_tf32 == before
    ref = (a.double() @ b.double())
    err_fp32 = ((exact.double() - ref).abs().max() / ref.abs().max()).item()
    err_tf32 = ((fast.double() - ref).abs().max() / ref.abs().max()).item()
    number = f"rel err fp32 {err_fp32:.1e} vs tf32 {err_tf32:.1e}; speedup {t_fp32 / t_tf32:.1f}x"
    ok = err_tf32 > 5 * err_fp32 and err_tf32 < 1e-2 and restored
    return ("PASS" if ok else "FAIL"), number + ("" if restored else "; flag not restored")


def check_nccl_hierarchical(tmp: Path) -> tuple[str, str]:
    import functools

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not dist.is_nccl_available():
        raise Skip("this torch has no NCCL")
    try:
        import perfscope.runtime.hierarchical as hier
    except ImportError as exc:
        raise Skip(f"perfscope.runtime.hierarchical not importable: {exc}") from None
    from perfscope.runtime.patching import patched

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    original = hier.hierarchical_allreduce_hook
    calls = []

    @functools.wraps(original)
    def counting(state, bucket):
        calls.append(bucket.index())
        return original(state, bucket)

    hier.hierarchical_allreduce_hook = counting  # the patch imports the hook when it registers it
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 16)).cuda()
        ref = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 16)).cuda()
        ref.load_state_dict(model.state_dict())
        with patched({"hierarchical_allreduce": True, "grad_compression": "fp16", "bucket_cap_mb": 1}) as report:
            ddp = DDP(model, device_ids=[0])
        x = torch.randn(32, 256, device="cuda")
        for _ in range(3):
            ddp.zero_grad()
            ddp(x).square().mean().backward()
        ref(x).square().mean().backward()
        torch.cuda.synchronize()
        err = max((p.grad - q.grad / 1).abs().max().item() / (q.grad.abs().max().item() + 1e-12)
                  for p, q in zip(ddp.module.parameters(), ref.parameters()))
    finally:
        hier.hierarchical_allreduce_hook = original
        dist.destroy_process_group()
    ok = calls and report.ddp_modules == 1 and err < 1e-2
    number = f"hook ran {len(calls)}x over 3 steps, grad rel err {err:.1e} (fp16 compressed), bucket {ddp.bucket_bytes_cap >> 20} MiB"
    return ("PASS" if ok else "FAIL"), number


def main() -> int:
    global KEEP
    parser = argparse.ArgumentParser(description="Exercise perfscope's CUDA paths on one GPU.")
    parser.add_argument("--keep", type=Path, help="copy the profiled loops' traces into this folder")
    KEEP = parser.parse_args().keep
    if KEEP is not None:
        KEEP.mkdir(parents=True, exist_ok=True)
    try:
        import torch
    except ImportError:
        torch = None
    cuda = torch is not None and torch.cuda.is_available()
    from gpu_fused_checks import check_optimizers, check_window_attention

    funcs = dict(zip(CHECKS, (check_prefetch, check_fp16_o2, check_tf32, check_nccl_hierarchical,
                              check_window_attention, check_optimizers, check_memory_telemetry)))
    rows = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="perfscope-gpu-check-") as tmp:
        for name in CHECKS:
            t0 = time.perf_counter()
            if not cuda:
                rows.append((name, "SKIP", "no CUDA device (torch.cuda.is_available() is False)", 0.0))
                continue
            try:
                verdict, number = funcs[name](Path(tmp))
            except Skip as exc:
                verdict, number = "SKIP", str(exc)
            except Exception as exc:  # noqa: BLE001 - a crashing check is a failed check
                traceback.print_exc(file=sys.stderr)
                verdict, number = "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            rows.append((name, verdict, number, time.perf_counter() - t0))
    device = torch.cuda.get_device_name(0) if cuda else "no CUDA"
    print(f"perfscope gpu_check: {device}, torch {torch.__version__ if torch else 'missing'}, "
          f"{time.perf_counter() - t_start:.1f} s")
    width = max(len(n) for n in CHECKS)
    print(f"{'check':<{width}}  verdict  time    result")
    for name, verdict, number, seconds in rows:
        print(f"{name:<{width}}  {verdict:<7}  {seconds:5.1f}s  {number}")
    return 1 if any(v == "FAIL" for _, v, _, _ in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
