"""Benchmark: fused_ops.Lamb and fused_ops.Lars step time against their per-parameter references
(fused_ops/optimizer_reference.py: the papers' algorithms one tensor at a time), on ResNet-50's
parameter tensors (161 tensors, 25.6 M values: convolutions, batch-norm scales and shifts, the
classifier), fp32 on CPU, and against an ordinary *in-place* per-parameter loop (:func:`inplace_lamb`,
:func:`inplace_lars`: what a careful user would write -- state updated in place, the trust ratio
kept on the device with ``torch.where`` instead of a host sync, no temporaries beyond one update
buffer). torch.optim.AdamW and SGD with momentum (their foreach steps) are timed beside them as the
cost of a step without trust ratios.

Steps this large are bound by memory, not by launches: each variant's time is also given against
its *byte floor*, the bytes the algorithm must move at the least (LAMB reads the parameter, its
gradient and both moments and writes three of them back: 28 bytes a value in fp32; LARS reads
three and writes two: 20 bytes) over the streaming bandwidth measured in the same rounds (``stream``:
``torch._foreach_add_`` of the gradients into the parameters, 12 bytes a value). A variant at its
floor cannot be made faster by fusing more, only by moving fewer bytes.

The variants run interleaved (A B C ... A B C ...) for ``--rounds`` rounds of ``--reps`` steps,
so a busy machine slows all of them alike; the medians' ratios are printed. Target (issue): the
multi-tensor step at least 1.5x faster than the per-parameter one -- the in-place loop being the
figure that matters (the reference also copies and syncs).

    python bench/bench_optimizers.py [--rounds 7] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfscope.fused_ops import Lamb, Lars  # noqa: E402
from perfscope.fused_ops.optimizer_reference import reference_lamb, reference_lars  # noqa: E402

LR, WD = 1e-3, 0.01


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of torchvision's ResNet-50, in its order (161 tensors)."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for b in range(blocks):
            shapes += [(width, inplanes, 1, 1), (width,), (width,), (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if b == 0:
                shapes += [(4 * width, inplanes, 1, 1), (4 * width,), (4 * width,)]
            inplanes = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def make_params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = []
    for shape in resnet50_shapes():
        p = (0.05 * torch.randn(shape, generator=g)).requires_grad_()
        p.grad = 0.01 * torch.randn(shape, generator=g)
        params.append(p)
    return params


def inplace_lamb(params, state: dict, lr: float, betas: tuple[float, float], eps: float, wd: float) -> None:
    """LAMB (You et al. 2020, Algorithm 2) one tensor at a time, in place and without a host sync."""
    b1, b2 = betas
    for p in params:
        s = state.get(p)
        if s is None:
            s = state[p] = {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p), "r": torch.empty_like(p)}
        s["t"] += 1
        m, v, r = s["m"], s["v"], s["r"]
        m.lerp_(p.grad, 1 - b1)
        v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        torch.div(v, 1 - b2 ** s["t"], out=r).sqrt_().add_(eps)  # r = sqrt(v_hat) + eps
        torch.div(m, r, out=r).mul_(1 / (1 - b1 ** s["t"])).add_(p, alpha=wd)  # r = m_hat / (...) + wd * p
        w_norm, r_norm = p.norm(), r.norm()
        trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
        p.add_(r.mul_(trust), alpha=-lr)


def inplace_lars(params, state: dict, lr: float, momentum: float, wd: float, eta: float, eps: float) -> None:
    """LARS (You, Gitman and Ginsburg 2017, Algorithm 1) one tensor at a time, in place and without a host sync."""
    for p in params:
        g = p.grad
        w_norm, g_norm = p.norm(), g.norm()
        trust = torch.where((w_norm > 0) & (g_norm > 0), eta * w_norm / (g_norm + wd * w_norm + eps),
                            torch.ones_like(w_norm))
        buf = state.get(p)
        if buf is None:
            buf = state[p] = torch.zeros_like(p)
        buf.mul_(momentum).add_(g.add(p, alpha=wd).mul_(trust))
        p.add_(buf, alpha=-lr)


def variants() -> dict:
    """name -> a step function over its own copy of the parameters."""
    out = {}

    def fused(make):
        params = make_params()
        opt = make(params)
        return opt.step

    def reference(fn, **kw):
        params, state = make_params(), {}

        def step():
            with torch.no_grad():
                fn(params, state, **kw)
        return step

    out["lamb fused"] = fused(lambda p: Lamb(p, lr=LR, weight_decay=WD))
    out["lamb reference"] = reference(reference_lamb, lr=LR, betas=(0.9, 0.999), eps=1e-6, wd=WD)
    out["lars fused"] = fused(lambda p: Lars(p, lr=LR, weight_decay=WD))
    out["lars reference"] = reference(reference_lars, lr=LR, momentum=0.9, wd=WD, eta=0.001, eps=1e-8)
    out["lamb in-place loop"] = reference(inplace_lamb, lr=LR, betas=(0.9, 0.999), eps=1e-6, wd=WD)
    out["lars in-place loop"] = reference(inplace_lars, lr=LR, momentum=0.9, wd=WD, eta=0.001, eps=1e-8)
    out["adamw foreach"] = fused(lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=WD, foreach=True))
    out["sgd foreach"] = fused(lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9, weight_decay=WD, foreach=True))
    stream = make_params()
    grads = [p.grad for p in stream]
    out["stream"] = lambda: torch._foreach_add_([p.detach() for p in stream], grads)
    return out


# Bytes a value each step must move at the least, fp32 (module docstring).
FLOOR_BYTES = {"lamb": 28, "lars": 20, "stream": 12}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    opts = ap.parse_args()
    steps = variants()
    n = len(resnet50_shapes())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {n} tensors "
          f"({sum(torch.Size(s).numel() for s in resnet50_shapes()) / 1e6:.1f} M values), ms per step "
          f"(median of {opts.rounds} rounds of {opts.reps})")
    for step in steps.values():  # warm-up: state allocated
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(opts.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(opts.reps):
                step()
            times[name].append((time.perf_counter() - start) / opts.reps)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(", ".join(f"{name} {1000 * m:.2f} ms" for name, m in med.items()))
    for name in ("lamb", "lars"):
        print(f"{name}: fused/reference {med[f'{name} reference'] / med[f'{name} fused']:.2f}x faster, "
              f"fused/in-place loop {med[f'{name} in-place loop'] / med[f'{name} fused']:.2f}x faster", flush=True)
    values = sum(torch.Size(s).numel() for s in resnet50_shapes())
    bandwidth = FLOOR_BYTES["stream"] * values / med["stream"]  # bytes/s
    print(f"streaming bandwidth {bandwidth / 1e9:.1f} GB/s; time over the byte floor: " + ", ".join(
        f"{name} {med[name] / (FLOOR_BYTES[name.split()[0]] * values / bandwidth):.2f}x"
        for name in med if name.split()[0] in ("lamb", "lars")))
    print(f"lamb fused / adamw foreach: {med['lamb fused'] / med['adamw foreach']:.2f}x the time; "
          f"lars fused / sgd foreach: {med['lars fused'] / med['sgd foreach']:.2f}x the time")


if __name__ == "__main__":
    main()
