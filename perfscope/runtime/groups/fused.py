"""The fused-operators group: ``fused_ops`` (the fused window attention swapped into the model) and
``optimizer`` (a large-batch optimizer, LAMB or LARS, in place of the script's).

``fused_ops`` removes launches and passes over the attention scores: it serves the ``launch`` and
``compute`` shares. ``optimizer`` serves what accumulation serves (``comm``, ``launch``): a
layer-wise trust ratio keeps the larger effective batch of ``grad_accum_steps`` trainable, so it is
searched only together with accumulation. Both change the numerics a little, which the tuner's
numerics guard watches in every trial. ``docs/fused_ops.md`` documents the operators.

Learning rate. The large-batch optimizer takes the script's hyperparameters (learning rate, weight
decay, and Adam's betas and epsilon, or SGD's momentum) and scales the learning rate with the growth
of the effective batch ``k = grad_accum_steps`` (as each group's ``lr_scale``, a factor on ``lr`` that
schedules leave alone, so a warm-up or any scheduler keeps driving ``lr``): LAMB by ``sqrt(k)`` (You et al., ICLR 2020, the
square-root rule of its BERT schedule), LARS by ``k`` (the linear rule of Goyal et al., 2017, that
LARS was introduced to extend). LAMB replaces Adam-family optimizers and LARS replaces SGD, the
optimizers each is a layer-wise version of; another optimizer is left as it is.
"""

from __future__ import annotations

import math

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import NO_MODEL, KnobGroup, Knob, SearchPart, categorical, on_first_model, record

FUSED_SERVES = ("launch", "compute")
OPTIMIZER_SERVES = ("launch", "comm")
# The script's optimizer class each large-batch optimizer replaces (its non-layer-wise form).
FAMILIES = {"lamb": ("Adam", "AdamW"), "lars": ("SGD",)}
NEEDS_OPTIMIZER = "needs perfscope.accelerate(model, optimizer, ...) in the script, and accumulation searched"


def lr_scale(optimizer: str, accum_steps: int) -> float:
    """The learning rate's factor for ``optimizer`` when the effective batch grows ``accum_steps``
    times (module docstring): ``sqrt(k)`` for LAMB, ``k`` for LARS."""
    return math.sqrt(accum_steps) if optimizer == "lamb" else float(accum_steps)


def family_of(optimizer_class: str | None) -> str | None:
    """The large-batch optimizer that replaces a script optimizer class (None: neither does)."""
    for name, classes in FAMILIES.items():
        if optimizer_class in classes:
            return name
    return None


def cannot_replace(old, name: str) -> str | None:
    """Why ``old`` cannot become ``name`` (None: it can): settings the large-batch optimizer has
    no counterpart for would be dropped without a word."""
    import torch

    for g in old.param_groups:
        if name == "lamb" and g.get("amsgrad"):
            return "the script's Adam uses amsgrad, which LAMB has no counterpart for"
        if name == "lars" and (g.get("nesterov") or g.get("dampening")):
            return "the script's SGD uses Nesterov momentum or dampening, which LARS has no counterpart for"
        if isinstance(g.get("lr"), torch.Tensor):
            return "the script's learning rate is a tensor"
    return None


def _replace_optimizer(old, name: str, accum_steps: int):
    """A :class:`perfscope.fused_ops.Lamb` / :class:`perfscope.fused_ops.Lars` over ``old``'s parameter groups. The
    group dicts are shared, so a learning-rate scheduler built on ``old`` still drives it; the
    batch rule's factor goes into each group's ``lr_scale``, which schedules leave alone."""
    from perfscope.fused_ops import Lamb, Lars

    scale = lr_scale(name, accum_steps)
    groups = old.param_groups
    first = groups[0]
    params = [{"params": g["params"]} for g in groups]
    if name == "lamb":  # lr=1: a placeholder; each group keeps the script's own
        new = Lamb(params, lr=1.0, betas=tuple(first.get("betas", (0.9, 0.999))), eps=first.get("eps", 1e-6),
                             weight_decay=first.get("weight_decay", 0.0))
    else:
        new = Lars(params, lr=1.0, momentum=first.get("momentum", 0.9) or 0.0,
                             weight_decay=first.get("weight_decay", 0.0))
    for fresh, shared in zip(new.param_groups, groups):
        for key, value in fresh.items():
            shared.setdefault(key, value)  # the script's lr, weight decay, betas ... win
        shared["lr_scale"] = scale
    new.param_groups = groups
    return new, scale


