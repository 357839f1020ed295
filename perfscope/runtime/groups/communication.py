"""The communication group: DDP gradient buckets, comm hooks (compression, hierarchical
all-reduce) and the static-graph hint.

These knobs cut the gradient all-reduce's exposed time (the ``comm`` share of a step).
"""

from __future__ import annotations

import inspect
import sys
import warnings

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical

DDP_DEFAULT_BUCKET_MB = 25.0  # torch.nn.parallel.DistributedDataParallel's default bucket_cap_mb
BUCKET_CHOICES_MB = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)
GUESS_BUCKET_MB = 100.0  # fewer, larger all-reduce calls (PyTorch's DDP notes)
COMM = ("comm",)


class CommunicationGroup(KnobGroup):
    """``bucket_cap_mb``, ``hierarchical_allreduce``, ``grad_compression``, ``static_graph``."""

    name = "communication"
    keys = ("bucket_cap_mb", "hierarchical_allreduce", "grad_compression", "static_graph")
    title = "DDP bucket size, hierarchical all-reduce, gradient compression, static graph"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        cfg = acc.config
        changed = self.changed(cfg)
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            for key in changed:
                acc.skipped[key] = "no torch.distributed process group initialised"
            return
        if isinstance(acc.model, DistributedDataParallel):
            for key in changed:
                acc.skipped[key] = "the model is already DistributedDataParallel (pass the unwrapped module)"
            return
        from perfscope.runtime.parallel import wrap_ddp

        bucket = cfg.bucket_cap_mb or DDP_DEFAULT_BUCKET_MB
        acc.model = wrap_ddp(acc.model, bucket_cap_mb=bucket, static_graph=cfg.static_graph,
                             grad_compression=cfg.grad_compression, hierarchical_allreduce=cfg.hierarchical_allreduce,
                             device_ids=[acc.device.index] if acc.device.type == "cuda" else None)
        acc.applied["ddp"] = (f"DistributedDataParallel(bucket_cap_mb={bucket}, static_graph={cfg.static_graph}, "
                              f"gradient_as_bucket_view=True, grad_compression={cfg.grad_compression}, "
                              f"hierarchical_allreduce={cfg.hierarchical_allreduce})")
        for key in changed:  # each changed key names where it went
            acc.applied.setdefault(key, "set on the DistributedDataParallel wrapper (see 'ddp')")

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        if config.bucket_cap_mb is not None:
            report.applied["bucket_cap_mb"] = f"DistributedDataParallel(bucket_cap_mb={config.bucket_cap_mb!r})"
        if config.static_graph:
            report.applied["static_graph"] = "DistributedDataParallel(static_graph=True)"
        if _ddp_knobs_set(config):
            report.applied["gradient_as_bucket_view"] = "DistributedDataParallel(gradient_as_bucket_view=True)"
        if config.hierarchical_allreduce:
            report.applied["hierarchical_allreduce"] = "DDP comm hook perfscope.runtime.hierarchical.hierarchical_allreduce_hook"
            if config.grad_compression != "none":
                report.applied["grad_compression"] = (f"{config.grad_compression} compression inside the "
                                                      "hierarchical all-reduce hook (compress_dtype)")
        elif config.grad_compression != "none":
            report.applied["grad_compression"] = f"DDP comm hook default_hooks.{config.grad_compression}_compress_hook"

    def launch_patches(self, config, report) -> list:
        return [_patch_ddp(config, report)] if _ddp_knobs_set(config) else []

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        ddp = facts.ddp
        if ddp is None:
            return {}
        return {"bucket_cap_mb": float(ddp.bucket_cap_mb or DDP_DEFAULT_BUCKET_MB), "static_graph": ddp.static_graph,
                "hierarchical_allreduce": False, "grad_compression": "none"}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        world, local_world = facts.ranks, facts.ranks_per_node
        if facts.ddp is None or world < 2:
            why = "no DistributedDataParallel model" if facts.ddp is None else "a single rank: there is nothing to all-reduce"
            part.exclude(self.keys, why)
            return part
        seen = self.observed(facts)
        base_bucket = seen["bucket_cap_mb"]
        nodes = world // local_world
        if nodes < 2:  # within a node every rank already reduces over the fastest link there is
            part.exclude("hierarchical_allreduce", f"one node ({world} ranks on it): a hierarchical all-reduce "
                                                   "only pays off across nodes")
        elif local_world < 2:
            part.exclude("hierarchical_allreduce", "one rank per node: there is nothing to reduce inside a node first")
        else:  # first: two values, and across nodes the inter-node bytes it saves dominate
            part.knobs.append(Knob("hierarchical_allreduce", COMM, categorical([False, True]), False))
        part.knobs.append(Knob("bucket_cap_mb", COMM, categorical(sorted({*BUCKET_CHOICES_MB, base_bucket})), base_bucket))
        part.knobs.append(Knob("grad_compression", COMM, categorical(["none", "fp16", "bf16"]), "none"))
        if seen["static_graph"]:  # a configuration cannot take away what the script asked DDP for
            part.exclude("static_graph", "the script already builds DDP with static_graph=True")
        else:
            part.knobs.append(Knob("static_graph", COMM, categorical([False, True]), False))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """comm: larger buckets (fewer all-reduce calls); across nodes with several ranks each, the
        hierarchical all-reduce (lossless: only 1/L of each rank's bytes cross nodes,
        ``docs/multinode.md``); for a comm-bound verdict on GPUs also bf16 gradient compression
        (PyTorch's DDP communication hooks), which is lossy, so not for a side bottleneck."""
        if "comm" not in bottlenecks:
            return
        put("bucket_cap_mb", GUESS_BUCKET_MB)
        if facts.ranks_per_node > 1 and facts.ranks // facts.ranks_per_node > 1:
            put("hierarchical_allreduce", True)
        if facts.cuda and verdict == "comm-bound":
            put("grad_compression", "bf16")


