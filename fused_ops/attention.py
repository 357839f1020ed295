"""Window attention (Swin Transformer's WindowAttention core) as one PyTorch custom operator.

Swin runs multi-head self-attention inside each window of ``N`` tokens, adding a learned
relative-position bias (per head) and, for shifted windows, an additive mask (per window). The
textbook formulation (:func:`window_attention_reference`) takes about ten operators per call, each a
pass over the ``(B * nW, heads, N, N)`` scores. The operator here is one autograd node with its own
backward, in two implementations:

* fp32 and bf16 on the CPU: a C++ kernel (:mod:`perfscope.fused_ops.native`) that computes each
  window and head's scores, softmax, products and gradients while they are in the core's cache,
  where it is the faster of the two on this machine at this shape (:mod:`perfscope.fused_ops.choice`);
* elsewhere (other dtypes, CUDA, head sizes that are not whole vectors, no compiler), the ATen
  formulation below: the forward as two batched matrix products around one in-place
  bias-and-mask add and one softmax; the scores start as the bias-plus-mask, broadcast over the
  images (the ``(nW, heads, N, N)`` sum is formed once per call, never one copy per image), and the
  scaled product is accumulated onto them (``baddbmm_``'s alpha), so neither the scale nor the
  adds cost a pass of their own; the backward reuses the saved probabilities and reduces the
  bias gradient over images and windows in one sum.

It is registered with ``torch.library.custom_op`` (``fused_ops::window_attention_fwd`` and
``_bwd``) with fake (meta) implementations and an autograd formula, so it works under
``torch.compile`` (as one opaque node) and in autograd; ``tests/test_fused_window_attention.py``
and ``tests/test_fused_native.py`` check both implementations with ``torch.library.opcheck`` and
against the reference.

Shapes: ``q``, ``k``, ``v`` ``(B * nW, heads, N, head_dim)``, the windows of all images stacked
image-major as Swin does; ``rel_pos_bias`` ``(heads, N, N)``; ``mask`` ``(nW, N, N)`` additive (0 or a
large negative) or None; the result ``(B * nW, heads, N, head_dim)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from perfscope.fused_ops import choice, native

__all__ = ["window_attention", "window_attention_op", "window_attention_reference", "window_attention_sdpa"]


def _check(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor | None) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"window_attention: q, k, v must share one (B*nW, heads, N, head_dim) shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    bw, heads, n, _ = q.shape
    if bias.shape != (heads, n, n):
        raise ValueError(f"window_attention: rel_pos_bias must be (heads, N, N) = {(heads, n, n)}, got {tuple(bias.shape)}")
    devices = {t.device for t in (q, k, v, bias, mask) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"window_attention: q, k, v, rel_pos_bias and mask must be on one device, got "
                         f"{', '.join(sorted(map(str, devices)))}")
    if mask is not None:
        if mask.dim() != 3 or mask.shape[0] == 0 or mask.shape[1:] != (n, n):
            raise ValueError(f"window_attention: mask must be (nW, N, N) with nW >= 1 and N = {n}, got {tuple(mask.shape)}")
        if bw % mask.shape[0]:
            raise ValueError(f"window_attention: B*nW = {bw} windows is not a multiple of the mask's {mask.shape[0]}")


def _bias_mask(bias: Tensor, mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``(nW or 1, heads, N, N)``: the bias plus each window's mask, formed once per call."""
    bias = bias.to(dtype)
    return bias.unsqueeze(0) if mask is None else bias.unsqueeze(0) + mask.to(dtype).unsqueeze(1)


# Subnormal guard. Swin's shift mask adds -100 across regions, so exp() of those scores falls below
# fp32's smallest normal number (about 1.2e-38, i.e. exp(-87.3)); x86 cores take a microcode assist
# on every subnormal operand or result, and the softmax and the matrix products that read the
# probabilities run about 30x slower (measured here: a 1536 x 49 x 49 bmm, 1.5 ms -> 47 ms). Scores
# further than GUARD_SPAN below their row's maximum are raised to it, so every probability is at
# least exp(-GUARD_SPAN) = 4e-18 of the row's largest: 10 orders of magnitude below fp32's epsilon
# (what the output can resolve), and far enough above the subnormals that products with gradients
# down to 1e-20 stay normal. The guard costs two passes, so it runs only where a mask holds values
# that low (GUARD_MASK_BELOW), and only in the dtypes that need it (GUARDED_DTYPES); unmasked
# scores of a trained Swin span tens, not ~90.
GUARD_SPAN = 40.0
GUARD_MASK_BELOW = -GUARD_SPAN
# bf16 and fp16 products run in oneDNN kernels that flush subnormals themselves (measured: eager
# bf16 is as fast on shifted windows as on unshifted ones), so the guard would only cost passes.
GUARDED_DTYPES = (torch.float32, torch.float64)