def swap_into(model) -> tuple[str | None, str | None]:
    """``fused_ops.swap(model)``, described: (what was swapped, None), or (None, why nothing was:
    the reasons :func:`perfscope.fused_ops.find` gives, else that no known module is in the model). The one
    description ``accelerate`` and launch-time patching both report."""
    from perfscope.fused_ops import find, swap

    swapped = swap(model)
    if swapped:
        return f"fused window attention in {_names(swapped)}", None
    reasons = {c.reason for c in find(model) if c.reason}
    return None, "; ".join(sorted(reasons)) if reasons else "no window attention module fused_ops knows is in the model"


class FusedOpsGroup(KnobGroup):
    """``fused_ops``, ``optimizer``."""

    name = "fused"
    keys = ("fused_ops", "optimizer")
    title = "fused operators, large-batch optimizer"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        cfg = acc.config
        if cfg.fused_ops:
            record(acc, "fused_ops", *swap_into(acc.model))
        if cfg.optimizer is None:
            return
        current = type(acc.optimizer).__name__ if acc.optimizer is not None else None
        if acc.optimizer is None:
            acc.skipped["optimizer"] = "no optimizer given to accelerate()"
        elif family_of(current) != cfg.optimizer:
            wanted = " or ".join(FAMILIES[cfg.optimizer])
            acc.skipped["optimizer"] = (f"{cfg.optimizer} replaces {wanted} (it keeps their hyperparameters); "
                                        f"the script's optimizer is {current}")
        elif acc.optimizer.state:
            acc.skipped["optimizer"] = f"the {current} optimizer already holds state: replacing it would drop it"
        elif (why := cannot_replace(acc.optimizer, cfg.optimizer)) is not None:
            acc.skipped["optimizer"] = why
        else:
            acc.optimizer, scale = _replace_optimizer(acc.optimizer, cfg.optimizer, cfg.grad_accum_steps)
            acc.applied["optimizer"] = (f"{type(acc.optimizer).__name__} in place of {current}, learning rate "
                                        f"x{scale:g} (lr_scale) for {cfg.grad_accum_steps} micro-batch(es) per step")

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        from perfscope.runtime.patch_report import NEEDS_ACCELERATE

        if config.fused_ops:
            report.applied["fused_ops"] = "fused window attention swapped into the first model the script calls"
        if config.optimizer is not None:  # the script owns its optimizer object
            report.needs_accelerate["optimizer"] = NEEDS_ACCELERATE

    def launch_patches(self, config, report) -> list:
        return [on_first_model("fused_ops", swap_into, report)] if config.fused_ops else []

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        return {"fused_ops": False, "optimizer": None}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        model = facts.model
        if model is None:
            part.exclude("fused_ops", NO_MODEL)
        elif model.fusable:
            part.knobs.append(Knob("fused_ops", FUSED_SERVES, categorical([False, True]), False))
        else:
            reasons = sorted(set(model.not_fusable.values()))
            part.exclude("fused_ops", "; ".join(reasons) if reasons else
                         f"no window attention module fused_ops knows in the model ({model.class_})")
        acc = facts.accelerate
        family = family_of(acc.optimizer_class)
        if not (acc.called and acc.optimizer):
            part.exclude("optimizer", NEEDS_OPTIMIZER)
        elif family is None:
            part.exclude("optimizer", f"the script's optimizer ({acc.optimizer_class}) is neither Adam, "
                         "AdamW nor SGD, which LAMB and LARS replace")
        else:
            from perfscope.runtime.groups.accumulation import ACCUM_CHOICES

            part.knobs.append(Knob("optimizer", OPTIMIZER_SERVES, categorical([None, family]), None,
                                   when=("grad_accum_steps", tuple(c for c in ACCUM_CHOICES if c > 1))))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """launch or compute, and a fusable model: the fused operator (the same math in fewer
        passes; the numerics guard checks the loss). The optimizer is left to the search: a
        different optimizer is a bigger change than any speed rule should make unasked."""
        if {"launch", "compute"} & bottlenecks:
            put("fused_ops", True)


def _names(names: list[str], shown: int = 3) -> str:
    label = [n or "(the model)" for n in names[:shown]]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} module(s): {', '.join(label)}{more}"
