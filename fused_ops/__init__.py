"""Fused operators applied by perfscope's acceleration runtime (``docs/fused_ops.md``).

* :func:`window_attention` — Swin's window attention (bias and shift mask) as one custom
  operator with its own backward, and :func:`window_attention_reference`, its eager twin
  (:mod:`fused_ops.window_attention`).
* :class:`Lamb`, :class:`Lars` — large-batch optimizers with layer-wise trust ratios, as
  multi-tensor steps (:mod:`fused_ops.optimizers`).
"""

from fused_ops.optimizers import Lamb, Lars
from fused_ops.window_attention import window_attention, window_attention_reference

__all__ = ["Lamb", "Lars", "window_attention", "window_attention_reference"]
