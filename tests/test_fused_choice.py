"""The window-attention operator's choice, per machine and shape, between its kernel and its ATen
formulation (perfscope.fused_ops.choice): the faster is kept, in the process and in the cache
folder, a later process reads it instead of timing again, a file another user could have written
is not read, and the choice is named by native.status()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from perfscope.fused_ops import choice, native, window_attention, window_attention_reference

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own (the kernel built there once per test), choices timed anew."""
    if native.kernel() is None:
        pytest.skip(f"no window attention kernel here: {native.status()}")
    monkeypatch.delenv("PERFSCOPE_NATIVE_CHOICE", raising=False)
    monkeypatch.setattr(choice, "_path", lambda: tmp_path / "cache" / choice.FILE)
    (tmp_path / "cache").mkdir(mode=0o700)
    choice.forget()
    yield
    choice.forget()


def inputs(shape=(16, 2, 49, 32)):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(shape[1], shape[2], shape[2], generator=g, requires_grad=True)
    return q, k, v, bias


def slowed(seconds: float) -> choice.Formulation:
    """The operator's own ATen formulation, each half made ``seconds`` slower."""
    from perfscope.fused_ops import attention

    def forward(*a):
        time.sleep(seconds)
        return attention._forward_aten(*a)

    def backward(*a):
        time.sleep(seconds)
        return attention._backward_aten(*a)

    return choice.Formulation(forward, backward)


def test_the_faster_path_is_chosen_kept_and_read_back_without_timing(monkeypatch):
    from perfscope.fused_ops import attention

    q, k, v, bias = inputs()
    assert choice.kernel_wins(q, k, v, bias, None, 0.17, slowed(0.05))  # the ATen side 100 ms slower
    (entry,) = choice.choices().values()
    assert entry["path"] == "kernel" and entry["aten_ms"] > entry["kernel_ms"] + 50
    stored = json.loads(choice._path().read_text())
    assert list(stored.values()) == [entry] and choice._path().stat().st_mode & 0o077 == 0

    # A later process: the kept choice is read, nothing is timed again.
    choice.forget()
    monkeypatch.setattr(choice, "decide", lambda *a: pytest.fail("timed again"))
    assert choice.kernel_wins(q, k, v, bias, None, 0.17, attention._ATEN)
    assert choice.kernel_chosen(q, 1)  # the backward follows the forward's choice
    assert "the kernel (kernel" in native.status() and "float32 16x2x49x32" in native.status()


def test_where_the_kernel_is_slower_the_aten_formulation_runs_forward_and_backward(monkeypatch):
    q, k, v, bias = inputs()
    key = choice.key(q, 1)
    choice._chosen[key] = {"path": "aten", "kernel_ms": 3.0, "aten_ms": 1.0, "shape": list(q.shape)}
    called = []
    monkeypatch.setattr(native, "forward", lambda *a: called.append("forward"))
    monkeypatch.setattr(native, "backward", lambda *a: called.append("backward"))
    out = window_attention(q, k, v, bias)
    out.sum().backward()
    assert called == []  # the kernel never ran
    ref = window_attention_reference(*(t.detach() for t in (q, k, v, bias)))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert "the ATen formulation (kernel 3.00 ms, ATen 1.00 ms a call)" in native.status()


def test_a_kept_choice_another_user_could_have_written_is_not_read(monkeypatch):
    q, k, v, bias = inputs()
    key = choice.key(q, 1)
    path = choice._path()
    path.write_text(json.dumps({key: {"path": "aten", "kernel_ms": 1.0, "aten_ms": 9.0}}))
    os.chmod(path, 0o666)  # world-writable: anyone could have chosen for us
    timed = []
    monkeypatch.setattr(choice, "decide", lambda *a: timed.append(1) or {"path": "kernel", "kernel_ms": 1.0,
                                                                          "aten_ms": 2.0, "shape": []})
    assert choice.kernel_wins(q, k, v, bias, None, 0.17, slowed(0.0))
    assert timed == [1]


def test_a_forced_path_skips_the_timing(monkeypatch):
    q, k, v, bias = inputs()
    monkeypatch.setattr(choice, "decide", lambda *a: pytest.fail("timed"))
    monkeypatch.setenv("PERFSCOPE_NATIVE_CHOICE", "aten")
    assert not choice.kernel_wins(q, k, v, bias, None, 0.17, slowed(0.0)) and not choice.kernel_chosen(q, 1)
    monkeypatch.setenv("PERFSCOPE_NATIVE_CHOICE", "kernel")
    assert choice.kernel_wins(q, k, v, bias, None, 0.17, slowed(0.0))


@pytest.mark.slow
def test_an_avx2_build_chooses_per_shape_and_the_operator_then_runs_the_chosen_path(tmp_path):
    """The kernel built for AVX2 (``-march=haswell``, on any x86 machine): the first call of a
    Swin-T stage-1 shape times both paths and keeps one; every later call, forward and backward,
    runs that path (which path wins is this machine's timing, not checked: tests assert behaviour).
    The speed is bench/bench_window_attention.py's."""
    if os.uname().machine != "x86_64":
        pytest.skip("an x86 build")
    code = """
import torch
from perfscope.fused_ops import choice, native, window_attention
torch.manual_seed(0); torch.set_num_threads(1)
q, k, v = (torch.randn(128, 3, 49, 32, requires_grad=True) for _ in range(3))
bias = torch.randn(3, 49, 49, requires_grad=True)
window_attention(q, k, v, bias).sum().backward()
(entry,) = choice.choices().values()
calls = []
forward, backward = native.forward, native.backward
native.forward = lambda *a: calls.append("forward") or forward(*a)
native.backward = lambda *a: calls.append("backward") or backward(*a)
for _ in range(2):
    window_attention(q, k, v, bias).sum().backward()
print(native.status().split(";")[0], entry["path"], ",".join(calls) or "-")
"""
    env = {**os.environ, "PERFSCOPE_NATIVE_MARCH": "haswell", "PERFSCOPE_CACHE_DIR": str(tmp_path / "c"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PERFSCOPE_NATIVE_CHOICE", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    status, path, calls = done.stdout.split()[-3:]
    assert status == "built" and path in ("kernel", "aten")
    assert calls == ("forward,backward,forward,backward" if path == "kernel" else "-"), done.stdout
    assert json.loads((tmp_path / "c" / "native" / choice.FILE).read_text())  # kept for the next process
