"""fused_ops.window_attention: opcheck, and its eager twin forward and backward at stated tolerances,
for shifted and unshifted windows, odd head counts and image counts that are not multiples of the
mask's window count."""

from __future__ import annotations

import pytest
import torch

from perfscope.fused_ops import window_attention, window_attention_reference

# fp32: the same products in another order; bf16: 8-bit mantissas, relative to the values' scale.
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def swin_mask(windows: int, n: int, seed: int = 0) -> torch.Tensor:
    """A shift mask as Swin builds it: 0 within a region, -100 across regions."""
    g = torch.Generator().manual_seed(seed)
    region = torch.randint(0, 3, (windows, n), generator=g)
    return torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)


def inputs(images=3, windows=4, heads=3, n=49, d=32, dtype=torch.float32, shifted=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(images * windows, heads, n, d, generator=g).to(dtype).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(heads, n, n, generator=g)).to(dtype).requires_grad_()
    mask = swin_mask(windows, n, seed).to(dtype) if shifted else None  # a buffer of the model's dtype, as in Swin
    return q, k, v, bias, mask


def run(fn, q, k, v, bias, mask, grad):
    for t in (q, k, v, bias):
        t.grad = None
    out = fn(q, k, v, bias, mask)
    out.backward(grad)
    return out.detach(), [t.grad.detach() for t in (q, k, v, bias)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shifted", [True, False], ids=["shifted", "unshifted"])
@pytest.mark.parametrize(("images", "windows", "heads"), [(3, 4, 3), (1, 4, 5), (5, 2, 1)])
def test_forward_and_backward_match_the_eager_twin(dtype, shifted, images, windows, heads):
    q, k, v, bias, mask = inputs(images, windows, heads, n=16, d=8, dtype=dtype, shifted=shifted)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    out, grads = run(window_attention, q, k, v, bias, mask, grad)
    ref_out, ref_grads = run(window_attention_reference, q, k, v, bias, mask, grad)
    torch.testing.assert_close(out, ref_out, **TOLERANCE[dtype])
    for name, a, b in zip(("q", "k", "v", "rel_pos_bias"), grads, ref_grads):
        assert a.dtype == b.dtype, name
        scale = max(1.0, b.abs().max().item())  # the bias gradient sums over every window
        torch.testing.assert_close(a / scale, b / scale, **TOLERANCE[dtype], msg=name)


def test_opcheck_forward_and_backward_ops():
    q, k, v, bias, mask = inputs(images=2, windows=2, heads=3, n=9, d=4)
    args = (q, k, v, bias, mask, 0.5)
    torch.library.opcheck(torch.ops.fused_ops.window_attention_fwd.default, args)
    torch.library.opcheck(torch.ops.fused_ops.window_attention_fwd.default, (q, k, v, bias, None, 0.5))
    with torch.no_grad():
        _, probs = torch.ops.fused_ops.window_attention_fwd(*args)
    grad = torch.randn_like(q)
    torch.library.opcheck(torch.ops.fused_ops.window_attention_bwd.default,
                          (grad, q.detach(), k.detach(), v.detach(), probs, 2, 0.5))


def test_it_compiles_as_one_node_and_gives_the_same_result():
    q, k, v, bias, mask = inputs(images=2, windows=2, heads=3, n=9, d=4)
    compiled = torch.compile(window_attention, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, bias, mask), window_attention(q, k, v, bias, mask))


def test_the_bias_and_mask_are_broadcast_not_copied_per_image():
    # 64 images of 4 windows: a per-image copy of the (windows, heads, N, N) bias-plus-mask would be
    # 64x the size; the result must still equal the reference.
    q, k, v, bias, mask = inputs(images=64, windows=4, heads=2, n=9, d=4)
    with torch.no_grad():
        torch.testing.assert_close(window_attention(q, k, v, bias, mask), window_attention_reference(q, k, v, bias, mask))


@pytest.mark.parametrize(("change", "match"), [
    (lambda a: (a[0][:, :, :, :2], *a[1:]), "share one"),
    (lambda a: (*a[:3], a[3][:1], a[4]), "rel_pos_bias"),
    (lambda a: (*a[:4], a[4][:3]), "multiple"),
])
def test_shapes_that_do_not_fit_are_named(change, match):
    args = inputs(images=1, windows=4, heads=3, n=9, d=4)
    with pytest.raises(ValueError, match=match):
        window_attention(*change(args))


