"""The acceleration runtime on CPU, the input pipeline: a loader rebuilt with new worker settings
keeps everything else (sample order, batch sampler), pin_memory and device prefetch only where
CUDA is, nested batches moved to the device, and IterableDatasets kept in the main process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from runtimekit import (
    clean_state,  # noqa: F401 (autouse fixture)
    data,
    mlp,
    shuffled_loader,
)
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

import perfscope
from perfscope.runtime.data import DevicePrefetcher, rebuild_loader, to_device

# --- input pipeline -------------------------------------------------------------------------------


def test_rebuilt_loader_keeps_everything_but_worker_settings():
    def init(worker_id):
        pass

    original = shuffled_loader(drop_last=True, worker_init_fn=init, timeout=5)
    model = mlp()
    _, _, loader = perfscope.accelerate(model, None, original, config={
        "num_workers": 2, "prefetch_factor": 3, "persistent_workers": True})
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 3, True)
    for name in ("dataset", "sampler", "collate_fn", "batch_size", "drop_last", "worker_init_fn", "generator",
                 "timeout", "in_order"):
        assert getattr(loader, name) is getattr(original, name) or getattr(loader, name) == getattr(original, name)
    assert set(perfscope.accelerator().applied) == {"num_workers", "prefetch_factor", "persistent_workers"}


def batches(loader):
    return [[t.clone() for t in b] for b in loader]


def test_rebuilt_loader_keeps_sample_order():
    torch.manual_seed(5)
    expected = batches(shuffled_loader())
    torch.manual_seed(5)
    got = batches(rebuild_loader(shuffled_loader(), num_workers=2, prefetch_factor=2))
    assert len(got) == len(expected) == 8
    for (a, b), (c, d) in zip(expected, got):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_rebuilt_loader_keeps_a_batch_sampler():
    sampler = BatchSampler(SequentialSampler(range(64)), batch_size=5, drop_last=False)
    original = DataLoader(data(), batch_sampler=sampler)
    loader = rebuild_loader(original, num_workers=2)
    assert loader.batch_sampler is sampler and loader.batch_size is None
    assert [len(b[0]) for b in loader] == [5] * 12 + [4]


def test_pin_memory_skipped_without_cuda_and_applied_with(monkeypatch):
    model = mlp()
    _, _, loader = perfscope.accelerate(model, None, shuffled_loader(), config={"pin_memory": True})
    assert not loader.pin_memory and "no CUDA device" in perfscope.accelerator().skipped["pin_memory"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only the decision; nothing is iterated
    _, _, loader = perfscope.accelerate(mlp(), None, shuffled_loader(), config={"pin_memory": True})
    assert loader.pin_memory and "pin_memory" in perfscope.accelerator().applied


def test_device_prefetch_on_cpu_is_a_no_op_with_the_loader_interface():
    original = shuffled_loader()
    prefetcher = DevicePrefetcher(original, "cpu")
    assert not prefetcher.enabled and len(prefetcher) == 8
    assert prefetcher.dataset is original.dataset and prefetcher.sampler is original.sampler
    assert prefetcher.batch_size == 8
    expected = batches(shuffled_loader())  # a fresh loader: the same generator seed, the same order
    assert all(torch.equal(a[0], b[0]) for a, b in zip(expected, batches(prefetcher), strict=True))
    _, _, loader = perfscope.accelerate(mlp(), None, original, config={"device_prefetch": True})
    assert loader is original and "not a CUDA device" in perfscope.accelerator().skipped["device_prefetch"]


def test_to_device_handles_nested_batches():
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(1), "label"]), "n": 3}
    moved = to_device(batch, torch.device("cpu"))
    assert moved["pair"][1][1] == "label" and moved["n"] == 3 and torch.equal(moved["x"], batch["x"])


# --- iterable datasets ----------------------------------------------------------------------------


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_iterable_dataset_keeps_its_main_process_loading():
    loader = DataLoader(_Stream(), batch_size=4)
    _, _, fast = perfscope.accelerate(nn.Linear(1, 1), None, loader, config={"num_workers": 2})
    assert fast.num_workers == 0
    assert [b.tolist() for b in fast] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # no sample twice
    assert "IterableDataset" in perfscope.accelerator().skipped["num_workers"]


def test_patched_iterable_dataset_keeps_its_main_process_loading():
    from perfscope.runtime.patching import patched

    with patched({"num_workers": 2, "persistent_workers": True}) as report:
        loader = DataLoader(_Stream(), batch_size=4)
    assert loader.num_workers == 0
    assert "IterableDataset" in report.not_applied["num_workers"]
