"""fused_ops.native: the CPU kernel of window attention (fused_ops/csrc/window_attention.cpp),
built with the machine's compiler, against the eager twin forward and backward, with and without
padding and shift masks; the build cache; and the fallback where no kernel can be built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perfscope.fused_ops import native, window_attention, window_attention_reference
from perfscope.fused_ops.swin import shift_mask

ROOT = Path(__file__).resolve().parents[1]
TOL = {"rtol": 1e-5, "atol": 1e-5}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def built():
    """The kernel, built; skipped without a compiler, failed under CI (which has one)."""
    if native.kernel() is None:
        if in_ci() or shutil.which("c++") or shutil.which("g++"):
            pytest.fail(f"the window attention kernel was not built: {native.status()}")
        pytest.skip(native.status())
    return native.kernel()


def case(images, windows, heads, n, d, shifted, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(images * windows, heads, n, d, generator=g).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(heads, n, n, generator=g)).requires_grad_()
    region = torch.randint(0, 3, (windows, n), generator=g)
    mask = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0) if shifted else None
    return q, k, v, bias, mask, torch.randn(q.shape, generator=g)


def grads(fn, q, k, v, bias, mask, grad):
    for t in (q, k, v, bias):
        t.grad = None
    out = fn(q, k, v, bias, mask)
    out.backward(grad)
    return [out.detach()] + [t.grad.detach() for t in (q, k, v, bias)]


# (images, windows, heads, N, head_dim): Swin's 49 tokens (rows padded to 64, a 1-row tail in
# every product), an exact 16, a 144-token window of 64 channels, a single token, 40 tokens of 48
# channels (a 3-vector column block), 33 tokens of the largest head (256).
SHAPES = [(3, 4, 3, 49, 32), (1, 4, 5, 16, 16), (2, 2, 1, 144, 64), (5, 2, 2, 1, 16), (1, 2, 2, 40, 48),
          (2, 2, 1, 33, 256)]


@pytest.mark.parametrize("shifted", [True, False], ids=["shifted", "unshifted"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{s[3]}-d{s[4]}" for s in SHAPES])
def test_the_kernel_matches_the_eager_twin_forward_and_backward(built, shape, shifted):
    q, k, v, bias, mask, grad = case(*shape, shifted)
    assert native.usable(q.detach(), k, v, bias, mask)
    ours = grads(window_attention, q, k, v, bias, mask, grad)
    with native.off():
        aten = grads(window_attention, q, k, v, bias, mask, grad)
    ref = grads(window_attention_reference, q, k, v, bias, mask, grad)
    for name, a, b, c in zip(("out", "q", "k", "v", "rel_pos_bias"), ours, aten, ref):
        scale = max(1.0, c.abs().max().item())  # the bias gradient sums over every window
        torch.testing.assert_close(a / scale, c / scale, **TOL, msg=f"kernel {name}")
        torch.testing.assert_close(b / scale, c / scale, **TOL, msg=f"aten {name}")


# bf16: the kernel widens the values to fp32, computes in fp32 and rounds its results once (the
# probabilities it saves for the backward too): against the fp32 twin on the same (rounded) values
# that is within two roundings of bf16 (2^-8 each, relative to the largest value); the bf16 twin
# rounds after every operator and stays within the bf16 tolerance of tests/test_fused_window_attention.py.
BF16_TOL = {"rtol": 1e-2, "atol": 1e-2}


@pytest.mark.parametrize("shifted", [True, False], ids=["shifted", "unshifted"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{s[3]}-d{s[4]}" for s in SHAPES])
def test_the_bf16_kernel_matches_the_twin_on_the_same_values(built, shape, shifted):
    q, k, v, bias, mask, grad = case(*shape, shifted)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    assert native.usable(qb.detach(), kb, vb, bias, mask)  # bias and mask fp32, as under autocast
    ours = grads(window_attention, qb, kb, vb, bias, mask, grad.bfloat16())
    assert [t.dtype for t in ours] == [torch.bfloat16] * 4 + [torch.float32]
    wide = [t.detach().float().requires_grad_() for t in (qb, kb, vb)]
    ref = grads(window_attention_reference, *wide, bias, mask, grad.bfloat16().float())
    low = grads(window_attention_reference, qb, kb, vb, bias.detach().bfloat16().requires_grad_(),
                None if mask is None else mask.bfloat16(), grad.bfloat16())
    for name, a, b, c in zip(("out", "q", "k", "v", "rel_pos_bias"), ours, ref, low):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.float() / scale, b / scale, **BF16_TOL, msg=f"fp32 twin {name}")
        torch.testing.assert_close(a.float() / scale, c.float() / scale, rtol=2e-2, atol=2e-2, msg=f"bf16 twin {name}")


BF16_WITHOUT_DOT = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_fused_native import case, grads, BF16_TOL
from perfscope.fused_ops import native, window_attention, window_attention_reference
assert native.status() == "built", native.status()
for shape, shifted in (((3, 4, 3, 49, 32), True), ((1, 2, 2, 40, 48), False), ((5, 2, 2, 1, 16), False)):
    q, k, v, bias, mask, grad = case(*shape, shifted)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    assert native.usable(qb.detach(), kb, vb, bias, mask)
    ours = grads(window_attention, qb, kb, vb, bias, mask, grad.bfloat16())
    wide = [t.detach().float().requires_grad_() for t in (qb, kb, vb)]
    ref = grads(window_attention_reference, *wide, bias, mask, grad.bfloat16().float())
    for name, a, b in zip(("out", "q", "k", "v", "rel_pos_bias"), ours, ref):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.float() / scale, b / scale, **BF16_TOL, msg=name)
print("ok")
"""


