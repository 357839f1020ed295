"""The sharding group: ``reshard_after_forward`` of the script's FSDP2 (``fully_shard``) calls.

FSDP2 frees each unit's gathered parameters after its forward and gathers them again in the
backward; ``reshard_after_forward=False`` keeps them, which removes the backward's all-gathers
(the ``comm`` share) for the memory of the unsharded parameters (PyTorch's ``fully_shard``
documentation). The key is set on every ``fully_shard`` call the script makes, at launch; a model
handed to ``perfscope.accelerate`` is sharded already, so there it is named as skipped.
"""

from __future__ import annotations

import contextlib
import functools

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical

COMM = ("comm",)
# Where torch has exported fully_shard (the second is the path of torch 2.4-2.5).
_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


class ShardingGroup(KnobGroup):
    """``reshard_after_forward``."""

    name = "sharding"
    keys = ("reshard_after_forward",)
    title = "FSDP2 parameters kept gathered after forward"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        for key in self.changed(acc.config):
            acc.skipped[key] = ("set where the script calls fully_shard, before perfscope.accelerate sees the model: "
                                "applied at launch (perfscope profile --config, tune)")

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        if config.reshard_after_forward is not None:
            report.applied["reshard_after_forward"] = (
                f"fully_shard(reshard_after_forward={config.reshard_after_forward}) on every call of the script")

    def launch_patches(self, config, report) -> list:
        if config.reshard_after_forward is None:
            return []
        return [_patch_fully_shard(config.reshard_after_forward)]

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        # None: the script's own calls, whatever they pass (torch's default reshards all but the root)
        return {"reshard_after_forward": None} if _fsdp2(facts) else {}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        if not _fsdp2(facts):
            why = ("FSDP1 (FullyShardedDataParallel): its sharding_strategy is set where the script wraps the model"
                   if facts.model is not None and facts.model.fsdp == 1 else "the model is not sharded with FSDP2 (fully_shard)")
            part.exclude(self.keys, why)
        elif facts.ranks < 2:
            part.exclude(self.keys, "a single rank: there is nothing to gather")
        else:
            part.knobs.append(Knob("reshard_after_forward", COMM, categorical([None, False, True]), None))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """comm: keep the parameters gathered after forward (no all-gather in the backward)."""
        if "comm" in bottlenecks:
            put("reshard_after_forward", False)


def _fsdp2(facts: RunFacts) -> bool:
    return facts.model is not None and facts.model.fsdp == 2


@contextlib.contextmanager
def _patch_fully_shard(value: bool):
    """``fully_shard`` with ``reshard_after_forward=value`` on every call, for the block."""
    import importlib

    from perfscope.patches import replace

    def make(original):
        @functools.wraps(original)
        def fully_shard(module, *args, **kwargs):
            kwargs["reshard_after_forward"] = value
            return original(module, *args, **kwargs)

        return fully_shard

    with contextlib.ExitStack() as stack:
        seen: dict[int, object] = {}
        for name in _MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            original = module.__dict__.get("fully_shard")
            if original is None:
                continue
            # one wrapper for one function, whatever module re-exports it
            wrapper = seen.setdefault(id(original), make(original))
            replace(stack, module, "fully_shard", lambda _original, w=wrapper: w)
        yield