@pytest.mark.parametrize("shifted", [True, False], ids=["shifted", "unshifted"])
def test_the_sdpa_formulation_matches_the_eager_twin(shifted):
    # window_attention_sdpa, kept beside the operator for comparison on GPUs (docs/gpu-check.md):
    # on CPU the same formulation (windows as SDPA heads, the bias broadcast over images from a
    # padded buffer) runs through SDPA's CPU kernels, forward and backward.
    from perfscope.fused_ops.attention import window_attention_sdpa

    q, k, v, bias, mask = inputs(images=3, windows=4, heads=3, n=16, d=8, shifted=shifted)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    out, grads = run(window_attention_sdpa, q, k, v, bias, mask, grad)
    ref_out, ref_grads = run(window_attention_reference, q, k, v, bias, mask, grad)
    torch.testing.assert_close(out, ref_out, **TOLERANCE[torch.float32])
    for name, a, b in zip(("q", "k", "v", "rel_pos_bias"), grads, ref_grads):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a / scale, b / scale, **TOLERANCE[torch.float32], msg=name)


def test_no_subnormal_probability_reaches_the_products():
    # Swin's -100 shift mask puts exp() of the masked scores below fp32's smallest normal number;
    # the guard raises them to exp(-GUARD_SPAN) of the row maximum (fused_ops/attention.py).
    from perfscope.fused_ops.attention import GUARD_SPAN
    from perfscope.fused_ops.swin import shift_mask

    q, k, v, bias, _ = inputs(images=2, windows=4, heads=2, n=49, d=8)
    mask = shift_mask(14, 14, 7, 3)
    with torch.no_grad():
        _, probs = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, mask, 8 ** -0.5)
        ref = torch.softmax((q * 8 ** -0.5) @ k.transpose(-2, -1) + bias + mask.repeat(2, 1, 1).unsqueeze(1), -1)
    tiny = torch.finfo(torch.float32).tiny
    assert ((ref > 0) & (ref < tiny)).any()  # the reference does produce subnormals here
    assert not ((probs > 0) & (probs < tiny)).any()
    row_max = probs.amax(-1, keepdim=True)
    assert (probs >= row_max * torch.exp(torch.tensor(-GUARD_SPAN)) * 0.99).all()
    torch.testing.assert_close(probs, ref, rtol=1e-5, atol=1e-7)  # the raised entries add < 1e-15


def test_the_fused_shift_and_partition_is_bit_exact():
    from perfscope.fused_ops.swin import _partition, window_order

    x = torch.randn(2, 14, 21, 5)
    for shift in (0, 3):
        order, inverse = window_order(14, 21, 7, shift)
        windows = x.reshape(2, -1, 5).index_select(1, order).view(-1, 49, 5)
        assert torch.equal(windows, _partition(torch.roll(x, (-shift, -shift), (1, 2)), 7))
        assert torch.equal(windows.view(2, -1, 5).index_select(1, inverse), x.reshape(2, -1, 5))


def test_inputs_on_two_devices_and_an_empty_mask_are_named():
    q, k, v, bias, mask = inputs(images=1, windows=4, heads=3, n=9, d=4)
    with pytest.raises(ValueError, match="one device"):
        window_attention(q, k, v, bias, mask.to("meta"))
    with pytest.raises(ValueError, match="nW >= 1"):
        window_attention(q, k, v, bias, mask[:0])


def test_the_guard_leaves_rows_alone_when_their_scale_leaves_no_room():
    # At |scores| ~ 3e9, max - 40 rounds to max in fp32: raising to it would flatten the row.
    q, k, v, bias, mask = inputs(images=2, windows=4, heads=2, n=9, d=4)
    with torch.no_grad():
        out = window_attention(q * 3e9, k, v, bias, mask)
        ref = window_attention_reference(q * 3e9, k, v, bias, mask)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_float64_keeps_its_precision_in_the_bias_gradient():
    q, k, v, bias, mask = inputs(images=3, windows=4, heads=2, n=9, d=4, dtype=torch.float64)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _, grads = run(window_attention, q, k, v, bias, mask, grad)
    _, ref_grads = run(window_attention_reference, q, k, v, bias, mask, grad)
    assert grads[3].dtype == torch.float64
    torch.testing.assert_close(grads[3], ref_grads[3], rtol=1e-10, atol=1e-10)