def test_the_bf16_kernel_built_without_bf16_dot_products_widens_to_fp32(built, tmp_path):
    # The kernel multiplies bf16 in pairs where the compiler targets AVX512-BF16 and widens the
    # values to fp32 elsewhere: a compiler told to leave the instructions out builds the second
    # path on any machine, checked here against the fp32 twin as the first.
    real = shutil.which("c++") or shutil.which("g++")
    cxx = tmp_path / "cxx"
    cxx.write_text(f'#!/bin/sh\nexec {real} "$@" -mno-avx512bf16\n')
    cxx.chmod(0o755)
    env = {**os.environ, "PERFSCOPE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)}
    done = _python(BF16_WITHOUT_DOT.format(tests=str(ROOT / "tests")), env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_bf16_kernel_rounds_to_nearest_even_and_keeps_nans(built):
    # Tokens attend in pairs with probability 1/2 each (scores 0 on the pair, -1e4 elsewhere), so
    # each output is the exact fp32 mean of two bf16 values: pairs chosen so that the means fall
    # half-way between two bf16 numbers must round to the even one, as torch's conversion does
    # (truncation or rounding half up would differ on one of the two).
    n, d = 16, 16
    first = torch.tensor([1.0, 1 + 2 ** -7, -1.0, 3.0, 1e-3, -7.5, 0.0, 2.0])
    second = torch.tensor([1 + 2 ** -7, 1 + 2 ** -6, -(1 + 2 ** -7), 3.0625, 1.5e-3, -7.5, 1.0, 1e30])
    v = torch.stack([first, second], 1).reshape(n, 1).expand(n, d).clone().view(1, 1, n, d).bfloat16()
    q = k = torch.zeros(1, 1, n, d, dtype=torch.bfloat16)
    pair = torch.arange(n) // 2
    bias = torch.where(pair[:, None] == pair[None, :], 0.0, -1e4).unsqueeze(0)
    with torch.no_grad():
        out, probs = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, None, 1.0)
    wide = v.float()
    mean = (wide + wide.view(1, 1, n // 2, 2, d).flip(3).reshape(1, 1, n, d)) / 2
    assert out.dtype == probs.dtype == torch.bfloat16
    assert torch.equal(out, mean.bfloat16())
    assert torch.equal(out[0, 0, :2, 0], torch.tensor([1.0, 1.0], dtype=torch.bfloat16))  # 1 + 2^-8: a tie, to even
    assert torch.equal(probs.float() * 2, (pair[:, None] == pair[None, :]).float().view(1, 1, n, n))
    v[0, 0, 3, 5] = float("nan")  # spreads down its column (0 x NaN is NaN), as in the twin
    with torch.no_grad():
        out, _ = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, None, 1.0)
        ref = window_attention_reference(q.float(), k.float(), v.float(), bias, None, 1.0)
    assert out.isnan().any() and torch.equal(out.isnan(), ref.isnan())


def test_the_kernel_gives_the_same_result_on_one_thread_and_on_several(built):
    q, k, v, bias, mask, grad = case(4, 4, 3, 49, 32, True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = grads(window_attention, q, k, v, bias, mask, grad)
        torch.set_num_threads(max(2, threads))
        many = grads(window_attention, q, k, v, bias, mask, grad)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_swins_shift_mask_gives_no_subnormal_probability(built):
    # exp() of the masked scores is below fp32's smallest normal: the kernel flushes it to 0.
    q, k, v, bias, _, _ = case(2, 4, 2, 49, 16, False)
    mask = shift_mask(14, 14, 7, 3)
    with torch.no_grad():
        _, probs = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, mask, 0.25)
        ref = torch.softmax(0.25 * q @ k.transpose(-2, -1) + bias + mask.repeat(2, 1, 1).unsqueeze(1), -1)
    tiny = torch.finfo(torch.float32).tiny
    assert ((ref > 0) & (ref < tiny)).any()
    assert not ((probs > 0) & (probs < tiny)).any()
    torch.testing.assert_close(probs, ref, rtol=1e-5, atol=1e-7)


def test_masked_rows_and_nan_inputs_behave_as_the_twin(built):
    q, k, v, bias, mask, _ = case(1, 2, 1, 9, 16, True)
    mask = mask.clone()
    mask[0, 3] = float("-inf")  # a row masked everywhere: NaN, as softmax gives
    mask[1, 2, :4] = float("-inf")  # partly: those probabilities 0
    with torch.no_grad():
        q[1, 0, 5, 0] = float("nan")  # spreads to that row only
        out = window_attention(q, k, v, bias, mask)
        ref = window_attention_reference(q, k, v, bias, mask)
    assert torch.equal(out.isnan(), ref.isnan())
    keep = ~ref.isnan()
    torch.testing.assert_close(out[keep], ref[keep], **TOL)


def test_opcheck_with_the_kernel(built):
    q, k, v, bias, mask, grad = case(2, 2, 3, 9, 16, True)
    torch.library.opcheck(torch.ops.fused_ops.window_attention_fwd.default, (q, k, v, bias, mask, 0.25))
    with torch.no_grad():
        _, probs = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, mask, 0.25)
    torch.library.opcheck(torch.ops.fused_ops.window_attention_bwd.default,
                          (grad, q.detach(), k.detach(), v.detach(), probs, 2, 0.25))
    compiled = torch.compile(window_attention, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, bias, mask), window_attention_reference(q, k, v, bias, mask), **TOL)


