"""Input-pipeline knobs: rebuild a DataLoader with new worker settings, and device prefetch."""

from __future__ import annotations

import inspect

import torch
from torch.utils.data import DataLoader, IterableDataset

from perfscope.runtime.precision import map_tensors

# DataLoader arguments that exist only in some torch versions (``in_order`` since 2.6).
_LOADER_PARAMS = set(inspect.signature(DataLoader.__init__).parameters)


ITERABLE_SKIP_REASON = (
    "the dataset is an IterableDataset: each worker process would replay the whole stream (every "
    "sample once per worker) unless the dataset shards itself with get_worker_info(); set num_workers "
    "in the script"
)


def iterable_without_sharding(loader, num_workers: int) -> bool:
    """Whether giving ``loader`` ``num_workers`` > 0 would duplicate samples: its dataset is an
    ``IterableDataset`` and it runs in the main process now, so nothing shows that the dataset
    splits its stream between workers (a loader that already has workers presumably does)."""
    dataset = getattr(loader, "dataset", None)
    return isinstance(dataset, IterableDataset) and num_workers > 0 and getattr(loader, "num_workers", 0) == 0


def rebuild_loader(
    loader: DataLoader,
    *,
    num_workers: int | None = None,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool | None = None,
    batch_size: int | None = None,
) -> DataLoader:
    """A new DataLoader over the same data and sample order, with other worker settings.

    The dataset, sampler or batch sampler (the same objects, so their generators and
    ``set_epoch`` carry over), collate_fn, batch size, drop_last, worker_init_fn, generator,
    timeout, multiprocessing context, pin_memory_device and in_order are kept; with the same
    seed the rebuilt loader yields the same batches in the same order.

    Args:
        loader: A ``torch.utils.data.DataLoader`` (not a subclass).
        num_workers: Worker processes; None keeps the loader's.
        pin_memory: Page-locked batches; None keeps the loader's.
        prefetch_factor: Batches each worker loads ahead; None keeps the loader's (dropped
            when the result has no workers, where DataLoader forbids it).
        persistent_workers: Keep workers across epochs; None keeps the loader's (False
            without workers).
        batch_size: Samples per batch; None keeps the loader's. The same sampler's order is
            cut into batches of this size.

    Returns:
        The new DataLoader.

    Raises:
        TypeError: ``loader`` is not a plain DataLoader.
        ValueError: ``batch_size`` for a loader without automatic batching (its own batch
            sampler, or ``batch_size=None``).
    """
    if type(loader) is not DataLoader:
        raise TypeError(f"can only rebuild a torch.utils.data.DataLoader, got {type(loader).__name__}")
    if batch_size is not None and loader.batch_size is None:
        raise ValueError("the loader has no batch_size to change (its own batch sampler, or batch_size=None)")
    workers = loader.num_workers if num_workers is None else num_workers
    kwargs = {
        "dataset": loader.dataset,
        "num_workers": workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory if pin_memory is None else pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context if workers > 0 else None,
        "generator": loader.generator,
        **_worker_options(loader, workers, prefetch_factor, persistent_workers),
    }
    kwargs.update({name: getattr(loader, name) for name in ("pin_memory_device", "in_order")
                   if name in _LOADER_PARAMS and hasattr(loader, name)})
    return DataLoader(**kwargs, **_batching(loader, batch_size))


def _worker_options(loader: DataLoader, workers: int, prefetch_factor: int | None,
                    persistent_workers: bool | None) -> dict:
    """prefetch_factor and persistent_workers: as given, else the loader's; None and False without
    workers (DataLoader forbids them there). The loader's own prefetch_factor is 2 by default when
    it had workers, None without."""
    if workers <= 0:
        return {"prefetch_factor": None, "persistent_workers": False}
    return {"prefetch_factor": prefetch_factor if prefetch_factor is not None else loader.prefetch_factor,
            "persistent_workers": persistent_workers if persistent_workers is not None else loader.persistent_workers}


def _batching(loader: DataLoader, batch_size: int | None) -> dict:
    """How the rebuilt loader batches: the same sampler (or batch sampler) and drop_last, with
    ``batch_size`` where given."""
    if isinstance(loader.dataset, IterableDataset):
        # Iterable datasets take no sampler; batching is batch_size + drop_last.
        return {"batch_size": batch_size or loader.batch_size, "drop_last": loader.drop_last}
    if loader.batch_size is None and loader.batch_sampler is not None:
        return {"batch_sampler": loader.batch_sampler}  # the user's own batch sampler
    # Automatic batching (or none, batch_size=None): DataLoader builds the BatchSampler from the
    # same sampler, batch_size and drop_last.
    return {"sampler": loader.sampler, "batch_size": batch_size or loader.batch_size, "drop_last": loader.drop_last}


def to_device(batch, device: torch.device, non_blocking: bool = False):
    """Copy every tensor in a nested batch (tuples, lists, dicts) to ``device``."""
    return map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


_END = object()


def _record_stream(batch, stream) -> None:
    def record(t: torch.Tensor) -> torch.Tensor:
        if t.is_cuda:
            t.record_stream(stream)
        return t

    map_tensors(batch, record)


class DevicePrefetcher:
    """Iterate a loader with the next batch already on its way to the GPU.

    On CUDA, while the caller computes on batch *i*, batch *i+1* is copied host-to-device on
    a side stream (``non_blocking`` copies, which are asynchronous only from pinned memory:
    set ``pin_memory``). Before a batch is handed out the current stream waits for the side
    stream, and each tensor is ``record_stream``-ed on the current stream so the caching
    allocator does not reuse its memory while the step still reads it. Batches come out on
    the device; tensors nested in tuples, lists and dicts are moved, anything else passes.

    On any other device it is a no-op with the same interface: it yields the loader's batches
    unchanged.

    ``len()``, ``dataset``, ``sampler``, ``batch_size`` and every other loader attribute are
    reachable through the prefetcher.

    Args:
        loader: Any iterable of batches (normally a DataLoader).
        device: The device the model runs on.
    """

    def __init__(self, loader, device: torch.device | str) -> None:
        self.loader = loader
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.enabled = self.device.type == "cuda"

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet (e.g. while unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        if not self.enabled:
            yield from self.loader
            return
        side = torch.cuda.Stream(self.device)
        batches = iter(self.loader)

        def load():
            batch = next(batches, _END)
            if batch is _END:
                return _END
            with torch.cuda.stream(side):
                return to_device(batch, self.device, non_blocking=True)

        upcoming = load()
        while upcoming is not _END:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(side)  # the copy must finish before the step reads the batch
            batch = upcoming
            # Allocated on the side stream but used on the current one: keep the memory
            # alive until the current stream's work on it is done.
            _record_stream(batch, current)
            upcoming = load()  # enqueue the next copy now, so it overlaps this step's compute
            yield batch
