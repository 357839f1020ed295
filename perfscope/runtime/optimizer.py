"""The optimizer ``perfscope.accelerate`` returns: one real step per accumulation window, with AMP
gradient scaling and O2 master weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from perfscope.runtime.accelerator_state import Accelerator


class AcceleratedOptimizer(torch.optim.Optimizer):
    """The user's optimizer, stepping once per accumulation window, with AMP scaling and O2 masters.

    A ``torch.optim.Optimizer`` (so LR schedulers accept it) that delegates ``param_groups``,
    ``state``, ``defaults`` and ``state_dict`` to the wrapped optimizer. ``step()`` counts
    micro-steps and only on the last of each window copies O2 gradients into the fp32 masters,
    steps (through the GradScaler for fp16: unscale, skip on inf/nan, update the scale) and
    copies the masters back. ``zero_grad()`` does nothing in the middle of a window.

    Args:
        optimizer: The wrapped optimizer (``.optimizer``).
        accelerator: Its :class:`Accelerator`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, accelerator: Accelerator) -> None:
        # Deliberately no super().__init__: all optimizer state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.accelerator = accelerator

    param_groups = property(lambda self: self.optimizer.param_groups,
                            lambda self, v: setattr(self.optimizer, "param_groups", v))
    state = property(lambda self: self.optimizer.state, lambda self, v: setattr(self.optimizer, "state", v))
    defaults = property(lambda self: self.optimizer.defaults,
                        lambda self, v: setattr(self.optimizer, "defaults", v))

    def step(self, closure=None):
        """Count a micro-step; on the last of a window, really step.

        Returns:
            The wrapped step's result, or None on accumulation micro-steps.

        Raises:
            ValueError: a closure is given (re-evaluation cannot honour accumulation or scaling).
        """
        if closure is not None:
            raise ValueError("an accelerated optimizer takes no closure (accumulation and loss scaling need one "
                             "backward per step); compute the loss before optimizer.step()")
        acc = self.accelerator
        acc.micro_step += 1
        if acc.micro_step < acc.accum_steps:
            return None
        acc.micro_step = 0
        if acc.masters is not None:
            acc.masters.grads_to_masters()
        if acc.scaler is None:
            result = self.optimizer.step()
        else:
            scale = acc.scaler.get_scale()
            result = acc.scaler.step(self.optimizer)  # unscales; skips the step on inf/nan
            acc.scaler.update()
            acc.steps_skipped += acc.scaler.get_scale() < scale  # the scale backs off only on a skip
        if acc.masters is not None:
            acc.masters.masters_to_model()
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, except in the middle of an accumulation window."""
        if self.accelerator.micro_step != 0:
            return
        self.optimizer.zero_grad(set_to_none=set_to_none)
        if self.accelerator.masters is not None:
            self.accelerator.masters.zero_model_grads(set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def __getattr__(self, name: str):
        if name in ("optimizer", "accelerator"):  # not set yet: avoid recursing
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
