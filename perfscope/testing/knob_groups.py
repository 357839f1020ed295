"""The knob-group contract (:class:`perfscope.runtime.groups.base.KnobGroup`).

Checked on runs that differ in what the tuner can see (:data:`SAMPLE_RUNS`: a CPU script with or
without a DataLoader, an IterableDataset, a GPU script calling ``perfscope.accelerate`` on two
nodes, a GPU without bf16 on one node, a Swin model, FSDP2 on two CPU ranks): every key is searched or left out with a
reason; a knob's baseline is the script's own value and a point of its distribution; every other
value a knob can take is applied, or named as skipped, by ``perfscope.accelerate`` and at launch.
"""

from __future__ import annotations

import torch
from optuna.distributions import CategoricalDistribution, IntDistribution
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfscope.runtime import accelerator as accel_mod
from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.record.run_facts import run_facts
from perfscope.runtime.config import config_from_dict
from perfscope.runtime.groups import owner
from perfscope.runtime.groups.base import KnobGroup, SearchPart, within
from perfscope.runtime.patching import plan
from perfscope.testing import expect

_ALL_IMPLS = ["for-loop", "foreach", "fused"]
_LOADER = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False, "batch_size": 32}
# Facts of a run as the tuner sees them (perfscope.measure.facts), one per kind of run.
SAMPLE_RUNS = {
    "cpu-no-loader": {"cuda": False, "cpu_count": 2, "world_size": 1, "dataloader": None,
                      "model": {"class": "MLP", "compiled": False, "convolutions": 0, "fusable": [], "not_fusable": {}},
                      "compiler": {"unavailable": "torch.compile needs a C++ compiler for CPU code", "compile_s": None},
                      "accelerate": {"called": False}, "ddp": None, "threads": {"intra_op_threads": 2}},
    "cpu-loader": {"cuda": False, "cpu_count": 4, "world_size": 1, "dataloader": _LOADER,
                   "accelerate": {"called": False}, "ddp": None, "threads": {"intra_op_threads": 4},
                   "optimizer": {"class": "SGD", "impl": "for-loop", "impls": _ALL_IMPLS, "tensors": 4,
                                 "parameters": 321},
                   "memory": {"kind": "host", "peak_bytes": 1 << 30, "capacity_bytes": 16 << 30}},
    "cpu-iterable-accelerate": {"cuda": False, "cpu_count": 1, "world_size": 1,
                                "dataloader": dict(_LOADER, iterable=True),
                                "accelerate": {"called": True, "optimizer": True, "loader": True}, "ddp": None,
                                "threads": {"intra_op_threads": 1}},
    "a100-two-nodes-accelerate": {"cuda": True, "cuda_capability": [8, 0], "bf16_supported": True, "cpu_count": 16,
                                  "world_size": 4, "local_world_size": 2, "tf32": False, "cudnn_benchmark": False,
                                  "dataloader": dict(_LOADER, num_workers=2, prefetch_factor=3, pin_memory=True),
                                  "accelerate": {"called": True, "optimizer": True, "loader": True,
                                                 "optimizer_class": "SGD"},
                                  "ddp": {"bucket_cap_mb": 40.0, "static_graph": True},
                                  "threads": {"intra_op_threads": 8},
                                  "memory": {"kind": "device", "peak_bytes": 30 << 30, "capacity_bytes": 80 << 30},
                                  "model": {"class": "ResNet", "convolutions": 53, "channels_last": False,
                                            "fusable": [], "not_fusable": {}},
                                  "optimizer": {"class": "SGD", "impl": "foreach", "impls": ["foreach", "for-loop",
                                                "fused"], "tensors": 161, "parameters": 25_557_032}},
    "v100-one-node": {"cuda": True, "cuda_capability": [7, 0], "bf16_supported": False, "cpu_count": 8,
                      "model": {"class": "OptimizedModule", "compiled": True, "convolutions": 0, "fusable": [],
                                "not_fusable": {}},
                      "world_size": 2, "local_world_size": 2, "tf32": False, "cudnn_benchmark": True,
                      "dataloader": _LOADER, "accelerate": {"called": False},
                      "ddp": {"bucket_cap_mb": None, "static_graph": False}, "threads": {},
                      "optimizer": {"class": "Shampoo", "impl": "for-loop", "impls": ["for-loop"], "tensors": 12,
                                    "parameters": 4096}},
    "cpu-swin-adamw-accelerate": {"cuda": False, "cpu_count": 2, "world_size": 1, "dataloader": _LOADER,
                                  "accelerate": {"called": True, "optimizer": True, "loader": True,
                                                 "optimizer_class": "AdamW"},
                                  "model": {"class": "Swin", "convolutions": 1, "channels_last": False,
                                            "fusable": ["blocks.0.attn", "blocks.1.attn"],
                                            "not_fusable": {}},
                                  "ddp": None, "threads": {"intra_op_threads": 2},
                                  "optimizer": {"class": "AdamW", "impl": "for-loop", "impls": ["for-loop", "fused"],
                                                "tensors": 58, "parameters": 130_000}},
    "cpu-fsdp2-two-ranks": {"cuda": False, "cpu_count": 2, "world_size": 2, "local_world_size": 2, "dataloader": None,
                            "dist_backend": "gloo", "accelerate": {"called": False}, "ddp": None,
                            "threads": {"intra_op_threads": 1},
                            "model": {"class": "FSDPSequential", "compiled": False, "fsdp": 2, "convolutions": 0,
                                      "fusable": [], "not_fusable": {}},
                            "optimizer": {"class": "SGD", "impl": "for-loop", "impls": _ALL_IMPLS, "tensors": 8,
                                          "parameters": 263_168}},
}


