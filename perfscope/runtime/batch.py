"""A larger batch for the script's DataLoader, and the learning rate that goes with it.

A batch ``k`` times larger takes ``k`` times fewer optimizer steps per epoch: fewer launches,
optimizer steps and all-reduces per sample (the ``launch`` and ``comm`` shares), as long as memory
holds the larger activations. The gradient of a mean loss over ``k`` times more samples has about
the same size and ``k`` times less noise, so the same learning rate would train ``k`` times slower
per sample. The rules (``lr_scaling``):

* ``linear`` (Goyal et al., "Accurate, Large Minibatch SGD", 2017): the learning rate times ``k``,
  reached through a linear warm-up from ``1x`` over the first :data:`WARMUP_STEPS` optimizer steps
  (their gradual warm-up, which keeps the first steps of a large rate from diverging; they warm up
  over 5 epochs for ``k`` = 32, perfscope's ``k`` is at most 4 and its warm-up a fixed number of
  steps, because the runtime does not know the epoch's length);
* ``sqrt`` (the square-root rule of Krizhevsky, 2014, which adaptive optimizers such as Adam
  follow better): times ``sqrt(k)``, no warm-up;
* ``none``: the script's rate (for a script that scales it itself). LAMB and LARS (``optimizer``:
  ``lamb``/``lars``) are the other answer to large batches.

The factor is applied around every ``step()`` (an optimizer step pre-hook multiplies each group's
``lr``, the post-hook puts the script's value back), so the script's scheduler keeps driving the
rate and the factor rides on top of it; ``k`` is the new batch size over the script's, from the
first DataLoader the change applies to.

Imports torch's optimizer hooks only when attached (the runtime's side).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

WARMUP_STEPS = 100


def lr_factor(rule: str, k: float, step: int) -> float:
    """The learning rate's factor at optimizer step ``step`` (0-based) for a batch ``k`` times
    the script's (module docstring)."""
    if rule == "none" or k == 1:
        return 1.0
    if rule == "sqrt":
        return math.sqrt(k)
    return 1.0 + (k - 1.0) * min(1.0, (step + 1) / WARMUP_STEPS)


def rule_text(rule: str, k: float) -> str:
    """The rule in words, for what was applied."""
    if rule == "none":
        return "learning rate left as the script sets it (lr_scaling: none)"
    if rule == "sqrt":
        return f"learning rate x{math.sqrt(k):.3g} (square-root rule)"
    return f"learning rate x{k:g} (linear rule, warmed up over the first {WARMUP_STEPS} steps)"


class ScaledLr:
    """The factor of :func:`lr_factor` on every step of the optimizers it is attached to.

    ``pre`` multiplies each param group's ``lr`` (tensor rates are left alone) and keeps the
    script's values; ``post`` restores them exactly, so a scheduler reading or setting ``lr``
    between steps sees its own numbers. ``steps`` counts the steps taken per optimizer.
    """

    def __init__(self, rule: str, k: float) -> None:
        self.rule, self.k = rule, k
        self.steps: dict[int, int] = {}
        self._saved: dict[int, list] = {}

    def pre(self, optimizer, args, kwargs) -> None:
        step = self.steps.get(id(optimizer), 0)
        factor = lr_factor(self.rule, self.k, step)
        self._saved[id(optimizer)] = [g.get("lr") for g in optimizer.param_groups]
        if factor != 1.0:
            for group in optimizer.param_groups:
                if isinstance(group.get("lr"), float | int) and not isinstance(group.get("lr"), bool):
                    group["lr"] = group["lr"] * factor

    def post(self, optimizer, args, kwargs) -> None:
        saved = self._saved.pop(id(optimizer), None)
        if saved is not None:
            for group, lr in zip(optimizer.param_groups, saved):
                group["lr"] = lr
        self.steps[id(optimizer)] = self.steps.get(id(optimizer), 0) + 1

    def attach(self, optimizer) -> None:
        """On one optimizer (``perfscope.accelerate``), for its life."""
        optimizer.register_step_pre_hook(self.pre)
        optimizer.register_step_post_hook(self.post)

    @contextlib.contextmanager
    def everywhere(self) -> Iterator[None]:
        """On every optimizer's steps, for the block (launch-time patching)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles = [register_optimizer_step_pre_hook(self.pre), register_optimizer_step_post_hook(self.post)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def why_not(batch_size: int | None, sampler_given: bool) -> str | None:
    """Why a DataLoader's batch size cannot be changed (None: it can)."""
    if sampler_given or batch_size is None:
        return "the DataLoader has no batch_size to change (its own batch_sampler, or batch_size=None)"
    return None


def factor_of(old: int, new: int) -> float:
    """``k``: the new batch size over the script's."""
    return new / old

