"""Large-batch optimizers with layer-wise trust ratios, as multi-tensor (``torch._foreach_*``) steps.

Both scale each parameter tensor's update by a *trust ratio* built from the norm of the tensor and
the norm of its update, so that a large learning rate (a large batch) does not blow up the layers
whose gradients are large relative to their weights.

* :class:`Lamb` — You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
  minutes", ICLR 2020, Algorithm 2: Adam's moments with bias correction, the decoupled weight decay
  added to the Adam step, and the trust ratio ``||w|| / ||r||`` of the weights over that step.
* :class:`Lars` — You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks",
  2017, Algorithm 1: the local learning rate ``eta * ||w|| / (||g|| + beta * ||w||)`` times the
  weight-decayed gradient, into heavy-ball momentum. As in NVIDIA's LARC and timm's ``Lars``, the
  global learning rate multiplies the momentum buffer rather than entering it (the same steps for a
  constant learning rate; a schedule then acts at once).

A tensor whose norm or whose update's norm is zero gets a trust ratio of 1 (both papers leave the
ratio undefined there). Every step works on whole lists of tensors per device and dtype: one call
for each operation over all parameters, instead of a Python loop of small kernels per parameter
(about 160 tensors for a ResNet-50). Sparse gradients are refused.

Units: ``lr`` is per step; norms are L2 norms over each whole tensor. A parameter group may hold
``lr_scale`` (default 1), a factor on ``lr`` that learning-rate schedules leave alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
from torch.optim import Optimizer

__all__ = ["Lamb", "Lars"]


def _check(name: str, ok: bool, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{name}: got {value!r}, allowed: {allowed}")


def _by_device_and_dtype(params: list[torch.Tensor]) -> dict[tuple, list[int]]:
    """Indices of ``params`` grouped by (device, dtype): a foreach call takes one of each."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(params):
        groups[(p.device, p.dtype)].append(i)
    return groups


def _lr(group: dict) -> float:
    """The group's learning rate times its ``lr_scale`` (default 1): the factor a schedule never
    touches, set by perfscope's ``optimizer`` knob for the larger effective batch
    (:mod:`perfscope.runtime.groups.fused`), so that any scheduler keeps driving ``lr``."""
    return group["lr"] * group.get("lr_scale", 1.0)


