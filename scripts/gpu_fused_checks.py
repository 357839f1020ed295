"""The fused operators' checks of ``scripts/gpu_check.py`` (CUDA only).

* ``fused_window_attention``: ``fused_ops.window_attention`` on CUDA (the custom operator) against
  the eager twin, forward and backward in fp32, bf16 and fp16, shifted and unshifted, then its
  forward+backward time at Swin-T stage-1 shapes (512 windows x 49 tokens, 3 heads of 32; also
  4096 windows, fp32 and bf16) against the eager twin and the SDPA formulation, and the kernels
  that ran. Goal (issue): at least 5x over eager.
* ``fused_optimizers``: ``fused_ops.Lamb`` / ``Lars`` on CUDA against their per-parameter
  references after 3 steps, and their step time on ResNet-50's 161 parameter tensors.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}  # relative to the largest value
ATTENTION_GOAL = 5.0


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev, reps: int) -> float:
    for _ in range(min(3, reps)):
        fn()
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(dev)
    return (time.perf_counter() - t0) / reps


def check_window_attention(tmp: Path, device: str = "cuda", reps: int = 20, images: int = 8,
                           more_images: tuple[int, ...] = (64,)) -> tuple[str, str]:
    """The check (module docstring): ``images`` of Swin-T stage 1's 64 windows are timed (on CUDA
    also ``more_images``, where the GPU has more to do than launching kernels).
    ``device="cpu"`` runs the same code on the CPU (the tests do, with fewer images, so that the
    script is known to run before a GPU is lent)."""
    import torch

    from perfscope.fused_ops import window_attention, window_attention_reference
    from perfscope.fused_ops.attention import window_attention_sdpa
    from perfscope.fused_ops.swin import shift_mask

    dev = torch.device(device)
    worst = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shifted in (False, True):
            g = torch.Generator(device=dev).manual_seed(0)
            q, k, v = (torch.randn(3 * 16, 3, 49, 32, device=dev, generator=g).to(dtype).requires_grad_()
                       for _ in range(3))
            bias = (0.5 * torch.randn(3, 49, 49, device=dev, generator=g)).to(dtype).requires_grad_()
            mask = shift_mask(28, 28, 7, 3).to(dev, dtype) if shifted else None
            grad = torch.randn(q.shape, device=dev, generator=g).to(dtype)
            results = []
            for fn in (window_attention, window_attention_reference):
                for t in (q, k, v, bias):
                    t.grad = None
                out = fn(q, k, v, bias, mask)
                out.backward(grad)
                results.append([out.detach().float()] + [t.grad.float() for t in (q, k, v, bias)])
            err = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item() for a, b in zip(*results))
            worst[(str(dtype).removeprefix("torch."), shifted)] = err
    bad = {key: e for key, e in worst.items() if e > TOLERANCE[key[0]]}

    formulations = {"eager": window_attention_reference, "fused": window_attention, "sdpa": window_attention_sdpa}

    def steps(count, dtype=torch.float32):  # forward+backward of each formulation, ``count`` images of 64 windows
        q, k, v = (torch.randn(64 * count, 3, 49, 32, device=dev).to(dtype).requires_grad_() for _ in range(3))
        bias = torch.randn(3, 49, 49, device=dev).to(dtype).requires_grad_()
        mask = shift_mask(56, 56, 7, 3).to(dev, dtype)
        grad = torch.randn(64 * count, 3, 49, 32, device=dev).to(dtype)
        return {(name, label): (lambda fn=fn, m=m: fn(q, k, v, bias, m).backward(grad))
                for name, fn in formulations.items() for label, m in (("unshifted", None), ("shifted", mask))}

    times = {}  # (images, dtype, label) -> {formulation: s per call}
    cases = [(images, torch.float32)]
    if dev.type == "cuda":
        cases += [(count, torch.float32) for count in more_images] + [(count, torch.bfloat16) for count in more_images]
    for count, dtype in cases:
        run = steps(count, dtype)
        for label in ("unshifted", "shifted"):
            times[(count, str(dtype).removeprefix("torch."), label)] = {
                name: _timed(run[(name, label)], dev, reps) for name in formulations}
    ratios = {label: times[(images, "float32", label)]["eager"] / times[(images, "float32", label)]["fused"]
              for label in ("unshifted", "shifted")}
    activity = torch.profiler.ProfilerActivity.CUDA if dev.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    shifted_fused = steps(images)[("fused", "shifted")]
    with torch.profiler.profile(activities=[activity]) as prof:
        shifted_fused()
        _sync(dev)
    kernels = sorted({e.key for e in prof.key_averages() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA}
                     if dev.type == "cuda" else
                     {e.key for e in prof.key_averages() if "attention" in e.key.lower() or "fmha" in e.key.lower()})
    per_call = "; ".join(f"{count} images {dtype} {label}: " + ", ".join(f"{name} {1e6 * t:.0f} us" for name, t in by.items())
                         for (count, dtype, label), by in times.items())
    number = (f"max rel err {max(worst.values()):.1e}; fwd+bwd vs eager: unshifted {ratios['unshifted']:.2f}x, "
              f"shifted {ratios['shifted']:.2f}x (goal {ATTENTION_GOAL:g}x); {per_call}; "
              f"kernels: {', '.join(kernels)[:160] or 'none named'}")
    if bad:
        return "FAIL", number + f"; over tolerance: {bad}"
    return ("PASS" if min(ratios.values()) >= ATTENTION_GOAL else "FAIL"), number


def check_optimizers(tmp: Path, device: str = "cuda", reps: int = 10, tensors: int | None = None) -> tuple[str, str]:
    """The check (module docstring), on the first ``tensors`` of ResNet-50's (all by default);
    ``device="cpu"`` as for :func:`check_window_attention`."""
    import torch

    from bench_optimizers import resnet50_shapes
    from perfscope.fused_ops import Lamb, Lars
    from perfscope.fused_ops.optimizer_reference import reference_lamb, reference_lars

    dev = torch.device(device)

    def params():
        g = torch.Generator(device=dev).manual_seed(0)
        out = []
        for shape in resnet50_shapes()[:tensors]:
            p = (0.05 * torch.randn(shape, device=dev, generator=g)).requires_grad_()
            p.grad = 0.01 * torch.randn(shape, device=dev, generator=g)
            out.append(p)
        return out

    numbers, ok = [], True
    for name, make, ref in (
        ("lamb", lambda p: Lamb(p, lr=1e-3, weight_decay=0.01),
         lambda p, s: reference_lamb(p, s, 1e-3, (0.9, 0.999), 1e-6, 0.01)),
        ("lars", lambda p: Lars(p, lr=0.1, weight_decay=1e-4),
         lambda p, s: reference_lars(p, s, 0.1, 0.9, 1e-4, 0.001, 1e-8)),
    ):
        fused_p, ref_p, state = params(), params(), {}
        opt = make(fused_p)
        with torch.no_grad():
            for _ in range(3):
                opt.step()
                ref(ref_p, state)
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(fused_p, ref_p))
        ok &= err < 1e-4

        def ref_step(p=ref_p, s=state, ref=ref):
            with torch.no_grad():
                ref(p, s)
        ratio = _timed(ref_step, dev, reps) / _timed(opt.step, dev, reps)
        numbers.append(f"{name}: rel err {err:.1e}, {ratio:.2f}x over per-parameter")
        ok &= ratio >= 1.5
    return ("PASS" if ok else "FAIL"), "; ".join(numbers)