def test_shapes_and_dtypes_the_kernel_does_not_take_run_the_aten_formulation(built):
    for d, dtype in ((8, torch.float32), (32, torch.float64), (32, torch.float16), (8, torch.bfloat16)):
        q = torch.zeros(2, 1, 9, d, dtype=dtype)
        assert not native.usable(q, q, q, torch.zeros(1, 9, 9), None), (d, dtype)
    q, k, v, bias, mask, grad = case(1, 2, 2, 9, 24, True)  # head_dim 24: not whole vectors
    assert not native.usable(q.detach(), k, v, bias, mask)
    out = grads(window_attention, q, k, v, bias, mask, grad)
    ref = grads(window_attention_reference, q, k, v, bias, mask, grad)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, **TOL)


def test_mixed_dtypes_are_refused_as_without_the_kernel(built):
    # The kernel reads every tensor as fp32: k and v of another dtype must not reach it.
    q, k, v, bias, _, _ = case(1, 2, 2, 9, 16, False)
    for other in (torch.float64, torch.bfloat16):
        assert not native.usable(q, k.to(other), v.to(other), bias, None)
        with torch.no_grad(), pytest.raises(RuntimeError):
            window_attention(q, k.to(other), v.to(other), bias)
        with torch.no_grad(), native.off(), pytest.raises(RuntimeError):
            window_attention(q, k.to(other), v.to(other), bias)
    # bias and mask in another dtype are converted, as the ATen formulation does
    q, k, v, bias, mask, _ = case(1, 2, 2, 9, 16, True)
    with torch.no_grad():
        torch.testing.assert_close(window_attention(q, k, v, bias.double(), mask.half()),
                                   window_attention_reference(q, k, v, bias, mask.half().float()), **TOL)