def _ddp_knobs_set(config) -> bool:
    return (config.bucket_cap_mb is not None or config.static_graph or config.hierarchical_allreduce
            or config.grad_compression != "none")


# --- the DistributedDataParallel patch -----------------------------------------------------------


def _patch_ddp(config, report):
    from torch.nn.parallel import DistributedDataParallel

    from perfscope.runtime.constructors import patch_init

    def adjust(arguments: dict, signature: inspect.Signature):
        if _accelerated(arguments.get("module")):
            return None  # perfscope.accelerate configured it already
        changed: dict = {"gradient_as_bucket_view": True}
        if config.bucket_cap_mb is not None:
            changed["bucket_cap_mb"] = config.bucket_cap_mb
        if config.static_graph:
            changed["static_graph"] = True
        arguments.update(changed)

        def finish(ddp) -> dict:
            try:
                hook = _register_hook(ddp, config, arguments.get("process_group"))
            except Exception as exc:  # noqa: BLE001 - a hook the backend refuses: train on without it
                knob = "hierarchical_allreduce" if config.hierarchical_allreduce else "grad_compression"
                first = str(exc).splitlines()[0] if str(exc) else ""
                reason = f"comm hook not registered: {type(exc).__name__}: {first}"
                report.not_applied[knob] = reason
                report.applied.pop(knob, None)
                warnings.warn(f"perfscope: config {knob}: {reason}", stacklevel=3)
                hook = None
            if hook:
                changed["comm_hook"] = hook
            report.ddp_modules += 1
            return changed

        return finish

    return patch_init(DistributedDataParallel, adjust)


def _accelerated(obj) -> bool:
    """True for an object ``perfscope.accelerate`` built or returned (marker, or its registry)."""
    from perfscope.runtime.constructors import ACCELERATED_ATTR

    if getattr(obj, ACCELERATED_ATTR, False):
        return True
    accelerator = sys.modules.get("perfscope.runtime.accelerator")
    check = getattr(accelerator, "_is_accelerated", None)
    try:
        return bool(check(obj)) if check is not None else False
    except Exception:  # noqa: BLE001 - a registry we cannot query: treat as not accelerated
        return False


def _register_hook(ddp, config, process_group) -> str | None:
    # The same hooks perfscope.accelerate registers (imported only when a hook knob is set).
    from perfscope.runtime.parallel import comm_hook

    hook = comm_hook(config.grad_compression, config.hierarchical_allreduce)
    if hook is None:
        return None
    state, fn = hook
    ddp.register_comm_hook(state if state is not None else process_group, fn)
    return fn.__name__