def _trust(w_norms: torch.Tensor, u_norms: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``ratio`` where both norms are positive, else 1 (shape ``(n,)``)."""
    return torch.where((w_norms > 0) & (u_norms > 0), ratio, torch.ones_like(ratio))


# On CPU a step runs over groups of tensor pieces of at most this many values: every pass of the
# group (LAMB: the moments, the update, its weight decay and norms; LARS: the update and the momentum
# step) then finds its inputs in the cache the previous pass left them in (5 arrays x 4 bytes x
# 2^18 values = 5 MiB, within an AMD EPYC's 32 MiB L3 beside other work, and 4 foreach calls per
# group), where whole-list passes over ResNet-50's 100 MB each go to memory. GPUs take whole lists:
# their cost is the launches, which smaller groups would multiply.
CPU_GROUP_VALUES = 1 << 18


def _pieces(tensors: list[list[torch.Tensor]], limit: int | None) -> list[list[tuple[int, slice | None]]]:
    """Groups of ``(index, piece)`` over parallel lists of like-shaped tensors, each group holding
    at most ``limit`` values (a tensor larger than ``limit`` is cut into flat pieces; None: one
    group of whole tensors). A tensor is cut only where every list's tensor at its index is
    contiguous (a flat view is then the same elements in each); others are taken whole."""
    n = len(tensors[0])
    if limit is None:
        return [[(i, None) for i in range(n)]]
    groups: list[list[tuple[int, slice | None]]] = [[]]
    room = limit
    for i in range(n):
        size = tensors[0][i].numel()
        if size > limit and all(t[i].is_contiguous() for t in tensors):
            for start in range(0, size, limit):
                stop = min(start + limit, size)
                if stop - start > room:
                    groups.append([])
                    room = limit
                groups[-1].append((i, slice(start, stop)))
                room -= stop - start
            continue
        if size > room and groups[-1]:
            groups.append([])
            room = limit
        groups[-1].append((i, None))
        room -= size
    return [g for g in groups if g]


def _views(tensors: list[torch.Tensor], group: list[tuple[int, slice | None]]) -> list[torch.Tensor]:
    """The pieces of ``group`` cut from ``tensors`` (flat views, or the whole tensors)."""
    return [tensors[i] if piece is None else tensors[i].view(-1)[piece] for i, piece in group]


def _group_limit(params: list[torch.Tensor]) -> int | None:
    return CPU_GROUP_VALUES if params[0].device.type == "cpu" else None


class _TrustRatioOptimizer(Optimizer):
    """What LAMB and LARS share: the closure, the parameters with dense gradients, one
    multi-tensor :meth:`_step_tensors` call per (device, dtype) of each group, and a scratch
    tensor per parameter for the update (:meth:`_scratch`)."""

    def _scratch(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """One tensor like each parameter, kept between steps, for its update.

        Kept because a fresh one each step costs more than the arithmetic: the updates of all
        parameters are alive at once, so the allocator maps new pages for them every step and the
        first write faults each one in (on ResNet-50's 100 MB, the out-of-place add that made
        LARS's update took 4x the in-place loop's, 179 ms a step, in torch's profiler). Not
        part of ``state_dict`` (its content is dead between steps); it holds as much memory as
        the parameters, which the step held at its peak anyway.
        """
        kept = self.__dict__.setdefault("_scratch_tensors", {})
        out = []
        for p in params:
            t = kept.get(p)
            if t is None or t.shape != p.shape or t.dtype != p.dtype or t.device != p.device:
                t = kept[p] = torch.empty_like(p)  # the parameter's layout, as its gradient and state have
            out.append(t)
        return out

    @torch.no_grad()
    def step(self, closure=None):
        """One step over every parameter that has a gradient; returns the closure's loss.

        Raises:
            ValueError: a sparse gradient.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise ValueError(f"{type(self).__name__} does not support sparse gradients")
            self._prepare(params)
            for indices in _by_device_and_dtype(params).values():
                self._step_tensors(group, [params[i] for i in indices])
        return loss

    def _prepare(self, params: list[torch.Tensor]) -> None:
        """Per-parameter state before the step (default: none)."""

    def _step_tensors(self, group: dict, params: list[torch.Tensor]) -> None:
        raise NotImplementedError


class Lamb(_TrustRatioOptimizer):
    """LAMB (You et al., ICLR 2020, Algorithm 2), one multi-tensor step for all parameters.

    Per parameter tensor ``w`` with gradient ``g`` at step ``t``::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        r = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps) + weight_decay * w
        w = w - lr * (||w|| / ||r||) * r          # ratio 1 where either norm is 0

    Args:
        params: Parameters or parameter groups (dicts with these keys overriding the defaults).
        lr: Learning rate (> 0).
        betas: Decay rates of the first and second moments, each in [0, 1).
        eps: Added to the second moment's square root (>= 0); 1e-6 as in the paper's BERT runs.
        weight_decay: Decoupled weight decay (>= 0), inside the trust ratio as the paper has it.

    Raises:
        ValueError: a hyper-parameter out of range (named); a sparse gradient at ``step``.
    """

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0) -> None:
        _check("lr", isinstance(lr, (int, float)) and lr > 0, "a number > 0", lr)
        _check("betas", len(betas) == 2 and all(0 <= b < 1 for b in betas), "two numbers in [0, 1)", betas)
        _check("eps", eps >= 0, "a number >= 0", eps)
        _check("weight_decay", weight_decay >= 0, "a number >= 0", weight_decay)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def _prepare(self, params: list[torch.Tensor]) -> None:
        for p in params:
            state = self.state[p]
            if not state:
                # on the parameter's device: the CUDA fused Adam kernel takes no CPU step counts
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != p.device:  # a CPU state_dict loaded for GPU parameters
                state["step"] = state["step"].to(p.device)
            state["step"] += 1

    def _step_tensors(self, group: dict, params: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params]
        states = [self.state[p] for p in params]
        m = [s["exp_avg"] for s in states]
        v = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        update = self._scratch(params)
        groups = _pieces([params, grads, m, v, update], _group_limit(params))
        w_sq = torch.zeros(len(params), dtype=torch.float64, device=params[0].device)
        u_sq = torch.zeros_like(w_sq)
        for pieces in groups:
            u = _views(update, pieces)
            # Adam's direction m_hat / (sqrt(v_hat) + eps), with the moments' update, in one pass of
            # PyTorch's fused Adam kernel: stepping a zero tensor with lr = -1 leaves the direction in
            # it (the kernel's bias corrections use each tensor's own step count).
            torch._foreach_zero_(u)
            torch._fused_adam_(u, _views(grads, pieces), _views(m, pieces), _views(v, pieces), [],
                               [steps[i] for i, _ in pieces], lr=-1.0, beta1=beta1, beta2=beta2, weight_decay=0.0,
                               eps=group["eps"], amsgrad=False, maximize=False)
            w = _views(params, pieces)
            if group["weight_decay"]:
                torch._foreach_add_(u, w, alpha=group["weight_decay"])
            at = torch.tensor([i for i, _ in pieces], device=w_sq.device)
            w_sq.index_add_(0, at, torch.stack(torch._foreach_norm(w)).double().square())
            u_sq.index_add_(0, at, torch.stack(torch._foreach_norm(u)).double().square())
        w_norms, u_norms = w_sq.sqrt().float(), u_sq.sqrt().float()
        ratio = _trust(w_norms, u_norms, w_norms / u_norms.clamp_min(torch.finfo(torch.float32).tiny))
        scale = (-_lr(group) * ratio).to(params[0].dtype).unbind()
        for pieces in groups:
            u = _views(update, pieces)
            torch._foreach_mul_(u, [scale[i] for i, _ in pieces])
            torch._foreach_add_(_views(params, pieces), u)


class Lars(_TrustRatioOptimizer):
    """LARS (You, Gitman and Ginsburg, 2017, Algorithm 1), one multi-tensor step for all parameters.

    Per parameter tensor ``w`` with gradient ``g``::

        ratio = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)   # 1 where a norm is 0
        d = ratio * (g + weight_decay * w)
        buf = momentum * buf + d                  # buf = d on the first step
        w = w - lr * buf

    Args:
        params: Parameters or parameter groups.
        lr: Global learning rate (> 0); LARS runs use large ones (the trust coefficient scales them).
        momentum: Heavy-ball momentum in [0, 1) (0: none).
        weight_decay: L2 weight decay (>= 0), inside the local learning rate as the paper has it.
        trust_coefficient: The paper's eta (> 0).
        eps: Keeps the ratio finite when ``||g|| + weight_decay * ||w||`` is tiny (>= 0).

    Raises:
        ValueError: a hyper-parameter out of range (named); a sparse gradient at ``step``.
    """

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, eps: float = 1e-8) -> None:
        _check("lr", isinstance(lr, (int, float)) and lr > 0, "a number > 0", lr)
        _check("momentum", 0 <= momentum < 1, "a number in [0, 1)", momentum)
        _check("weight_decay", weight_decay >= 0, "a number >= 0", weight_decay)
        _check("trust_coefficient", trust_coefficient > 0, "a number > 0", trust_coefficient)
        _check("eps", eps >= 0, "a number >= 0", eps)
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "trust_coefficient": trust_coefficient, "eps": eps})

    def _step_tensors(self, group: dict, params: list[torch.Tensor]) -> None:
        wd, eta = group["weight_decay"], group["trust_coefficient"]
        grads = [p.grad for p in params]
        w_norms = torch.stack(torch._foreach_norm(params)).float()
        g_norms = torch.stack(torch._foreach_norm(grads)).float()
        ratio = _trust(w_norms, g_norms, eta * w_norms / (g_norms + wd * w_norms + group["eps"]))
        ratio = ratio.to(params[0].dtype).unbind()
        momentum = group["momentum"]
        if momentum:
            fresh = ["momentum_buffer" not in self.state[p] for p in params]
            for p, f in zip(params, fresh):
                if f:
                    self.state[p]["momentum_buffer"] = torch.empty_like(p)
            bufs = [self.state[p]["momentum_buffer"] for p in params]
        update = self._scratch(params)
        for pieces in _pieces([params, grads, update, *([bufs] if momentum else [])], _group_limit(params)):
            d, w = _views(update, pieces), _views(params, pieces)
            torch._foreach_copy_(d, _views(grads, pieces))
            if wd:
                torch._foreach_add_(d, w, alpha=wd)
            torch._foreach_mul_(d, [ratio[i] for i, _ in pieces])
            if not momentum:
                torch._foreach_add_(w, d, alpha=-_lr(group))
                continue
            # Heavy-ball momentum and the step in one pass of PyTorch's fused SGD kernel: on a
            # tensor's first step the buffer becomes d (is_first_step), later momentum * buf + d.
            b = _views(bufs, pieces)
            for first in (True, False):
                chosen = [k for k, (i, _) in enumerate(pieces) if fresh[i] == first]
                if chosen:
                    torch._fused_sgd_([w[k] for k in chosen], [d[k] for k in chosen], [b[k] for k in chosen],
                                      weight_decay=0.0, momentum=momentum, lr=_lr(group), dampening=0.0,
                                      nesterov=False, maximize=False, is_first_step=first)
