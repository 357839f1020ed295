"""Knob groups: each owns some configuration keys end to end (:mod:`.base` states the contract).

:data:`GROUPS` holds the built-in groups in the order ``perfscope.accelerate`` applies them:
the fused operators first (the swapped modules and the replaced optimizer are what the others
see), the optimizer's step (of the optimizer the script keeps), the layout and precision (they
convert the model before DistributedDataParallel wraps it), then communication (the DDP wrapper),
sharding (the script's FSDP2 calls, at launch),
accumulation (the optimizer's window), compile (the model as the script calls it), batch (the
loader's batch size and the learning rate that follows it) and input (the loader).
"""

from __future__ import annotations

from perfscope.runtime.groups.accumulation import AccumulationGroup
from perfscope.runtime.groups.base import Knob, KnobGroup, SearchPart
from perfscope.runtime.groups.batch import BatchGroup
from perfscope.runtime.groups.communication import CommunicationGroup
from perfscope.runtime.groups.compile import CompileGroup
from perfscope.runtime.groups.fused import FusedOpsGroup
from perfscope.runtime.groups.input import InputGroup
from perfscope.runtime.groups.layout import LayoutGroup
from perfscope.runtime.groups.optimizer_step import OptimizerStepGroup
from perfscope.runtime.groups.precision import PrecisionGroup
from perfscope.runtime.groups.sharding import ShardingGroup

GROUPS: tuple[KnobGroup, ...] = (FusedOpsGroup(), OptimizerStepGroup(), LayoutGroup(), PrecisionGroup(),
                                 CommunicationGroup(), ShardingGroup(), AccumulationGroup(), CompileGroup(), BatchGroup(),
                                 InputGroup())


def owner(key: str, groups: tuple[KnobGroup, ...] = GROUPS) -> KnobGroup:
    """The group that owns configuration key ``key``.

    Raises:
        KeyError: no group owns it.
    """
    for group in groups:
        if key in group.keys:
            return group
    raise KeyError(key)


__all__ = ["GROUPS", "AccumulationGroup", "BatchGroup", "CommunicationGroup", "CompileGroup", "FusedOpsGroup", "InputGroup", "Knob",
           "KnobGroup", "LayoutGroup", "OptimizerStepGroup", "PrecisionGroup", "SearchPart", "ShardingGroup", "owner"]
