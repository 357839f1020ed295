"""The input group: DataLoader workers and pinning, side-stream prefetch, host threads.

These knobs remove the DataLoader wait (the ``io`` share of a step). ``intra_op_threads`` is here
because the training process's threads and the loader's worker processes share the same cores
(:mod:`perfscope.runtime.threads`): they are searched together.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical, int_range

LOADER_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
# Searched worker counts: workers mostly wait on I/O or decoding, so more than the cores can pay
# off (at least 4, twice the node's cores per rank, at most 16).
MIN_HIGH_WORKERS, MAX_HIGH_WORKERS = 4, 16
PREFETCH_CHOICES = (2, 4, 8)
TORCH_DEFAULT_PREFETCH = 2  # DataLoader's prefetch_factor with workers
IO = ("io",)


class InputGroup(KnobGroup):
    """``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``,
    ``intra_op_threads``, ``device_prefetch``."""

    name = "input"
    keys = (*LOADER_KEYS, "intra_op_threads", "device_prefetch")
    title = "DataLoader workers and pinning, side-stream prefetch, host threads"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        from perfscope.runtime import threads

        cfg = acc.config
        acc.applied.update(threads.set_intra_op_threads(cfg.intra_op_threads))
        if acc.loader is None:
            for key in self.changed(cfg):
                if key != "intra_op_threads":
                    acc.skipped[key] = "no loader given to accelerate()"
            return
        loader = _rebuilt(acc, _loader_knobs(acc, cfg))
        if cfg.device_prefetch:
            loader = _prefetched(acc, loader)
        acc.loader = loader

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        from perfscope.runtime.patch_report import NEEDS_ACCELERATE

        for key in LOADER_KEYS:
            value = getattr(config, key)
            if value is not None:
                report.applied[key] = f"DataLoader({key}={value!r}) for loaders the script builds"
        if config.intra_op_threads is not None:
            report.applied["intra_op_threads"] = f"torch.set_num_threads({config.intra_op_threads})"
        if config.device_prefetch:  # the loop must take its batches from the returned loader
            report.needs_accelerate["device_prefetch"] = NEEDS_ACCELERATE

    def launch_patches(self, config, report) -> list:
        patches = []
        if any(getattr(config, k) is not None for k in LOADER_KEYS):
            patches.append(_patch_dataloader(config, report))
        if config.intra_op_threads is not None:
            from perfscope.runtime.threads import intra_op_threads  # imports torch

            patches.append(intra_op_threads(config.intra_op_threads))
        return patches

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        loader = facts.dataloader
        seen: dict = {"intra_op_threads": (facts.threads.intra_op_threads if facts.threads else None) or None,
                      "device_prefetch": False}
        if loader is not None:
            seen.update(num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                        persistent_workers=loader.persistent_workers,
                        prefetch_factor=int(loader.prefetch_factor or TORCH_DEFAULT_PREFETCH))
        return seen

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        seen = self.observed(facts)
        loader, cuda, acc, local_world = facts.dataloader, facts.cuda, facts.accelerate, facts.ranks_per_node
        if loader is None:
            part.exclude(("num_workers", "pin_memory", "prefetch_factor", "device_prefetch"),
                         "the script builds no torch DataLoader (none was iterated)")
        elif loader.iterable:
            part.exclude(("num_workers", "prefetch_factor"),
                         "the DataLoader reads an IterableDataset: more workers would duplicate its samples")
        else:
            base_workers = seen["num_workers"]
            # Per rank: the node's cores are shared by its ranks.
            high = max(base_workers, min(MAX_HIGH_WORKERS, max(MIN_HIGH_WORKERS, 2 * cpu // local_world)))
            part.knobs.append(Knob("num_workers", IO, int_range(0, high), base_workers))
            base_pf = seen["prefetch_factor"]
            part.knobs.append(Knob("prefetch_factor", IO, categorical(sorted({*PREFETCH_CHOICES, base_pf})), base_pf,
                                   when=("num_workers", tuple(range(1, high + 1)))))
        if loader is not None:
            if cuda:
                part.knobs.append(Knob("pin_memory", IO, categorical([False, True]), seen["pin_memory"]))
                if acc.called and acc.loader:
                    part.knobs.append(Knob("device_prefetch", IO, categorical([False, True]), False))
                else:
                    part.exclude("device_prefetch", "needs the loader passed to perfscope.accelerate in the script")
            else:
                part.exclude("pin_memory", "no GPU: there are no host-to-device copies to speed up")
                part.exclude("device_prefetch", "no GPU: there are no host-to-device copies to overlap")
        part.exclude("persistent_workers", "only matters across epochs; a trial measures steps within one")
        base_threads = int(seen["intra_op_threads"] or 0)
        if not base_threads:
            part.exclude("intra_op_threads", "the baseline run did not report its intra-op threads")
        else:
            per_rank = max(1, cpu // local_world)
            choices = sorted({1, max(1, per_rank // 2), per_rank, base_threads})
            if len(choices) < 2:
                part.exclude("intra_op_threads", f"one core per rank: the script already runs {base_threads} thread")
            else:
                # On a CPU the intra-op threads run the math too: a compute-bound run is searched for
                # them (on a busy box, or beside workers, fewer threads can be faster).
                part.knobs.append(Knob("intra_op_threads", IO if cuda else IO + ("compute",), categorical(choices),
                                       base_threads))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """io: enough workers to hide the measured loading share (as many as the cores where the
        script's own already take them all), the cores they leave as
        intra-op threads, pinned memory and deeper prefetch (PyTorch's performance tuning guide)."""
        if "io" not in bottlenecks:
            return
        local_world = facts.ranks_per_node
        # A step loads for `io` of its time and computes for the rest, so about io / (1 - io)
        # workers keep up (within the space's range).
        io = float((fractions or {}).get("io") or 0.0)
        wanted = math.ceil(io / max(1e-3, 1.0 - io)) if io > 0 else cpu // local_world
        per_rank = max(1, cpu // local_world)
        if facts.dataloader is not None and facts.dataloader.num_workers >= per_rank:
            # Workers already take every core: more would only queue for them. Start at the core
            # count (the space reaches down to 0 and up past the script's own count).
            put("num_workers", per_rank)
        else:
            put("num_workers", max(2, wanted))
        workers = params.get("num_workers") or 0
        # At least one for the training process, and never more than the workers leave.
        put("intra_op_threads", max(1, cpu // local_world - workers), at_most=True)
        put("prefetch_factor", 4)
        put("pin_memory", True)
        put("device_prefetch", True)


# --- the DataLoader patch -----------------------------------------------------------------------


def _patch_dataloader(config, report):
    from torch.utils.data import DataLoader

    from perfscope.runtime.data import ITERABLE_SKIP_REASON, iterable_without_sharding
    from perfscope.runtime.constructors import patch_init

    def adjust(arguments: dict, signature: inspect.Signature):
        new = _loader_arguments(config, arguments)
        if new.get("num_workers") and iterable_without_sharding(_LoaderView(arguments), new["num_workers"]):
            # Keep the script's (main-process) loading; the worker-only knobs go with it.
            new = _loader_arguments(dataclasses.replace(config, num_workers=None, prefetch_factor=None,
                                                        persistent_workers=None), arguments)
            report.not_applied["num_workers"] = ITERABLE_SKIP_REASON
        changed = {k: v for k, v in new.items() if arguments.get(k, _default(signature, k)) != v}
        arguments.update(new)

        def finish(loader) -> dict:
            report.loaders += 1
            return changed

        return finish

    return patch_init(DataLoader, adjust)


class _LoaderView:
    """The attributes :func:`iterable_without_sharding` reads, from DataLoader arguments."""

    def __init__(self, arguments: dict) -> None:
        self.dataset = arguments.get("dataset")
        self.num_workers = arguments.get("num_workers") or 0


def _default(signature: inspect.Signature, name: str):
    param = signature.parameters.get(name)
    return None if param is None else param.default


def _loader_arguments(config, arguments: dict) -> dict:
    """The loader arguments to override: the configured ones, made consistent with num_workers."""
    new: dict = {}
    if config.num_workers is not None:
        new["num_workers"] = config.num_workers
    if config.pin_memory is not None:
        new["pin_memory"] = config.pin_memory
    workers = new.get("num_workers", arguments.get("num_workers", 0)) or 0
    if workers > 0:
        if config.prefetch_factor is not None:
            new["prefetch_factor"] = config.prefetch_factor
        if config.persistent_workers is not None:
            new["persistent_workers"] = config.persistent_workers
    else:
        # DataLoader rejects these without worker processes (the config lowered num_workers to 0).
        if arguments.get("prefetch_factor") is not None:
            new["prefetch_factor"] = None
        if arguments.get("persistent_workers"):
            new["persistent_workers"] = False
    return new


def _loader_knobs(acc, cfg) -> dict:
    """The loader settings of the configuration that apply to the script's loader; the others
    named in ``acc.skipped`` with the reason (no CUDA to pin for, an iterable dataset that does
    not shard, no workers to prefetch with)."""
    import torch

    from perfscope.runtime.data import ITERABLE_SKIP_REASON, iterable_without_sharding

    knobs = {k: getattr(cfg, k) for k in LOADER_KEYS if getattr(cfg, k) is not None}
    if knobs.get("pin_memory") and not torch.cuda.is_available():
        acc.skipped["pin_memory"] = "no CUDA device (pinned memory only speeds host-to-GPU copies)"
        del knobs["pin_memory"]
    if knobs.get("num_workers") and iterable_without_sharding(acc.loader, knobs["num_workers"]):
        acc.skipped["num_workers"] = ITERABLE_SKIP_REASON
        del knobs["num_workers"]
    workers = knobs.get("num_workers", getattr(acc.loader, "num_workers", 0))
    for key in ("prefetch_factor", "persistent_workers"):
        if knobs.get(key) and workers == 0:
            acc.skipped[key] = "the loader has num_workers 0 (set num_workers > 0 in the config)"
            del knobs[key]
    return knobs


def _rebuilt(acc, knobs: dict):
    """The script's loader rebuilt with ``knobs`` (a plain DataLoader only; another loader class
    is left as it is, each knob named in ``acc.skipped``)."""
    from torch.utils.data import DataLoader

    from perfscope.runtime.data import rebuild_loader

    loader = acc.loader
    if not knobs:
        return loader
    if type(loader) is not DataLoader:
        for key in knobs:
            acc.skipped[key] = f"the loader is a {type(loader).__name__}, not a torch DataLoader"
        return loader
    loader = rebuild_loader(loader, **knobs)
    for key, value in knobs.items():
        acc.applied[key] = f"DataLoader rebuilt with {key}={value}"
    return loader


def _prefetched(acc, loader):
    """``loader`` wrapped to copy batches to the CUDA device on a side stream one step ahead
    (skipped, with the reason, off CUDA)."""
    from perfscope.runtime.data import DevicePrefetcher

    if acc.device.type != "cuda":
        acc.skipped["device_prefetch"] = f"the model is on {acc.device}, not a CUDA device"
        return loader
    acc.applied["device_prefetch"] = f"batches copied to {acc.device} on a side CUDA stream one step ahead"
    return DevicePrefetcher(loader, acc.device)
