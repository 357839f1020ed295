"""The state of one ``perfscope.accelerate`` call (:class:`Accelerator`): what was applied and skipped,
and what AMP and accumulation need at every step. Below the knob groups, which fill it in
(:mod:`perfscope.runtime.groups`), and the optimizer that steps with it."""

from __future__ import annotations

import contextlib

import torch

from perfscope import control
from perfscope.runtime import precision
from perfscope.runtime.config import AccelConfig


class Accelerator:
    """What ``accelerate`` applied, and the per-step state AMP and accumulation need.

    Attributes:
        config: The applied configuration.
        device: The model's device (of its first parameter; CPU without parameters).
        applied: Knob -> what was done.
        skipped: Knob -> why it was not applied (e.g. ``"tf32": "no CUDA device"``).
        model, optimizer, loader: The objects returned to the caller.
        scaler: The ``torch.amp.GradScaler`` for fp16, else None.
        masters: The O2 :class:`~perfscope.runtime.precision.MasterWeights`, else None.
        accum_steps: Micro-batches per optimizer step.
        micro_step: 0-based index, in the current accumulation window, of the micro-step in
            progress (advanced by the returned optimizer's ``step()``).
        steps_skipped: Optimizer steps the fp16 GradScaler skipped (inf/nan gradients).
    """

    def __init__(self, config: AccelConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.applied: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.model = self.optimizer = self.loader = None
        self.scaler: torch.amp.GradScaler | None = None
        self.masters: precision.MasterWeights | None = None
        self.amp_dtype = precision.DTYPES[config.amp_dtype]
        self.accum_steps = 1
        self.micro_step = 0
        self.steps_skipped = 0

    def autocast(self):
        """The context to run the forward (and loss) in: ``torch.autocast`` at O1, else a no-op."""
        return precision.autocast_context(self.config.amp_level, self.device.type, self.amp_dtype)

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward()`` with the configured accumulation, loss scaling and DDP no_sync.

        The loss is divided by ``accum_steps`` (so the gradient of a window equals that of one
        mean-reduced loss over the k-times batch), scaled by the fp16 GradScaler, and, on all but
        the last micro-step of a window, back-propagated without DDP gradient synchronisation.

        Args:
            loss: A scalar loss.
            **kwargs: Passed on to ``Tensor.backward`` (e.g. ``retain_graph``).
        """
        control.note_loss(loss)  # the script's own loss: before the division and the scaling
        if self.accum_steps > 1:
            loss = loss / self.accum_steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        with self._sync_context():
            loss.backward(**kwargs)

    def _sync_context(self):
        from torch.nn.parallel import DistributedDataParallel

        if self.accum_steps == 1 or not isinstance(self.model, DistributedDataParallel):
            return null_context()
        from perfscope.runtime.parallel import sync_context

        return sync_context(self.model, self.micro_step, self.accum_steps)

    def summary(self) -> str:
        """One line per applied and skipped knob."""
        lines = [f"applied {k}: {v}" for k, v in self.applied.items()]
        return "\n".join(lines + [f"skipped {k}: {v}" for k, v in self.skipped.items()])


def null_context() -> contextlib.AbstractContextManager:
    """A context that does nothing (``contextlib.nullcontext()``)."""
    return contextlib.nullcontext()
