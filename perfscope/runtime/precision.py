"""Precision knobs: backend flags (TF32, cuDNN benchmark), O1 autocast and O2 half weights.

O2 follows Apex's O2 idea: the model holds half-precision weights (norm layers stay fp32), the
optimizer holds fp32 *master* copies, and every real optimizer step copies the half gradients
into the masters, (un)scales them, steps in fp32 and copies the masters back into the model.
``docs/runtime.md`` describes the design.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Normalisation statistics (mean, variance) lose too much in half precision, so these stay fp32.
NORM_TYPES: tuple[type, ...] = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm) + (
    (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()
)


def set_backend_flags(tf32: bool | None, cudnn_benchmark: bool | None) -> dict[str, str]:
    """Set the TF32 and cuDNN benchmark flags (process-wide; they need no CUDA device to be set).

    Args:
        tf32: Allow TF32 in fp32 matmuls and cuDNN convolutions; None leaves the flags alone.
        cudnn_benchmark: Let cuDNN autotune convolution algorithms; None leaves it alone.

    Returns:
        Knob name -> what was set.
    """
    done = {}
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        done["tf32"] = f"torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = {tf32}"
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
        done["cudnn_benchmark"] = f"torch.backends.cudnn.benchmark = {cudnn_benchmark}"
    return done


@contextlib.contextmanager
def backend_flags(tf32: bool | None, cudnn_benchmark: bool | None) -> Iterator[dict[str, str]]:
    """:func:`set_backend_flags` for the duration of a ``with`` block (a patched script run); yields
    what was set, then puts back the values found.

    Only the legacy flags are read and put back (scripts read and set them), and the TF32 flags only
    when ``tf32`` was set: mixing them with the newer ``fp32_precision`` API, which the script may
    have used meanwhile, makes torch refuse them.
    """
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        yield set_backend_flags(tf32, cudnn_benchmark)
    finally:
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.backends.cudnn.benchmark = saved[2]


def map_tensors(obj, fn: Callable[[torch.Tensor], torch.Tensor]):
    """Apply ``fn`` to every tensor in nested tuples, lists, dicts (and namedtuples) of ``obj``."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple: positional constructor
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((k, map_tensors(v, fn)) for k, v in obj.items())
    return obj


def _caster(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.to(dtype) if t.is_floating_point() else t


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer that O2 keeps in fp32."""
    return isinstance(module, NORM_TYPES)


def autocast_context(level: str, device_type: str, dtype: torch.dtype):
    """The forward context: ``torch.autocast`` at O1, a no-op at O0 and O2 (O2 weights are already half)."""
    if level == "O1":
        return torch.autocast(device_type, dtype=dtype)
    return contextlib.nullcontext()


class MasterWeights:
    """fp32 master copies of a model's half weights, held in the optimizer's param groups.

    Create it while the model is still fp32 (the masters copy the exact fp32 values), then call
    :meth:`convert_model`.

    Args:
        optimizer: The user's optimizer over the model's parameters; its param groups (and any
            existing state) are moved onto the masters.
        model: The fp32 model to convert.
        dtype: ``torch.float16`` or ``torch.bfloat16``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.model = model
        norm_params = {id(p) for m in model.modules() if is_norm(m) for p in m.parameters(recurse=False)}
        self.pairs: list[tuple[nn.Parameter, torch.Tensor]] = []  # (half model param, fp32 master)
        replaced: dict[int, torch.Tensor] = {}
        for group in optimizer.param_groups:
            params = []
            for p in group["params"]:
                if id(p) in norm_params or not p.is_floating_point():
                    params.append(p)  # stays fp32 in the model: it is its own master
                    continue
                if id(p) not in replaced:
                    master = p.detach().clone().float().requires_grad_(p.requires_grad)
                    replaced[id(p)] = master
                    self.pairs.append((p, master))
                params.append(replaced[id(p)])
            group["params"] = params
        # State already built (e.g. a loaded checkpoint) follows its parameter to the master.
        for p, master in self.pairs:
            if p in optimizer.state:
                optimizer.state[master] = optimizer.state.pop(p)

    def convert_model(self) -> None:
        """Cast the model to half precision, except norm layers; cast inputs in and outputs out.

        Inputs are cast to the half dtype on entry to the model and to fp32 on entry to each norm
        layer (whose output goes back to half); model outputs come back as fp32, so the loss is
        computed in fp32.
        """
        self.model.to(self.dtype)
        to_half, to_float = _caster(self.dtype), _caster(torch.float32)
        for module in self.model.modules():
            if is_norm(module):
                module.float()
                module.register_forward_pre_hook(lambda m, args: map_tensors(args, to_float))
                module.register_forward_hook(lambda m, args, out: map_tensors(out, to_half))
        self.model.register_forward_pre_hook(
            lambda m, args, kwargs: (map_tensors(args, to_half), map_tensors(kwargs, to_half)), with_kwargs=True
        )
        self.model.register_forward_hook(lambda m, args, out: map_tensors(out, to_float))
        # The fp32 masters are the weights: save them, and load into them, under the user's keys.
        # (Plain functions: torch marks registered hooks with an attribute, which a bound method refuses.)
        self.model.register_state_dict_post_hook(lambda *a: self._save_masters(*a))
        self.model.register_load_state_dict_pre_hook(lambda *a: self._load_masters(*a))

    def _named_pairs(self, prefix: str):
        master_of = {id(p): m for p, m in self.pairs}
        for name, p in self.model.named_parameters():
            if id(p) in master_of:
                yield prefix + name, master_of[id(p)]

    def _save_masters(self, module, state_dict, prefix, local_metadata) -> None:
        for key, master in self._named_pairs(prefix):
            if key in state_dict:
                state_dict[key] = master.detach().clone()

    @torch.no_grad()
    def _load_masters(self, module, state_dict, prefix, *args) -> None:
        # Before the model copies (and rounds) the checkpoint into its half weights, the masters
        # take the exact values; otherwise the next step would write the old masters back.
        for key, master in self._named_pairs(prefix):
            value = state_dict.get(key)
            if isinstance(value, torch.Tensor) and value.shape == master.shape:
                master.copy_(value)

    @torch.no_grad()
    def grads_to_masters(self) -> None:
        """Copy each half gradient into its master as fp32 (None stays None)."""
        for p, master in self.pairs:
            if p.grad is None:
                master.grad = None
            elif master.grad is None:
                master.grad = p.grad.float()
            else:
                master.grad.copy_(p.grad)

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """Copy the updated fp32 masters back into the half model weights."""
        for p, master in self.pairs:
            p.copy_(master)

    def zero_model_grads(self, set_to_none: bool = True) -> None:
        """Clear the half gradients (the optimizer's zero_grad clears the masters')."""
        for p, _ in self.pairs:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def masters(self) -> Iterable[torch.Tensor]:
        """The fp32 master tensors."""
        return (m for _, m in self.pairs)
