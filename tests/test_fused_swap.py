"""fused_ops.swap: finds the window attention modules it knows (this project's Swin block, and the
timm and torchvision layouts, written here after their public code), replaces them in place with the
same outputs and gradients, keeps state_dict both ways, and leaves alone what it would compute
differently (attention dropout, Swin V2's cosine attention), saying why."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perfscope import fused_ops
from perfscope.fused_ops.swin import SwinBlock, WindowAttention, region_mask, relative_position_index

TOL = {"rtol": 1e-5, "atol": 1e-5}
ROOT = Path(__file__).resolve().parents[1]


class TimmStyleWindowAttention(nn.Module):
    """timm's ``WindowAttention`` layout: forward(x (B*nW, N, C), mask (nW, N, N) or None)."""

    def __init__(self, dim, window, num_heads, attn_drop=0.0):
        super().__init__()
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(0.02 * torch.randn((2 * window - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window).view(-1), persistent=False)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(attn_drop), nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index].view(n, n, -1).permute(2, 0, 1)
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(-1, nw, self.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, n, n)
        attn = self.attn_drop(self.softmax(attn))
        return self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, -1)))


class TorchvisionStyleShiftedWindowAttention(nn.Module):
    """torchvision's ``ShiftedWindowAttention`` layout: forward(x (B, H, W, C)) pads, shifts,
    partitions and masks itself."""

    def __init__(self, dim, window_size, shift_size, num_heads, attention_dropout=0.0):
        super().__init__()
        self.window_size, self.shift_size, self.num_heads = list(window_size), list(shift_size), num_heads
        self.attention_dropout, self.dropout = attention_dropout, 0.0
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        w = window_size[0]
        self.relative_position_bias_table = nn.Parameter(0.02 * torch.randn((2 * w - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(w).flatten(), persistent=False)

    def forward(self, x):
        b, h, w, c = x.shape
        wh, ww = self.window_size
        x = F.pad(x, (0, 0, 0, (ww - w % ww) % ww, 0, (wh - h % wh) % wh))
        ph, pw = x.shape[1:3]
        shift = [0 if wh >= ph else self.shift_size[0], 0 if ww >= pw else self.shift_size[1]]
        if sum(shift):
            x = torch.roll(x, (-shift[0], -shift[1]), (1, 2))
        x = x.view(b, ph // wh, wh, pw // ww, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, wh * ww, c)
        n = wh * ww
        q, k, v = self.qkv(x).reshape(x.shape[0], n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q * (c // self.num_heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index].view(n, n, -1).permute(2, 0, 1)
        attn = attn + bias.unsqueeze(0)
        if sum(shift):
            mask = region_mask(ph, pw, (wh, ww), tuple(shift))
            attn = attn.view(-1, mask.shape[0], self.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, n, n)
        x = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, n, c)
        x = self.proj(x).view(b, ph // wh, pw // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(b, ph, pw, c)
        if sum(shift):
            x = torch.roll(x, shift, (1, 2))
        return x[:, :h, :w, :].contiguous()


def grads_of(model, x, **kwargs):
    model.zero_grad()
    out = model(x, **kwargs)
    out.backward(torch.ones_like(out))
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_math(model, x, **kwargs):
    """swap(a copy) gives the original's outputs and parameter gradients."""
    fused = copy.deepcopy(model)
    swapped = fused_ops.swap(fused)
    assert swapped
    out, grads = grads_of(model, x, **kwargs)
    f_out, f_grads = grads_of(fused, x, **kwargs)
    torch.testing.assert_close(f_out, out, **TOL)
    for name in grads:
        torch.testing.assert_close(f_grads[name], grads[name], **TOL, msg=name)
    return fused, swapped


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(SwinBlock(16, (14, 14), 2, 7, 0), SwinBlock(16, (14, 14), 2, 7, 3))

    def forward(self, x):
        return self.blocks(x)


def test_the_projects_swin_blocks_are_swapped_with_the_same_math_and_state_dict():
    model = Stack()
    fused, swapped = assert_same_math(model, torch.randn(3, 196, 16))
    assert swapped == ["blocks.0.attn", "blocks.1.attn"]
    assert all(isinstance(fused.get_submodule(n), fused_ops.FusedWindowAttention) for n in swapped)
    assert list(fused.state_dict()) == list(model.state_dict())
    plain = Stack()
    plain.load_state_dict(fused.state_dict())  # fused -> plain
    fused.load_state_dict(Stack().state_dict())  # plain -> fused
    assert fused_ops.swap(fused) == []  # already swapped
    assert fused_ops.unswap(fused) == swapped and type(fused.blocks[0].attn) is WindowAttention


@pytest.mark.parametrize("shifted", [False, True], ids=["unshifted", "shifted"])
def test_a_timm_style_module_is_swapped_with_the_same_math(shifted):
    torch.manual_seed(1)
    module = TimmStyleWindowAttention(12, 4, 3)
    mask = region_mask(8, 8, (4, 4), (2, 2)) if shifted else None
    fused, swapped = assert_same_math(module, torch.randn(2 * 4, 16, 12), mask=mask)
    assert swapped == [""] and isinstance(fused, TimmStyleWindowAttention)


@pytest.mark.parametrize(("size", "shift"), [((8, 8), (2, 2)), ((10, 7), (2, 2)), ((4, 4), (2, 2)), ((8, 8), (0, 0))],
                         ids=["shifted", "padded", "one-window-no-shift", "unshifted"])
def test_a_torchvision_style_module_is_swapped_with_the_same_math(size, shift):
    torch.manual_seed(2)
    module = TorchvisionStyleShiftedWindowAttention(12, (4, 4), shift, 3)
    assert_same_math(module, torch.randn(2, *size, 12))


def test_what_would_compute_differently_is_found_but_not_swapped():
    model = nn.ModuleDict({"drop": TimmStyleWindowAttention(8, 4, 2, attn_drop=0.1),
                           "tv_drop": TorchvisionStyleShiftedWindowAttention(8, (4, 4), (2, 2), 2, attention_dropout=0.2),
                           "v2": TimmStyleWindowAttention(8, 4, 2)})
    model["v2"].logit_scale = nn.Parameter(torch.zeros(2, 1, 1))
    found = {c.name: c for c in fused_ops.find(model)}
    assert set(found) == {"drop", "tv_drop", "v2"}
    assert "dropout" in found["drop"].reason and "dropout" in found["tv_drop"].reason
    assert "cosine" in found["v2"].reason
    assert fused_ops.swap(model) == []
    assert fused_ops.find(nn.Sequential(nn.Linear(2, 2))) == []


def test_a_swapped_model_pickles_whole():
    model = nn.Sequential(TimmStyleWindowAttention(8, 4, 2))
    fused_ops.swap(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    assert type(again[0]) is type(model[0]) and type(again[0]).__name__.startswith("Fused")


class BeitStyleAttention(nn.Module):
    """BEiT's global attention carries the same attribute names, separate q/v biases and another
    forward signature: not the window attention the swap knows."""

    def __init__(self, dim, window, num_heads):
        super().__init__()
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim)
        self.q_bias, self.v_bias = nn.Parameter(torch.zeros(dim)), nn.Parameter(torch.zeros(dim))
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window).view(-1), persistent=False)
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, x, shared_rel_pos_bias=None):
        return x


class DoubledWindowAttention(WindowAttention):
    def forward(self, x, mask=None):
        return 2 * super().forward(x, mask)


class PlainSubclass(WindowAttention):
    """Adds nothing to the math: swapped, and still an instance of itself."""


def test_look_alikes_and_subclasses_with_their_own_math_are_left_alone():
    model = nn.ModuleDict({"beit": BeitStyleAttention(8, 4, 2), "doubled": DoubledWindowAttention(8, 4, 2),
                           "plain": PlainSubclass(8, 4, 2)})
    found = {c.name: c for c in fused_ops.find(model)}
    assert "beit" not in found  # another signature: not a pattern at all
    assert "overrides forward" in found["doubled"].reason
    assert found["plain"].reason is None
    x = torch.randn(4, 16, 8)
    expected = model["plain"](x)
    assert fused_ops.swap(model) == ["plain"]
    assert isinstance(model["plain"], PlainSubclass) and type(model["plain"]) is not PlainSubclass
    torch.testing.assert_close(model["plain"](x), expected, **TOL)


def test_a_swapped_model_loads_in_a_process_that_never_swapped(tmp_path):
    (tmp_path / "layouts.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from perfscope.fused_ops.swin import relative_position_index

        class TimmLike(nn.Module):
            def __init__(self):
                super().__init__()
                self.num_heads, self.scale = 2, 4 ** -0.5
                self.relative_position_bias_table = nn.Parameter(torch.zeros(49, 2))
                self.register_buffer("relative_position_index", relative_position_index(4).view(-1))
                self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)
                self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)

            def forward(self, x, mask=None):
                raise AssertionError("the fused forward runs after a swap")
    '''))
    save = "import torch, fused_ops, layouts; m = torch.nn.Sequential(layouts.TimmLike()); fused_ops.swap(m); " \
           "torch.save(m, 'm.pt')"
    load = "import torch, layouts; m = torch.load('m.pt', weights_only=False); " \
           "print(type(m[0]).__name__, m(torch.randn(4, 16, 8)).shape)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    for code in (save, load):
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["FusedTimmLike", "torch.Size([4,", "16,", "8])"]
