"""A Swin Transformer block (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using
Shifted Windows", ICCV 2021), written the textbook way, and the same block on the fused operator.

:class:`WindowAttention` keeps the attribute and parameter names of the public implementations
(``qkv``, ``proj``, ``relative_position_bias_table``, ``relative_position_index``, ``num_heads``,
``scale``), so a checkpoint of either module loads into the other; :class:`FusedWindowAttention`
is the same module with its core on :func:`perfscope.fused_ops.window_attention`. :class:`SwinBlock` does the
shift and window partition, attention and the MLP with pre-norm residuals.

Shapes: tokens ``(B, H * W, C)``; windows ``(B * nW, N, C)`` with ``N = window ** 2`` and
``nW = (H / window) * (W / window)``, stacked image-major.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from perfscope.fused_ops.attention import window_attention

__all__ = ["FusedWindowAttention", "SwinBlock", "WindowAttention", "relative_position_index",
           "region_mask", "shift_mask", "window_order"]

MASK_VALUE = -100.0  # Swin's value for token pairs from different regions of a shifted window


def relative_position_index(window: int) -> Tensor:
    """``(N, N)`` int64: for each token pair of a window, the row of the ``((2w-1)^2, heads)`` bias
    table that holds their relative offset (Swin's construction)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


def _partition(x: Tensor, window: int) -> Tensor:
    """``(B, H, W, C) -> (B * nW, window * window, C)``."""
    b, h, w, c = x.shape
    x = x.view(b, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def region_mask(height: int, width: int, window: tuple[int, int], shift: tuple[int, int]) -> Tensor:
    """``(nW, N, N)`` additive mask of the shifted windows over a ``height x width`` grid with
    ``window = (wh, ww)`` and ``shift = (sh, sw)``: 0 for token pairs from the same region of the
    rolled image, :data:`MASK_VALUE` across regions. The regions are the 3 x 3 bands Swin's
    construction cuts (``[0, -w)``, ``[-w, -s)``, ``[-s, end)`` on each axis)."""
    regions = torch.zeros(1, height, width, 1)
    rows = (slice(0, -window[0]), slice(-window[0], -shift[0]), slice(-shift[0], None))
    cols = (slice(0, -window[1]), slice(-window[1], -shift[1]), slice(-shift[1], None))
    for i, (hs, ws) in enumerate((hs, ws) for hs in rows for ws in cols):
        regions[:, hs, ws, :] = i
    b, h, w, _ = regions.shape
    ids = regions.view(b, h // window[0], window[0], w // window[1], window[1]).permute(0, 1, 3, 2, 4)
    ids = ids.reshape(-1, window[0] * window[1])
    return torch.where(ids[:, :, None] == ids[:, None, :], 0.0, MASK_VALUE)


def shift_mask(height: int, width: int, window: int, shift: int) -> Tensor:
    """:func:`region_mask` for a square window and the same shift on both axes."""
    return region_mask(height, width, (window, window), (shift, shift))


@functools.lru_cache(maxsize=64)
def window_order(height: int, width: int, window: int, shift: int) -> tuple[Tensor, Tensor]:
    """The roll by ``-shift`` and the window partition as one permutation of the ``H * W`` tokens,
    and its inverse: ``x[:, order]`` is ``partition(roll(x))`` flattened, in one gather pass
    instead of two copies, and bit-exact (it only moves values). Both int64 ``(H * W,)``."""
    grid = torch.arange(height * width).view(1, height, width, 1)
    if shift:
        grid = torch.roll(grid, shifts=(-shift, -shift), dims=(1, 2))
    order = _partition(grid, window).flatten()
    return order, torch.argsort(order)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside each window, with a learned relative-position bias.

    Args:
        dim: Channels ``C``; a multiple of ``num_heads``.
        window: Side of the square window (Swin-T: 7, so ``N = 49``).
        num_heads: Heads (Swin-T stage 1: 3).

    ``forward(x, mask=None)``: ``x`` ``(B * nW, N, C)``, ``mask`` ``(nW, N, N)`` or None; returns
    ``(B * nW, N, C)``.
    """

    def __init__(self, dim: int, window: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"WindowAttention: dim {dim} is not a multiple of num_heads {num_heads}")
        self.dim, self.window_size, self.num_heads = dim, (window, window), num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer("relative_position_index", relative_position_index(window), persistent=False)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def rel_pos_bias(self) -> Tensor:
        """``(heads, N, N)``: the bias table gathered for every token pair."""
        n = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(n, n, -1).permute(2, 0, 1).contiguous()

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        bw, n, c = x.shape
        qkv = self.qkv(x).view(bw, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        attn = (q * self.scale) @ k.transpose(-2, -1) + self.rel_pos_bias().unsqueeze(0)
        if mask is not None:
            windows, n = mask.shape[0], q.shape[2]
            attn = attn.view(-1, windows, self.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, n, n)
        return attn.softmax(dim=-1) @ v

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        bw, n, c = x.shape
        out = self.attend(*self.split_heads(x), mask)
        return self.proj(out.transpose(1, 2).reshape(bw, n, c))


class FusedWindowAttention(WindowAttention):
    """:class:`WindowAttention` with its core on :func:`perfscope.fused_ops.window_attention`: the same
    parameters and ``state_dict``, one operator instead of about ten."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return window_attention(q, k, v, self.rel_pos_bias(), mask, self.scale)


class SwinBlock(nn.Module):
    """One Swin block: (shifted) window attention and an MLP, each behind a LayerNorm and a residual.

    Args:
        dim: Channels ``C``.
        resolution: ``(H, W)`` of the token grid, multiples of ``window``.
        num_heads: Attention heads.
        window: Window side.
        shift: Cyclic shift of the windows (0, or ``window // 2`` in every second block).
        mlp_ratio: Hidden width of the MLP over ``C``.

    ``forward(x)``: ``(B, H * W, C) -> (B, H * W, C)``.
    """

    def __init__(self, dim: int, resolution: tuple[int, int], num_heads: int, window: int = 7, shift: int = 0,
                 mlp_ratio: float = 4.0):
        super().__init__()
        height, width = resolution
        if height % window or width % window or not 0 <= shift < window:
            raise ValueError(f"SwinBlock: resolution {resolution} must be multiples of window {window}, "
                             f"and 0 <= shift < window (got {shift})")
        self.resolution, self.window, self.shift = (height, width), window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))
        mask = shift_mask(height, width, window, shift) if shift else None
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, length, c = x.shape
        if length != self.resolution[0] * self.resolution[1]:
            raise ValueError(f"SwinBlock: {length} tokens, but the block is built for a {self.resolution[0]} x "
                             f"{self.resolution[1]} grid ({self.resolution[0] * self.resolution[1]} tokens)")
        order, inverse = window_order(*self.resolution, self.window, self.shift)
        order, inverse = order.to(x.device), inverse.to(x.device)
        windows = self.norm1(x).index_select(1, order).view(-1, self.window * self.window, c)
        mask = None if self.attn_mask is None else self.attn_mask.to(x.dtype)
        attended = self.attn(windows, mask).view(b, length, c).index_select(1, inverse)
        x = x + attended
        return x + self.mlp(self.norm2(x))