def test_the_ops_called_directly_with_non_contiguous_or_misshapen_inputs(built):
    q, k, v, bias, mask, grad = case(2, 2, 2, 9, 16, True)
    q, k, v = (t.detach() for t in (q, k, v))
    k_strided = k.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    assert not k_strided.is_contiguous()
    with torch.no_grad():
        out, probs = torch.ops.fused_ops.window_attention_fwd(q, k_strided, v, bias, mask, 0.25)
        torch.testing.assert_close(out, window_attention_reference(q, k, v, bias, mask, 0.25), **TOL)
        g = torch.ops.fused_ops.window_attention_bwd(grad.transpose(2, 3).contiguous().transpose(2, 3), q, k_strided,
                                                     v, probs, 2, 0.25)
        g_ref = torch.ops.fused_ops.window_attention_bwd(grad, q, k, v, probs, 2, 0.25)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, **TOL)
    # a bias, mask or probabilities of the wrong shape never reach the kernel
    assert not native.usable(q, k, v, bias[:, :8], mask)
    assert not native.usable(q, k, v, bias, mask[:, :8])
    assert not native.usable(q, k, v, bias, torch.cat([mask, mask[:1]]))  # 3 windows do not divide 4
    assert not native.usable_backward(grad, q, k, v, probs[:, :, :8])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shifted", [True, False], ids=["shifted", "unshifted"])
def test_views_of_a_qkv_projection_are_read_in_place(built, shifted, dtype):
    # As Swin splits its projection: (B*nW, N, 3, heads, D) permuted to (3, B*nW, heads, N, D).
    g = torch.Generator().manual_seed(3)
    bw, n, heads, d = 8, 49, 3, 32
    qkv = torch.randn(bw, n, 3 * heads * d, generator=g).to(dtype).requires_grad_()
    bias = (0.5 * torch.randn(heads, n, n, generator=g)).requires_grad_()  # fp32, as under autocast
    mask = case(2, 4, 1, n, d, True)[4] if shifted else None
    grad = torch.randn(bw, heads, n, d, generator=g).to(dtype)
    tol = TOL if dtype == torch.float32 else BF16_TOL

    def run(fn):
        qkv.grad = bias.grad = None
        q, k, v = qkv.view(bw, n, 3, heads, d).permute(2, 0, 3, 1, 4)
        assert not q.is_contiguous() and q.stride(3) == 1
        if fn is reference:  # the twin on the same values, in fp32
            q, k, v = (t.float() for t in (q, k, v))
        out = fn(q, k, v, bias, mask)
        out.backward(grad.to(out.dtype))
        return out.detach().float(), qkv.grad.float(), bias.grad.clone()

    def reference(q, k, v, bias, mask):
        return window_attention_reference(q, k, v, bias, mask)

    q, k, v = qkv.detach().view(bw, n, 3, heads, d).permute(2, 0, 3, 1, 4)
    assert native.usable(q, k, v, bias, mask)
    ours, ref = run(window_attention), run(reference)
    with native.off():
        aten = run(window_attention)
    for a, b, c in zip(ours, aten, ref):
        scale = max(1.0, c.abs().max().item())
        torch.testing.assert_close(a / scale, c / scale, **tol)
        torch.testing.assert_close(b / scale, c / scale, rtol=2 * tol["rtol"], atol=2 * tol["atol"])
    torch.library.opcheck(torch.ops.fused_ops.window_attention_fwd.default, (q, k, v, bias.detach(), mask, 0.2))


def test_a_token_stride_beyond_the_kernels_int_indexing_is_copied_first(built):
    base = torch.randn((1 << 21) + 16, generator=torch.Generator().manual_seed(4))
    q = base.as_strided((1, 1, 2, 16), (0, 0, 1 << 21, 1))  # two tokens 8 MiB apart
    assert native._rows(q).is_contiguous() and native._rows(q).data_ptr() != q.data_ptr()
    view = base[:2 * 16 * 3].view(2, 3, 16).permute(1, 0, 2).unsqueeze(0)[:, :1]  # a stride within bounds
    assert native._rows(view).data_ptr() == view.data_ptr()
    bias = torch.zeros(1, 2, 2)
    with torch.no_grad():
        torch.testing.assert_close(window_attention(q, q, q, bias), window_attention_reference(q, q, q, bias), **TOL)


def test_a_backward_whose_scratch_would_be_too_large_runs_the_aten_formulation(built, monkeypatch):
    q, k, v, bias, mask, grad = case(1, 2, 2, 9, 16, True)
    with torch.no_grad():
        _, probs = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, mask, 0.25)
    assert native.usable_backward(grad, q, k, v, probs)
    monkeypatch.setattr(native, "MAX_SCRATCH_BYTES", 1024)
    assert not native.usable_backward(grad, q, k, v, probs)
    ours = grads(window_attention, q, k, v, bias, mask, grad)
    ref = grads(window_attention_reference, q, k, v, bias, mask, grad)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **TOL)


