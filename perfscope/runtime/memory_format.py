"""The channels-last memory format for a convolutional model: weights and 4-D inputs in NHWC.

cuDNN's Tensor Core convolutions and oneDNN's CPU convolutions work in NHWC; given NCHW (PyTorch's
default, "contiguous") tensors they transpose on the way in and out, or take a slower kernel.
``torch.channels_last`` stores the same logical NCHW tensor with the channels innermost, so the
fast path needs no transposes (PyTorch's "Channels Last Memory Format" tutorial: up to 22% on
Volta with AMP, and oneDNN's CPU convolutions are NHWC-native). The model's parameters are
converted in place (``Module.to(memory_format=...)`` swaps each parameter's data, so an optimizer
built on them keeps working, before it holds state), and a forward pre-hook converts the model's
4-D floating-point inputs, which are otherwise reordered inside the first convolution of every
step. Outputs of a channels-last convolution stay channels-last through the layers that preserve
it (batch norm, activations, pooling); numerics are the same operations in another order.

A model already wrapped in ``DistributedDataParallel`` is refused: DDP laid its gradient buckets
out for the parameters' old strides, and converting them afterwards makes every gradient copy a
strided one (DDP warns, and the conversion would cost what it saves). ``perfscope.accelerate``
converts before it wraps; a script that wraps DDP itself gets the reason.

Imports torch: the runtime's side only.
"""

from __future__ import annotations

import torch
from torch import nn

HOOK_ATTR = "_perfscope_channels_last_hook"


def convolutions(model: nn.Module) -> list[nn.Conv2d]:
    """The model's 2-D convolutions (the layers channels-last serves), in module order."""
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)]


def is_channels_last(model: nn.Module) -> bool:
    """Whether the model's first 2-D convolution already holds a channels-last weight (the
    script converted it itself); False without one."""
    convs = convolutions(model)
    if not convs:
        return False
    weight = convs[0].weight
    return weight.dim() == 4 and weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()


def _to_channels_last(value):
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _inputs_hook(module, args, kwargs):
    return tuple(_to_channels_last(a) for a in args), {k: _to_channels_last(v) for k, v in kwargs.items()}


def why_not(model: nn.Module) -> str | None:
    """Why ``model`` cannot be converted (None: it can)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return ("the model is already wrapped in DistributedDataParallel, whose gradient buckets follow the old "
                "layout: convert it before wrapping (model.to(memory_format=torch.channels_last)), or use "
                "perfscope.accelerate, which does")
    if not convolutions(model):
        return f"no 2-D convolution in the model ({type(model).__name__})"
    if is_channels_last(model):
        return "the model's convolutions are channels-last already"
    return None


def convert(model: nn.Module) -> tuple[str | None, str | None]:
    """Convert ``model`` to channels-last in place and convert its 4-D inputs from now on:
    (what was done, None), or (None, why not: :func:`why_not`). The one description
    ``perfscope.accelerate`` and launch-time patching both report."""
    why = why_not(model)
    if why is not None:
        return None, why
    model.to(memory_format=torch.channels_last)
    if getattr(model, HOOK_ATTR, None) is None:
        setattr(model, HOOK_ATTR, model.register_forward_pre_hook(_inputs_hook, with_kwargs=True))
    return (f"channels-last weights in {len(convolutions(model))} convolution(s) of {type(model).__name__}, "
            "4-D inputs converted on the way in"), None