@torch.library.custom_op("fused_ops::window_attention_fwd", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    # On the CPU: the kernel (it flushes subnormals: no guard), where it is the faster of the two here
    if native.usable(q, k, v, bias, mask) and choice.kernel_wins(q, k, v, bias, mask, scale, _ATEN):
        return native.forward(q, k, v, bias, mask, scale)
    return _forward_aten(q, k, v, bias, mask, scale)


def _forward_aten(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """The forward's ATen formulation: ``(out, probs)`` as the kernel's."""
    bw, heads, n, d = q.shape
    windows = 1 if mask is None else mask.shape[0]
    # The scores start as the broadcast bias-plus-mask; the product, scaled, is added onto them.
    scores = torch.empty((bw // windows, windows, heads, n, n), dtype=q.dtype, device=q.device)
    scores.copy_(_bias_mask(bias, mask, q.dtype).expand_as(scores))
    scores = scores.view(bw * heads, n, n)
    scores.baddbmm_(q.reshape(bw * heads, n, d), k.reshape(bw * heads, n, d).transpose(1, 2), alpha=scale)
    # x86 cores only (a GPU runs subnormals at full speed, and reading the mask's minimum would
    # wait for the device)
    if q.device.type == "cpu" and q.dtype in GUARDED_DTYPES and mask is not None and mask.amin().item() < GUARD_MASK_BELOW:
        top = scores.amax(-1, keepdim=True)
        floor = top - GUARD_SPAN
        # Where the row's maximum is so large that subtracting the span rounds back to it, there
        # is nothing to raise (clamping there would flatten the row).
        scores.clamp_(min=floor.masked_fill_(floor >= top, float("-inf")))
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs, v.reshape(bw * heads, n, d))
    return out.view(bw, heads, n, d), probs.view(bw, heads, n, n)


@_forward.register_fake
def _(q, k, v, bias, mask, scale):
    bw, heads, n, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((bw, heads, n, n))


def _bias_grad_dtype(dtype: torch.dtype) -> torch.dtype:
    """The bias gradient sums over every window: in fp32 at least (fp64 stays fp64)."""
    return torch.promote_types(dtype, torch.float32)


@torch.library.custom_op("fused_ops::window_attention_bwd", mutates_args=())
def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, probs: Tensor, windows: int,
              scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if native.usable_backward(grad_out, q, k, v, probs) and choice.kernel_chosen(q, windows):
        return native.backward(grad_out, q, k, v, probs, scale)
    return _backward_aten(grad_out, q, k, v, probs, scale)


def _backward_aten(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, probs: Tensor,
                   scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward's ATen formulation: ``(grad_q, grad_k, grad_v, grad_bias)`` as the kernel's."""
    bw, heads, n, d = q.shape
    g = grad_out.reshape(bw * heads, n, d)
    p = probs.reshape(bw * heads, n, n)
    grad_v = torch.bmm(p.transpose(1, 2), g)
    grad_p = torch.bmm(g, v.reshape(bw * heads, n, d).transpose(1, 2))
    grad_s = torch._softmax_backward_data(grad_p, p, -1, p.dtype)  # p * (grad_p - sum(grad_p * p))
    grad_bias = grad_s.view(bw, heads, n, n).sum(0, dtype=_bias_grad_dtype(q.dtype))
    # The scale enters as the products' alpha, not as a pass of its own.
    grad_q = torch.baddbmm(q.new_empty(()).expand(bw * heads, n, d), grad_s, k.reshape(bw * heads, n, d),
                           beta=0, alpha=scale)
    grad_k = torch.baddbmm(q.new_empty(()).expand(bw * heads, n, d), grad_s.transpose(1, 2),
                           q.reshape(bw * heads, n, d), beta=0, alpha=scale)
    return grad_q.view_as(q), grad_k.view_as(k), grad_v.view_as(v), grad_bias


@_backward.register_fake
def _(grad_out, q, k, v, probs, windows, scale):
    heads, n = q.shape[1], q.shape[2]
    return (q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape),
            q.new_empty((heads, n, n), dtype=_bias_grad_dtype(q.dtype)))


def _setup_context(ctx, inputs, output):
    q, k, v, bias, mask, scale = inputs
    ctx.save_for_backward(q, k, v, output[1])
    ctx.windows = 1 if mask is None else mask.shape[0]
    ctx.scale = scale
    ctx.bias_dtype = bias.dtype
    # The probabilities are an internal output: without this autograd would fill a
    # (B*nW, heads, N, N) tensor of zeros for their gradient on every backward.
    ctx.set_materialize_grads(False)


def _autograd(ctx, grad_out, grad_probs):
    if grad_out is None:  # the attention's output was not used
        return None, None, None, None, None, None
    q, k, v, probs = ctx.saved_tensors  # the probabilities are internal: their gradient is not used
    grad_q, grad_k, grad_v, grad_bias = _backward(grad_out.contiguous(), q, k, v, probs, ctx.windows, ctx.scale)
    return grad_q, grad_k, grad_v, grad_bias.to(ctx.bias_dtype), None, None


_forward.register_autograd(_autograd, setup_context=_setup_context)
_ATEN = choice.Formulation(forward=_forward_aten, backward=_backward_aten)


def window_attention(q: Tensor, k: Tensor, v: Tensor, rel_pos_bias: Tensor, mask: Tensor | None = None,
                     scale: float | None = None) -> Tensor:
    """Attention within windows, with a relative-position bias and an optional shift mask.

    ``softmax(q @ k.T * scale + rel_pos_bias + mask[window]) @ v`` per window and head.

    Args:
        q, k, v: ``(B * nW, heads, N, head_dim)``, windows stacked image-major (window ``i`` of
            image ``b`` at row ``b * nW + i``).
        rel_pos_bias: ``(heads, N, N)``, already gathered from the bias table; differentiable.
        mask: ``(nW, N, N)`` additive mask of the shifted windows (0 or a large negative such as
            -100), or None for unshifted windows. Not differentiable.
        scale: Multiplies the scores; default ``head_dim ** -0.5``.

    Returns:
        ``(B * nW, heads, N, head_dim)``, differentiable in ``q``, ``k``, ``v`` and ``rel_pos_bias``.

    Raises:
        ValueError: shapes that do not fit together (named).
    """
    # On CUDA too: SDPA's memory-efficient kernel with the bias measured 0.76-1.00x of the eager
    # twin on an H200 (docs/gpu-check.md); the operator makes fewer passes over the scores than eager.
    return window_attention_op(q, k, v, rel_pos_bias, mask, scale)


def window_attention_op(q: Tensor, k: Tensor, v: Tensor, rel_pos_bias: Tensor, mask: Tensor | None = None,
                        scale: float | None = None) -> Tensor:
    """The custom operator (``fused_ops::window_attention_fwd`` and its backward) on any device:
    what :func:`window_attention` runs. Same arguments."""
    _check(q, k, v, rel_pos_bias, mask)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    # q, k, v as given: the CPU kernel reads the views of a qkv projection in place, and the ATen
    # formulation's reshapes copy where they must.
    out, _ = _forward(q, k, v, rel_pos_bias.contiguous(), None if mask is None else mask.contiguous(), scale)
    return out


def window_attention_reference(q: Tensor, k: Tensor, v: Tensor, rel_pos_bias: Tensor, mask: Tensor | None = None,
                               scale: float | None = None) -> Tensor:
    """The textbook formulation (Swin's ``WindowAttention.forward`` after the qkv projection), in
    eager PyTorch: the twin the operator is tested against. Same arguments as
    :func:`window_attention`."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    attn = (q * scale) @ k.transpose(-2, -1)
    attn = attn + rel_pos_bias.unsqueeze(0)
    if mask is not None:
        windows = mask.shape[0]
        attn = attn.view(-1, windows, q.shape[1], q.shape[2], q.shape[2]) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, q.shape[1], q.shape[2], q.shape[2])
    return attn.softmax(dim=-1) @ v


def window_attention_sdpa(q: Tensor, k: Tensor, v: Tensor, rel_pos_bias: Tensor, mask: Tensor | None = None,
                          scale: float | None = None) -> Tensor:
    """Window attention as one call of PyTorch's fused ``scaled_dot_product_attention`` (its
    memory-efficient kernel takes an additive bias and returns the bias gradient), so the scores
    never reach global memory. Same arguments. Kept beside the operator for comparison: on an
    H200 it measured 0.76-1.00x of the eager twin (``docs/gpu-check.md``).

    The windows of one image become the "heads" of one SDPA batch entry: ``q`` viewed as
    ``(B, nW * heads, N, head_dim)``, so the ``(nW, heads, N, N)`` bias-plus-mask is one
    ``(1, nW * heads, N, N)`` tensor broadcast over the images (stride 0), never a copy per
    image. Its rows sit in a buffer padded to a multiple of 16 elements, the alignment the
    memory-efficient kernel needs (otherwise SDPA pads a copy itself). On CPU it runs too (SDPA's
    CPU kernels), which is how CI checks this formulation without a GPU.
    """
    _check(q, k, v, rel_pos_bias, mask)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    bw, heads, n, d = q.shape
    windows = 1 if mask is None else mask.shape[0]
    images = bw // windows
    padded = -(-n // 16) * 16
    rows = q.new_zeros((windows, heads, n, padded))
    rows[..., :n] = _bias_mask(rel_pos_bias, mask, q.dtype)
    attn_bias = rows[..., :n].reshape(1, windows * heads, n, n).expand(images, -1, -1, -1)
    view = (images, windows * heads, n, d)
    out = torch.nn.functional.scaled_dot_product_attention(q.reshape(view), k.reshape(view), v.reshape(view),
                                                           attn_mask=attn_bias, scale=scale)
    # CUDA's fused kernels return (B, N, H, D) memory seen as (B, H, N, D): a copy back into the
    # stacked windows' layout there, none on CPU, where the result is contiguous
    return out.reshape(bw, heads, n, d)