def _python(code: str, env: dict, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
                          check=False)


STATUS = "from perfscope.fused_ops import native; print(native.status()); print(sorted(p.name for p in native.cache_dir().glob('*')))"


def test_the_build_is_cached_and_reused_by_the_next_process(built, tmp_path):
    # A compiler that logs what it is asked: the second process only asks for its version.
    log, cxx = tmp_path / "calls.log", tmp_path / "cxx"
    real = shutil.which("c++") or shutil.which("g++")
    cxx.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    cxx.chmod(0o755)
    env = {**os.environ, "PERFSCOPE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)}
    first = _python(STATUS, env)
    assert first.returncode == 0 and first.stdout.startswith("built"), first.stderr
    libs = list((tmp_path / "cache" / "native").glob("window_attention-*.so"))
    assert len(libs) == 1 and not list((tmp_path / "cache" / "native").glob("*.tmp*")), first.stdout  # no leftovers
    builds = [line for line in log.read_text().splitlines() if line != "--version"]
    assert len(builds) == 1 and "-march=native" in builds[0], builds
    second = _python(STATUS, env)
    assert second.stdout.startswith("built"), second.stdout
    assert [line for line in log.read_text().splitlines() if line != "--version"] == builds  # not built again


def test_processes_building_at_once_all_get_the_kernel(built, tmp_path):
    env = {**os.environ, "PERFSCOPE_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", STATUS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(o.startswith("built") for o, _ in outs), outs
    assert len(list((tmp_path / "native").glob("*.so"))) == 1


@pytest.mark.parametrize(("env", "expected"), [
    ({"PERFSCOPE_NATIVE": "0"}, "off (PERFSCOPE_NATIVE=0)"),
    ({"CXX": "", "PATH": ""}, "no C++ compiler"),
    ({"CXX": "clang++-not-here", "PATH": ""}, "no C++ compiler"),
    ({"CXX": "/bin/false"}, "not built: false failed"),
])
def test_without_a_kernel_the_status_says_why_and_results_stay_right(tmp_path, env, expected):
    code = (STATUS.split(";")[0] + "; import torch; print(native.status()); "
            "from perfscope.fused_ops import window_attention, window_attention_reference as ref; "
            "q = torch.randn(4, 2, 9, 16); b = torch.randn(2, 9, 9); "
            "print(torch.allclose(window_attention(q, q, q, b), ref(q, q, q, b), atol=1e-5))")
    run_env = {**os.environ, "PERFSCOPE_CACHE_DIR": str(tmp_path), **env}
    if env.get("PATH") == "":
        run_env["PATH"] = str(tmp_path / "empty")  # nothing to run there
    done = _python(code, run_env)
    assert done.returncode == 0, done.stderr[-2000:]
    status, ok = done.stdout.splitlines()[-2:]
    assert status.startswith(expected) and ok == "True", done.stdout


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_the_kernel_runs_on_the_openmp_runtime_pytorch_loaded(built):
    # Two OpenMP runtimes would mean two thread pools competing for the cores (fused_ops/native.py).
    runtimes = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if "libgomp" in line or "libiomp" in line or "libomp" in line}
    assert len(runtimes) == 1, runtimes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_values_near_the_largest_float_stay_finite_as_in_the_aten_formulation(built, dtype):
    # P V with |v| near 1e38: each output is a convex mix of the values (finite); summing
    # unnormalised probabilities times 49 such values first overflowed to inf.
    n, d = 49, 32
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, 3, n, d, generator=g).to(dtype) for _ in range(2))
    v = (torch.rand(2, 3, n, d, generator=g) * 2e38 + 1e38).to(dtype)
    bias = torch.zeros(3, n, n)
    with torch.no_grad():
        ours, _ = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, None, 0.2)
        with native.off():
            aten, _ = torch.ops.fused_ops.window_attention_fwd(q, k, v, bias, None, 0.2)
    assert aten.isfinite().all()
    assert ours.isfinite().all()
    torch.testing.assert_close(ours.float() / 1e38, aten.float() / 1e38, rtol=1e-2, atol=1e-2)
