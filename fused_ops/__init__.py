"""Fused operators applied by perfscope's acceleration runtime (``docs/fused_ops.md``).

* :func:`window_attention` — Swin's window attention (bias and shift mask) as one custom
  operator with its own backward, and :func:`window_attention_reference`, its eager twin
  (:mod:`perfscope.fused_ops.attention`).
* :func:`swap` — puts the fused window attention into a model in place, ``state_dict`` unchanged
  (:mod:`perfscope.fused_ops.swap`); :class:`SwinBlock` — a Swin block on which it works
  (:mod:`perfscope.fused_ops.swin`).
* :class:`Lamb`, :class:`Lars` — large-batch optimizers with layer-wise trust ratios, as
  multi-tensor steps (:mod:`perfscope.fused_ops.optimizers`).
"""

from perfscope.fused_ops.optimizers import Lamb, Lars
from perfscope.fused_ops.swap import find, swap, unswap
from perfscope.fused_ops.swin import FusedWindowAttention, SwinBlock, WindowAttention
from perfscope.fused_ops.attention import window_attention, window_attention_reference

__all__ = ["FusedWindowAttention", "Lamb", "Lars", "SwinBlock", "WindowAttention", "find", "swap", "unswap",
           "window_attention", "window_attention_reference"]
