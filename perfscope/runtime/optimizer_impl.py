"""Which kernels an optimizer's step runs: one per parameter tensor, multi-tensor, or fused.

PyTorch's built-in optimizers have three implementations of the same update (``torch.optim``'s
documentation, "Algorithms"): the **for-loop** (a few kernels per parameter tensor and per
operation), **foreach** (``_foreach_*`` kernels over lists of tensors: one launch per operation
for a whole group) and **fused** (one kernel that does the whole update for many tensors). The
documentation ranks them fused > foreach > for-loop for speed; PyTorch picks foreach by default
only when every parameter is on a device with foreach kernels (CUDA, not the CPU), and never picks
fused on its own. A model with hundreds of parameter tensors spends a visible share of a small
step in the for-loop's launches (on a GPU) or its per-operator dispatch (on the CPU).

The choice is the param groups' ``foreach`` and ``fused`` flags, read at every ``step()``. Set
before the first step (no optimizer state yet), the run is the one the script would have had with
``foreach=True`` or ``fused=True`` in the constructor: nothing else of the optimizer changes. So
``perfscope.accelerate`` and launch-time patching apply it the same way, on the object the script
holds (an LR scheduler built on it keeps working). Whether the class and the parameters allow an
implementation is asked of the class itself: a throwaway instance over the same parameters is
built with the flag (construction allocates no state), so its own checks -- ``differentiable``,
devices, dtypes -- give the reason when it refuses.

Imports torch: the runtime's side only (the tuner reads :data:`IMPLS` from
:mod:`perfscope.runtime.config`).
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Iterator

import torch

from perfscope.runtime.config import OPTIMIZER_IMPLS as IMPLS

# constructor argument -> the implementations it makes available besides the for-loop
_FLAGS = {"foreach": "foreach", "fused": "fused"}


def param_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter tensor of ``optimizer``'s groups, in order."""
    return [p for g in optimizer.param_groups for p in g["params"]]


def current(optimizer: torch.optim.Optimizer) -> str:
    """The implementation ``optimizer.step()`` runs now: ``"fused"``, ``"foreach"`` or ``"for-loop"``.

    A group's flags of None leave it to PyTorch's default (foreach when every parameter is on a
    device with foreach kernels; the CPU has none); groups that differ report the first group's.
    """
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    foreach = group.get("foreach")
    if foreach is None and "foreach" in group:
        foreach = _default_foreach(list(group["params"]), bool(group.get("differentiable")))
    return "foreach" if foreach else "for-loop"


def _default_foreach(params: list, differentiable: bool) -> bool:
    """PyTorch's own default for ``foreach=None`` (its private helper where this PyTorch has it;
    else its documented rule: every parameter on CUDA, not differentiable)."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
    except ImportError:
        return not differentiable and all(p.is_cuda for p in params)
    return bool(_default_to_fused_or_foreach(params, differentiable, False)[1])


def _constructor_flags(cls: type) -> set[str]:
    try:
        names = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return set()
    return {flag for flag in _FLAGS if flag in names}


def why_not(optimizer: torch.optim.Optimizer, impl: str) -> str | None:
    """Why ``optimizer`` cannot switch to ``impl`` (None: it can).

    Reasons: the class has no such constructor argument (its own step ignores the flags), the
    optimizer already holds state (made by another implementation, whose layout may differ, e.g.
    fused Adam's step counters live on the parameters' device), or the class refuses it for these
    parameters (its constructor's message, e.g. fused needs floating-point parameters on a device
    with fused kernels).
    """
    name = type(optimizer).__name__
    if impl not in IMPLS:
        return f"{impl!r} is not an optimizer implementation (allowed: {', '.join(IMPLS)})"
    flags = _constructor_flags(type(optimizer))
    needed = "foreach" if impl == "for-loop" else impl
    if needed not in flags:
        return f"{name} has no {needed!r} argument: its step has one implementation"
    if optimizer.state:
        return f"the {name} optimizer already holds state from its own implementation"
    try:
        _throwaway(optimizer, impl)
    except Exception as exc:  # noqa: BLE001 - the class's own refusal is the reason
        return f"{name} refuses {impl} here: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def _flags_for(impl: str, available: set[str]) -> dict[str, bool]:
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    return {k: v for k, v in flags.items() if k in available}


def _throwaway(optimizer: torch.optim.Optimizer, impl: str) -> None:
    """Build an instance of ``optimizer``'s class over its parameters with ``impl``'s flags, for
    the class's own checks (no state is allocated before the first step)."""
    cls = type(optimizer)
    names = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in names}
    kwargs.update(_flags_for(impl, _constructor_flags(cls)))
    groups = [{"params": list(g["params"])} for g in optimizer.param_groups]
    cls(groups, **kwargs)


def available(optimizer: torch.optim.Optimizer) -> list[str]:
    """The implementations ``optimizer`` can run now, its current one first."""
    now = current(optimizer)
    return [now] + [impl for impl in IMPLS if impl != now and why_not(optimizer, impl) is None]


def set_impl(optimizer: torch.optim.Optimizer, impl: str) -> None:
    """Make ``optimizer.step()`` run ``impl`` by setting every group's flags (and the defaults
    that groups added later take). Check :func:`why_not` first."""
    flags = _flags_for(impl, _constructor_flags(type(optimizer)))
    for group in optimizer.param_groups:
        group.update(flags)
    optimizer.defaults.update(flags)


def switch(optimizer: torch.optim.Optimizer, impl: str) -> tuple[str | None, str | None]:
    """Switch ``optimizer`` to ``impl``: (what was done, None), or (None, why not). The one
    description ``perfscope.accelerate`` and launch-time patching both report."""
    was = current(optimizer)
    if was == impl:
        return f"{type(optimizer).__name__} already runs its {impl} step", None
    why = why_not(optimizer, impl)
    if why is not None:
        return None, why
    set_impl(optimizer, impl)
    tensors = len(param_tensors(optimizer))
    return f"{type(optimizer).__name__}: {impl} step in place of {was} ({tensors} parameter tensors)", None


def facts(optimizer: torch.optim.Optimizer) -> dict:
    """What the tuner needs of the script's optimizer: ``class``, ``impl`` (current),
    ``impls`` (what it can run, current first), ``tensors`` (parameter tensors) and
    ``parameters`` (elements)."""
    tensors = param_tensors(optimizer)
    return {"class": type(optimizer).__name__, "impl": current(optimizer), "impls": available(optimizer),
            "tensors": len(tensors), "parameters": int(sum(p.numel() for p in tensors))}


@contextlib.contextmanager
def before_first_step(callback: Callable[[torch.optim.Optimizer], None]) -> Iterator[None]:
    """Run ``callback(optimizer)`` before the first ``step()`` of every optimizer, for the block
    (PyTorch's global optimizer step pre-hook; each optimizer is seen once)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen: weakref.WeakSet = weakref.WeakSet()

    def hook(optimizer, args, kwargs) -> None:
        if optimizer in seen:
            return
        seen.add(optimizer)
        callback(optimizer)

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()
