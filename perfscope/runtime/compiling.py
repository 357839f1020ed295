"""``torch.compile`` for the script's model, and what compiling cost.

The model's ``forward`` is replaced, on the object itself, by ``torch.compile(model.forward,
mode=...)``: the script keeps calling the same module (its hooks, ``state_dict`` keys and
``.train()``/``.eval()`` are unchanged: ``torch.compile(model)`` would return a wrapper whose keys
gain an ``_orig_mod.`` prefix), and dynamo traces the forward at its first call; AOTAutograd
compiles the backward with it. ``nn.Module.compile()`` would be the in-place spelling, but in the
PyTorch this project pins it compiles ``Module._call_impl``, a frame dynamo skips, and the model
runs eagerly without a word -- so the forward is compiled instead.

Modes (``torch.compile``'s documentation): ``default`` fuses operators with inductor (fewer, larger
kernels; on the CPU, C++/OpenMP loops); ``reduce-overhead`` adds CUDA graphs, which replay a whole
step's launches at once (the remedy for launch-bound GPU steps; CUDA only); and
``max-autotune-no-cudagraphs`` also benchmarks GEMM and convolution kernel configurations (longer
compiles). A compiled model pays its compile time once, in its first steps: :func:`compile_seconds`
reads it from dynamo's own timers, and the tuner counts it against the gain for the run length the
user states (:mod:`perfscope.tuner.startup`).

Imports torch: the runtime's side only.
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
from torch import nn

COMPILED_ATTR = "_perfscope_compiled"  # the mode a model's forward was compiled with


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is compiled already: a ``torch.compile`` wrapper, a model whose
    ``nn.Module.compile()`` was called, or one whose forward perfscope compiled."""
    from torch._dynamo.eval_frame import OptimizedModule

    return (isinstance(model, OptimizedModule) or getattr(model, "_compiled_call_impl", None) is not None
            or getattr(model, COMPILED_ATTR, None) is not None)


def cpp_compiler() -> str | None:
    """The C++ compiler inductor's CPU code needs (``$CXX``, else ``g++``, ``c++``, ``clang++`` on
    the PATH), or None."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def unavailable(cuda: bool) -> str | None:
    """Why ``torch.compile``'s inductor cannot build kernels here (None: it can): on a GPU it
    needs Triton, on the CPU a C++ compiler."""
    if cuda:
        import importlib.util

        return None if importlib.util.find_spec("triton") is not None else "torch.compile needs Triton on a GPU (not installed)"
    return None if cpp_compiler() else "torch.compile needs a C++ compiler for CPU code (none of $CXX, g++, c++, clang++)"


def why_not(model: nn.Module, mode: str) -> str | None:
    """Why ``model`` cannot be compiled with ``mode`` (None: it can)."""
    cuda = next((p.is_cuda for p in model.parameters()), False)
    if is_compiled(model):
        return "the model is compiled already (the script's own torch.compile)"
    if mode == "reduce-overhead" and not cuda:
        return "reduce-overhead records CUDA graphs: the model is not on a GPU"
    return unavailable(cuda)


def compile_forward(model: nn.Module, mode: str) -> tuple[str | None, str | None]:
    """Compile ``model``'s forward in place with ``mode``: (what was done, None), or (None, why
    not: :func:`why_not`). The one description ``perfscope.accelerate`` and launch-time patching
    both report; the compile itself happens at the next forward."""
    why = why_not(model, mode)
    if why is not None:
        return None, why
    model.forward = torch.compile(model.forward, mode=None if mode == "default" else mode)
    setattr(model, COMPILED_ATTR, mode)
    return f"forward of {type(model).__name__} compiled with torch.compile (mode {mode}) at its first call", None


def compile_seconds() -> float | None:
    """Wall seconds torch.compile has spent compiling in this process so far (dynamo's
    ``total_wall_time``: tracing, inductor and the backward's compile), or None when nothing was
    compiled (dynamo not imported, or its timers absent in this PyTorch)."""
    utils = sys.modules.get("torch._dynamo.utils")
    spent = getattr(utils, "calculate_time_spent", None)
    if spent is None:
        return None
    try:
        seconds = spent().get("total_wall_time")
    except Exception:  # noqa: BLE001 - a private helper: its absence must not fail a run
        return None
    return float(seconds) if seconds else None
