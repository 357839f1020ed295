"""Swapping the fused window attention into a model: :func:`swap`, :func:`find`, :func:`unswap`.

A module is swapped in place: its class becomes a subclass of its own whose ``forward`` runs the
attention core on :func:`perfscope.fused_ops.window_attention`. Parameters, buffers and their names do not
change, so ``state_dict`` goes both ways (a checkpoint saved before or after loads into either),
and references to the module (an optimizer's parameters, hooks) stay valid.

The patterns it knows, recognised by the attributes the public implementations share
(``qkv``, ``proj``, ``relative_position_bias_table``, ``relative_position_index``, ``num_heads``):

* ``swin``: this project's :class:`perfscope.fused_ops.swin.WindowAttention`;
* ``timm``: timm's ``WindowAttention`` layout, ``forward(x, mask=None)`` on windows
  ``(B * nW, N, C)``, attributes ``scale``, ``attn_drop``, ``proj_drop``;
* ``torchvision``: torchvision's ``ShiftedWindowAttention`` layout, ``forward(x)`` on
  ``(B, H, W, C)`` doing the padding, shift and partition itself, attributes ``window_size``,
  ``shift_size``, ``attention_dropout``, ``dropout``.

A module that matches but would compute something else is left alone, with the reason:
attention dropout (the fused operator has none), and Swin V2's cosine attention (``logit_scale``).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perfscope.fused_ops.swin import FusedWindowAttention, WindowAttention, region_mask
from perfscope.fused_ops.attention import window_attention

__all__ = ["Candidate", "find", "swap", "unswap"]

_REQUIRED = ("qkv", "proj", "relative_position_bias_table", "relative_position_index", "num_heads")
_FUSED_ATTR = "_fused_ops_original_class"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A module :func:`find` recognised.

    Attributes:
        name: Its qualified name in the model (``layers.0.blocks.1.attn``).
        kind: ``swin``, ``timm`` or ``torchvision``.
        reason: Why it is not swapped (None: it is swapped, or already fused).
    """

    name: str
    kind: str
    reason: str | None = None


