"""``accelerate(model, optimizer, loader, config=...)``: apply a configuration to a training loop.

The loop changes by a few lines::

    model, optimizer, loader = perfscope.accelerate(model, optimizer, loader, config="tuned.yaml")
    for x, y in loader:
        optimizer.zero_grad()            # a no-op in the middle of an accumulation window
        with perfscope.autocast():       # autocast at O1, a no-op otherwise
            loss = loss_fn(model(x), y)
        perfscope.backward(loss)         # loss / k, fp16 loss scaling, no_sync on micro-steps
        optimizer.step()                 # really steps on every k-th call (unscale, skip on inf)

``docs/runtime.md`` documents every knob.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from perfscope import control
from perfscope.errors import PerfscopeError
from perfscope.runtime import patching
from perfscope.runtime.config import load_config
from perfscope.runtime.groups import GROUPS
from perfscope.runtime.optimizer import AcceleratedOptimizer
from perfscope.runtime.accelerator_state import Accelerator, null_context

# Every object accelerate() returned; weak, and not an attribute, so torch.save(model) stays clean.
_accelerated: weakref.WeakSet = weakref.WeakSet()

_active: Accelerator | None = None


class AlreadyAcceleratedError(PerfscopeError, ValueError):
    """``accelerate`` was given an object that an earlier ``accelerate`` call returned."""


def accelerate(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, loader=None, *, config=None):
    """Apply an acceleration configuration to a model, its optimizer and its data loader.

    Args:
        model: The fp32 model, already on its device (not yet wrapped in DDP for O2).
        optimizer: Its optimizer, or None (then O2 and accumulation cannot apply).
        loader: Its DataLoader (or any iterable of batches), or None.
        config: A YAML path, dict or :class:`AccelConfig`; None reads ``$PERFSCOPE_CONFIG``,
            and without it the objects come back unchanged.

    Returns:
        ``(model, optimizer, loader)`` to use instead of the given ones; ``perfscope.accelerator()``
        returns the :class:`Accelerator` with what was applied and skipped.

    Raises:
        TypeError: ``model``, ``optimizer`` or ``loader`` is not of a type it can be (named).
        ConfigError: invalid configuration, or one this setup cannot honour (named key).
        AlreadyAcceleratedError: an object came from an earlier ``accelerate`` call.
    """
    global _active
    _check_types(model, optimizer, loader)
    control.note_accelerate(model, optimizer, loader)  # also when no config applies: a fact for the tuner
    cfg = load_config(config)
    if cfg is None:
        return model, optimizer, loader
    for name, obj in (("model", model), ("optimizer", optimizer), ("loader", loader)):
        if obj is not None and _is_accelerated(obj):
            raise AlreadyAcceleratedError(f"the {name} is already accelerated (perfscope.accelerate returned it); "
                                          f"pass the original objects, once")
    param = next(model.parameters(), None)
    acc = Accelerator(cfg, param.device if param is not None else torch.device("cpu"))
    acc.model, acc.optimizer, acc.loader = model, optimizer, loader
    for group in GROUPS:  # in their order (perfscope.runtime.groups)
        group.apply(acc)
    model, loader = acc.model, acc.loader
    if acc.optimizer is not None:  # the script's, or the one a group put in its place
        optimizer = AcceleratedOptimizer(acc.optimizer, acc)
    for obj in (model, getattr(model, "module", None), optimizer, loader):
        if obj is not None:
            try:
                _accelerated.add(obj)
            except TypeError:  # e.g. a plain list as the loader: nothing to guard
                pass
    acc.model, acc.optimizer, acc.loader = model, optimizer, loader
    _active = acc
    patching.note_accelerated(acc.applied)  # under `perfscope profile --config`: these knobs took effect
    return model, optimizer, loader


def _check_types(model, optimizer, loader) -> None:
    """One-line ``TypeError`` naming the argument, before anything is applied (arguments swapped,
    or a model's ``parameters()`` passed as the optimizer, would otherwise fail deep inside)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"accelerate(): model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"accelerate(): optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    if loader is not None and not (hasattr(type(loader), "__iter__") or hasattr(type(loader), "__getitem__")):
        raise TypeError(f"accelerate(): loader must be a DataLoader or another iterable of batches, or None, "
                        f"got {type(loader).__name__}")


def _is_accelerated(obj) -> bool:
    try:
        return obj in _accelerated
    except TypeError:  # not weak-referenceable or unhashable: accelerate cannot have returned it
        return False


def active_accelerator() -> Accelerator | None:
    """The Accelerator of the latest ``accelerate`` call that applied a configuration, or None."""
    return _active


def autocast():
    """The active accelerator's forward context (autocast at O1); a no-op without one."""
    return null_context() if _active is None else _active.autocast()


def backward(loss: torch.Tensor, **kwargs) -> None:
    """The active accelerator's :meth:`Accelerator.backward`; plain ``loss.backward()`` without one."""
    if _active is None:
        control.note_loss(loss)
        loss.backward(**kwargs)
    else:
        _active.backward(loss, **kwargs)
