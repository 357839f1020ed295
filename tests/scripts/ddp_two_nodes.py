"""Run by tests/test_multinode.py on every node of an emulated cluster (torchrun, gloo).

The same model and batch through flat DDP and through DDP with perfscope's hierarchical hook:
rank 0 prints one JSON line with the largest gradient difference between the two and the bytes
its node sent through its link (eth0) during each backward pass, with the gradient bytes.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from perfscope.runtime.parallel import wrap_ddp  # noqa: E402

TX = Path("/sys/class/net/eth0/statistics/tx_bytes")


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights on every rank and for both runs
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1023))


def backward(ddp: torch.nn.Module) -> tuple[list[torch.Tensor], int]:
    g = torch.Generator().manual_seed(dist.get_rank())  # a different batch on each rank
    x = torch.randn(8, 512, generator=g)
    dist.barrier()
    sent = int(TX.read_text())
    ddp(x).square().mean().backward()
    dist.barrier()
    return [p.grad.clone() for p in ddp.parameters()], int(TX.read_text()) - sent


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    flat, flat_tx = backward(DistributedDataParallel(model()))
    hier_ddp = wrap_ddp(model(), bucket_cap_mb=25.0, static_graph=False, hierarchical_allreduce=True)
    hier, hier_tx = backward(hier_ddp)
    diff = max(float((a - b).abs().max()) for a, b in zip(flat, hier))
    scale = max(float(a.abs().max()) for a in flat)
    if dist.get_rank() == 0:
        grad_bytes = sum(p.numel() * p.element_size() for p in hier_ddp.parameters())
        print(json.dumps({"max_diff": diff, "max_grad": scale, "flat_tx": flat_tx, "hier_tx": hier_tx,
                          "grad_bytes": grad_bytes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
