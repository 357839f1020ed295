"""perfscope: find what limits each PyTorch training step, and fix it.

``perfscope.analyze(path)`` analyzes Kineto traces (no torch needed); ``perfscope.step()`` marks a
step boundary in loops without a torch optimizer; ``perfscope.accelerate(model, optimizer, loader,
config=...)`` applies an acceleration configuration (``docs/runtime.md``), with ``perfscope.autocast()``
and ``perfscope.backward(loss)`` in the loop. Heavy modules load on first use, so
``import perfscope`` stays cheap and never imports torch.
"""

from __future__ import annotations

from perfscope.version import __version__

__all__ = [
    "Analysis", "PerfscopeError", "__version__", "accelerate", "accelerator", "analyze", "autocast", "backward", "step",
]

from perfscope import _layout
from perfscope.errors import PerfscopeError

_layout.install(__path__[0])  # perfscope.tuner, .reports, .fused_ops from a source tree


def analyze(path, run_info=None):
    """Analyze a trace file or a directory of per-rank traces; see :func:`perfscope.analysis.run.analyze`."""
    from perfscope.analysis.run import analyze as _analyze

    return _analyze(path, run_info=run_info)


def step() -> None:
    """Mark the end of a training step (for loops without a torch optimizer).

    A no-op unless the script runs under ``perfscope profile``; see ``docs/collection.md``.
    """
    from perfscope.control import step as _step

    _step()


def accelerate(model, optimizer=None, loader=None, *, config=None):
    """Apply an acceleration configuration; see :func:`perfscope.runtime.accelerator.accelerate`.

    Returns:
        ``(model, optimizer, loader)`` to train with instead of the given ones.
    """
    from perfscope.runtime.accelerator import accelerate as _accelerate

    return _accelerate(model, optimizer, loader, config=config)


def accelerator():
    """The :class:`~perfscope.runtime.accelerator_state.Accelerator` of the latest ``accelerate`` call
    that applied a configuration (``.applied``, ``.skipped``), or None."""
    from perfscope.runtime.accelerator import active_accelerator

    return active_accelerator()


def autocast():
    """Context for the forward pass: ``torch.autocast`` at amp_level O1, else a no-op."""
    from perfscope.runtime.accelerator import autocast as _autocast

    return _autocast()


def backward(loss, **kwargs) -> None:
    """``loss.backward()`` with accumulation (loss / k, DDP no_sync) and fp16 loss scaling applied."""
    from perfscope.runtime.accelerator import backward as _backward

    _backward(loss, **kwargs)


def __getattr__(name):
    if name == "Analysis":
        from perfscope.analysis.run import Analysis

        return Analysis
    raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