def choices(part: SearchPart, name: str) -> list:
    """The values of knob ``name`` the checks try: every choice, or an integer range's ends and middle."""
    d = next(k for k in part.knobs if k.name == name).distribution
    if isinstance(d, CategoricalDistribution):
        return list(d.choices)
    expect(isinstance(d, IntDistribution), f"{name}: a distribution other than categorical or integer")
    return sorted({d.low, (d.low + d.high) // 2, d.high})


def check_names(group: KnobGroup, groups: tuple[KnobGroup, ...]) -> None:
    """The group names itself and its keys, once each among ``groups``."""
    expect(group.name and group.title and group.keys, f"{group!r}: no name, title or keys")
    expect(len(set(group.keys)) == len(group.keys), f"{group.name}: a key named twice")
    expect([g.name for g in groups].count(group.name) == 1, f"{group.name}: two groups of that name")


def check_search(group: KnobGroup, facts: dict, classes: tuple[str, ...]) -> None:
    """Every key of the group is searched or left out with a reason, never both; each knob serves
    some of ``classes`` and depends only on a knob or key that exists."""
    part = group.search_part(facts, int(facts["cpu_count"]))
    searched = [k.name for k in part.knobs]
    plainly_excluded = {k for k in part.excluded if "=" not in k}
    expect(len(searched) == len(set(searched)), f"{group.name}: a knob searched twice")
    expect(set(searched) | {k.split("=")[0] for k in part.excluded} <= set(group.keys),
           f"{group.name}: searches or excludes a key it does not own")
    expect(set(searched) | plainly_excluded == set(group.keys), f"{group.name}: a key neither searched nor left out")
    expect(not set(searched) & plainly_excluded, f"{group.name}: a key both searched and left out")
    for key, why in part.excluded.items():
        expect(isinstance(why, str) and len(why) > 5, f"{group.name}: {key} left out without a reason")
        if "=" in key:  # one value of a searched knob left out
            name, value = key.split("=")
            expect(name in searched and value not in map(str, choices(part, name)),
                   f"{group.name}: {key} left out but still a choice")
    for knob in part.knobs:
        expect(knob.group == group.name, f"{knob.name}: names group {knob.group}, not {group.name}")
        expect(knob.serves and set(knob.serves) <= set(classes), f"{knob.name}: serves no known class")
        if knob.when is not None:  # the parent: a knob of this group, or a key of another one
            parent = next((k for k in part.knobs if k.name == knob.when[0]), None)
            if parent is None:
                expect(owner(knob.when[0]).name != group.name, f"{knob.name}: depends on an unsearched own key")
            else:
                expect(all(within(parent.distribution, v) for v in knob.when[1]),
                       f"{knob.name}: depends on a value its parent cannot take")


def check_baseline(group: KnobGroup, facts: dict) -> None:
    """A knob's baseline is the script's own value (``observed``) and a point of its distribution."""
    part = group.search_part(facts, int(facts["cpu_count"]))
    seen = group.observed(run_facts(facts))
    expect(set(seen) <= set(group.keys), f"{group.name}: observes a key it does not own")
    for knob in part.knobs:
        expect(within(knob.distribution, knob.baseline), f"{knob.name}: baseline {knob.baseline!r} outside")
        expect(knob.name in seen and seen[knob.name] == knob.baseline, f"{knob.name}: baseline is not the script's")


def _model_and_loader() -> tuple[nn.Module, DataLoader]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 1))
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    return model, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def check_applied(group: KnobGroup, facts: dict) -> None:
    """Every value other than the baseline is applied or named as skipped by ``perfscope.accelerate``,
    and by the launch-time plan (a value the plan applies has a patch). Torch's thread count,
    backend flags and the active accelerator are restored afterwards."""
    part = group.search_part(facts, int(facts["cpu_count"]))
    threads = torch.get_num_threads()
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        for knob in part.knobs:
            for value in choices(part, knob.name):
                if value == knob.baseline:
                    continue
                params = {knob.name: value}
                if knob.when is not None:
                    params[knob.when[0]] = knob.when[1][0]
                config = config_from_dict(params)
                report = plan(config, groups=(group,))
                expect(knob.name in {**report.applied, **report.needs_accelerate},
                       f"{knob.name}={value!r}: the launch plan neither applies it nor asks for accelerate")
                if knob.name in report.applied:  # what the plan says it patches, a patch must do
                    expect(group.launch_patches(config, report), f"{knob.name}={value!r}: planned but no patch")
                model, loader = _model_and_loader()
                accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, config=config)
                acc = active_accelerator()
                expect(knob.name in {**acc.applied, **acc.skipped},
                       f"{knob.name}={value!r}: accelerate neither applied nor skipped it ({acc.summary()})")
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = flags
        accel_mod._active = None
