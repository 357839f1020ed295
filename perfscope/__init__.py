"""perfscope: find what limits each PyTorch training step, and fix it.

``perfscope.analyze(path)`` analyzes Kineto traces (no torch needed); ``perfscope.step()`` marks a
step boundary in loops without a torch optimizer. Heavy modules load on first use, so
``import perfscope`` stays cheap and never imports torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Analysis", "PerfscopeError", "__version__", "analyze", "step"]

from perfscope.errors import PerfscopeError


def analyze(path, run_info=None):
    """Analyze a trace file or a directory of per-rank traces; see :func:`perfscope.analysis.run.analyze`."""
    from perfscope.analysis.run import analyze as _analyze

    return _analyze(path, run_info=run_info)


def step() -> None:
    """Mark the end of a training step (for loops without a torch optimizer).

    A no-op unless the script runs under ``perfscope profile``; see ``docs/collection.md``.
    """
    from perfscope.collect import step as _step

    _step()


def __getattr__(name):
    if name == "Analysis":
        from perfscope.analysis.run import Analysis

        return Analysis
    raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