def _bias(module: nn.Module, n: int) -> Tensor:
    """``(heads, N, N)`` gathered from the module's relative-position table."""
    table = module.relative_position_bias_table
    return table[module.relative_position_index.reshape(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()


def _dropout_p(value) -> float:
    return float(value.p if isinstance(value, nn.Dropout) else value or 0.0)


def _timm_forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
    bw, n, _ = x.shape
    qkv = self.qkv(x).reshape(bw, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    out = window_attention(q, k, v, _bias(self, n), None if mask is None else mask.to(q.dtype), self.scale)
    out = self.proj(out.transpose(1, 2).reshape(bw, n, -1))
    return self.proj_drop(out) if hasattr(self, "proj_drop") else out


def _torchvision_forward(self, x: Tensor) -> Tensor:
    b, h, w, c = x.shape
    wh, ww = self.window_size
    x = F.pad(x, (0, 0, 0, (ww - w % ww) % ww, 0, (wh - h % wh) % wh))
    ph, pw = x.shape[1], x.shape[2]
    # As torchvision does: no shift along an axis that one window already covers.
    shift = (0 if wh >= ph else self.shift_size[0], 0 if ww >= pw else self.shift_size[1])
    if any(shift):
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    gh, gw = ph // wh, pw // ww
    windows = x.view(b, gh, wh, gw, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(b * gh * gw, wh * ww, c)
    bw, n = windows.shape[0], wh * ww
    qkv = self.qkv(windows).reshape(bw, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    mask = region_mask(ph, pw, (wh, ww), shift).to(x.device, q.dtype) if any(shift) else None
    out = window_attention(q, k, v, _bias(self, n), mask, (c // self.num_heads) ** -0.5)
    out = self.proj(out.transpose(1, 2).reshape(bw, n, c))
    out = F.dropout(out, p=_dropout_p(self.dropout), training=self.training)
    out = out.view(b, gh, gw, wh, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(b, ph, pw, c)
    if any(shift):
        out = torch.roll(out, shifts=shift, dims=(1, 2))
    return out[:, :h, :w, :].contiguous()


def _forward_args(module: nn.Module) -> list[str]:
    """The names of ``forward``'s parameters after ``self``."""
    try:
        params = list(inspect.signature(type(module).forward).parameters)
    except (TypeError, ValueError):
        return []
    return params[1:]


# The layouts' forward signatures: a module whose forward takes other arguments (BEiT's
# ``shared_rel_pos_bias``) is another attention with the same attribute names.
_SIGNATURES = {"timm": (["x", "mask"],), "torchvision": (["x"],)}
_EXTRA_BIASES = ("q_bias", "k_bias", "v_bias")  # biases outside qkv (BEiT, Swin V2): not the layout


def _kind(module: nn.Module) -> tuple[str | None, str | None]:
    """(kind, reason not to swap) for one module; kind None: not a pattern."""
    if getattr(module, _FUSED_ATTR, None) is not None or isinstance(module, FusedWindowAttention):
        return None, None
    if isinstance(module, WindowAttention):
        return "swin", _overridden(module)
    if not all(getattr(module, a, None) is not None for a in _REQUIRED):
        return None, None
    kind = "torchvision" if hasattr(module, "shift_size") and hasattr(module, "window_size") else "timm"
    if _forward_args(module) not in _SIGNATURES[kind]:
        return None, None
    return kind, _not_the_formula(module, kind)


def _overridden(module: WindowAttention) -> str | None:
    """Why a subclass of this project's WindowAttention that overrides its math is not swapped."""
    own = [m for m in ("forward", "attend", "split_heads", "rel_pos_bias")
           if getattr(type(module), m) is not getattr(WindowAttention, m)]
    return f"{type(module).__name__} overrides {', '.join(own)}: its own math, not the operator's" if own else None


def _not_the_formula(module: nn.Module, kind: str) -> str | None:
    """Why a module of a known layout computes something else than the operator, or None."""
    if hasattr(module, "logit_scale"):
        return "cosine attention (Swin V2) is not the operator's formula"
    extra = [b for b in _EXTRA_BIASES if getattr(module, b, None) is not None]
    if extra:
        return f"separate {', '.join(extra)}: not the layout's qkv projection"
    drop = _dropout_p(getattr(module, "attention_dropout" if kind == "torchvision" else "attn_drop", 0.0))
    if drop > 0:
        return f"attention dropout {drop:g}: the fused operator has none"
    if kind == "timm" and not hasattr(module, "scale"):
        return "no scale attribute: not timm's layout"
    return None


def find(model: nn.Module) -> list[Candidate]:
    """Every window-attention module of ``model`` that :func:`swap` knows and has not swapped yet,
    swappable or not (``reason``), in ``named_modules`` order."""
    found = []
    for name, module in model.named_modules():
        kind, reason = _kind(module)
        if kind is not None:
            found.append(Candidate(name, kind, reason))
    return found


_FUSED_CLASSES: dict[tuple[type, str], type] = {}


def _restore(original: type, kind: str, state: dict) -> nn.Module:
    """Unpickle a swapped module: its fused class is made again from the original (importable)
    class, so a whole swapped model loads in a process that never called :func:`swap`."""
    module = original.__new__(_fused_class(original, kind))
    module.__dict__.update(state)
    return module


def _reduce(self, protocol):
    return _restore, (self.__dict__[_FUSED_ATTR], self._fused_ops_kind, self.__dict__.copy())


def _fused_class(cls: type, kind: str) -> type:
    if cls is WindowAttention:
        return FusedWindowAttention
    key = (cls, kind)
    if key not in _FUSED_CLASSES:
        body = {"forward": _torchvision_forward if kind == "torchvision" else _timm_forward}
        if kind == "swin":  # a subclass of the project's module that overrides none of its math
            body = {"attend": FusedWindowAttention.attend}
        body.update(__module__=cls.__module__, __qualname__=f"Fused{cls.__qualname__}", _fused_ops_kind=kind,
                    __reduce_ex__=_reduce)
        _FUSED_CLASSES[key] = type(f"Fused{cls.__name__}", (cls,), body)
    return _FUSED_CLASSES[key]


def swap(model: nn.Module) -> list[str]:
    """Replace, in place, each window attention of ``model`` that :func:`find` can swap by its
    fused twin (same parameters, buffers and ``state_dict``).

    Returns:
        The qualified names of the modules swapped (``""`` when ``model`` itself is one); empty
        when none is found. Modules found but not swapped are listed by :func:`find` with why.
    """
    swapped = []
    for candidate in find(model):
        if candidate.reason is not None:
            continue
        module = model.get_submodule(candidate.name)
        original = type(module)
        module.__class__ = _fused_class(original, candidate.kind)
        object.__setattr__(module, _FUSED_ATTR, original)
        swapped.append(candidate.name)
    return swapped


def unswap(model: nn.Module) -> list[str]:
    """Undo :func:`swap`: each swapped module of ``model`` gets its own class back. Returns
    their qualified names."""
    restored = []
    for name, module in model.named_modules():
        original = module.__dict__.pop(_FUSED_ATTR, None)
        if original is not None:
            module.__class__ = original
            restored.append(name)
    return restored
