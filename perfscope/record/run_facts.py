"""What a measured run showed of itself (``perfscope.measure``'s ``facts``): the record the tuner
shapes its search space and its first guess from (:mod:`perfscope.runtime.groups`).

The measurement writes it as JSON into each rank's result (:func:`perfscope.measure.facts.run_facts`);
the tuner keeps the baseline's in its study and reads it once, here, into :class:`RunFacts`, at
the search space's door (:func:`run_facts`). Every field may be absent (an older record, a
script that never built what the field describes): absent reads as its default, and so do a
null and an empty object (``{}``). Fields the record holds beyond these are ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

from perfscope.errors import PerfscopeError


class _Facts(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    pass


class LoaderFacts(_Facts):
    """``dataloader``: the first torch DataLoader the script iterated (:func:`perfscope.measure.facts.loader_settings`)."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    iterable: bool = False
    batch_size: int | None = None


class ThreadFacts(_Facts):
    """``threads``: what competed for the cores (:func:`perfscope.measure.facts.host_threads`)."""

    intra_op_threads: int | None = None
    loader_workers: int | None = None
    cores: int | None = None
    demand: int | None = None
    load_1m: float | None = None


class AccelerateFacts(_Facts):
    """``accelerate``: whether the script calls ``perfscope.accelerate`` and with what."""

    called: bool = False
    optimizer: bool = False
    loader: bool = False
    optimizer_class: str | None = None


class ModelFacts(_Facts):
    """``model``: the first module called that holds parameters (:func:`perfscope.measure.facts.model_facts`)."""

    class_: str | None = msgspec.field(default=None, name="class")
    compiled: bool = False
    fsdp: int | None = None
    convolutions: int = 0
    channels_last: bool = False
    fusable: list[str] = []
    not_fusable: dict[str, str] = {}


class OptimizerFacts(_Facts):
    """``optimizer``: the first optimizer that stepped (:func:`perfscope.runtime.optimizer_impl.facts`)."""

    class_: str | None = msgspec.field(default=None, name="class")
    impl: str | None = None
    impls: list[str] = []
    tensors: int = 0


class DdpFacts(_Facts):
    """``ddp``: the first DistributedDataParallel the script built."""

    bucket_cap_mb: float | None = None
    static_graph: bool = False


class CompilerFacts(_Facts):
    """``compiler``: why ``torch.compile`` cannot build kernels here (None: it can), and the
    seconds the run spent compiling."""

    unavailable: str | None = None
    compile_s: float | None = None


class MemoryFacts(_Facts):
    """``memory``: the baseline's profiled peak and the device's capacity (bytes), which the tuner adds."""

    peak_bytes: float | None = None
    capacity_bytes: float | None = None


class RunFacts(_Facts):
    """The run's facts, as the knob groups read them (module docstring)."""

    torch: str | None = None
    cuda: bool = False
    gpu_name: str | None = None
    cuda_capability: list[int] | None = None
    bf16_supported: bool = False
    cpu_count: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    dist_backend: str | None = None
    ddp: DdpFacts | None = None
    dataloader: LoaderFacts | None = None
    accelerate: AccelerateFacts = msgspec.field(default_factory=AccelerateFacts)
    model: ModelFacts | None = None
    optimizer: OptimizerFacts | None = None
    tf32: bool = False
    cudnn_benchmark: bool = False
    threads: ThreadFacts | None = None
    compiler: CompilerFacts = msgspec.field(default_factory=CompilerFacts)
    memory: MemoryFacts | None = None

    @property
    def ranks(self) -> int:
        """The job's ranks (1 where not recorded)."""
        return max(1, self.world_size or 1)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on this node (1 where not recorded): they share its cores."""
        return max(1, self.local_world_size or 1)


def _present(value: Any) -> Any:
    """``value`` with every null and every empty object taken out: they read as absent."""
    if isinstance(value, dict):
        return {k: _present(v) for k, v in value.items() if v is not None and not (isinstance(v, dict) and not v)}
    return value


def run_facts(facts: dict | RunFacts | None) -> RunFacts:
    """``facts`` (the measurement's record as plain data, or already read) as :class:`RunFacts`.

    Raises:
        PerfscopeError: a field of the wrong type ("run facts: FIELD: ...").
    """
    if isinstance(facts, RunFacts):
        return facts
    try:
        return msgspec.convert(_present(facts or {}), RunFacts, strict=False)
    except msgspec.ValidationError as e:
        raise PerfscopeError(f"run facts: {e}") from None
