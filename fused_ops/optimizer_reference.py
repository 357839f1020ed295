"""Per-parameter LAMB and LARS, one tensor at a time in plain tensor arithmetic: the algorithms of
the papers as written, which :class:`perfscope.fused_ops.Lamb` and :class:`perfscope.fused_ops.Lars` are tested
against step by step (``tests/test_fused_optimizers.py``) and timed against
(``bench/bench_optimizers.py``). Not for training: each tensor costs several small kernels and a
host synchronisation (the ``> 0`` tests of the norms).

Both update ``params`` (tensors with ``.grad``) in place and keep their state in ``state`` (a dict
keyed by tensor); a tensor without a gradient is skipped.
"""

from __future__ import annotations

import torch

__all__ = ["reference_lamb", "reference_lars"]


def reference_lamb(params, state: dict, lr: float, betas: tuple[float, float], eps: float, wd: float) -> None:
    """You et al. 2020, Algorithm 2, one tensor at a time."""
    b1, b2 = betas
    for p in params:
        if p.grad is None:
            continue
        s = state.setdefault(p, {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)})
        s["t"] += 1
        g = p.grad
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        m_hat = s["m"] / (1 - b1 ** s["t"])
        v_hat = s["v"] / (1 - b2 ** s["t"])
        r = m_hat / (v_hat.sqrt() + eps) + wd * p
        w_norm, r_norm = p.norm(), r.norm()
        trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
        p.sub_(lr * trust * r)


def reference_lars(params, state: dict, lr: float, momentum: float, wd: float, eta: float, eps: float) -> None:
    """You, Gitman and Ginsburg 2017, Algorithm 1 (the global lr outside the momentum, as LARC)."""
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        w_norm, g_norm = p.norm(), g.norm()
        trust = eta * w_norm / (g_norm + wd * w_norm + eps) if w_norm > 0 and g_norm > 0 else 1.0
        d = trust * (g + wd * p)
        if momentum:
            buf = state.get(p)
            buf = d.clone() if buf is None else momentum * buf + d
            state[p] = buf
            d = buf
        p.sub_(lr * d)
