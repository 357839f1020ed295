"""A job over several nodes: which node this launcher is, and where the ranks meet.

``perfscope profile --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --nproc-per-node G`` is
run once on every node, as ``torchrun`` is. The ranks meet through torchrun's static rendezvous
(``--master-addr/--master-port``): node ``R`` runs global ranks ``R*G .. R*G+G-1``, so a node's
traces are named by global rank and the traces of all nodes can be gathered in one folder.
"""

from __future__ import annotations

import dataclasses

from perfscope.collect.errors import CollectError

MAX_NODES = 4096
# Ranks one node can hold: far above any machine's GPU count; a larger number is a typo.
MAX_NPROC_PER_NODE = 1_024
NNODES_ENV = "PERFSCOPE_NNODES"  # set by perfscope for the ranks of a multi-node job


@dataclasses.dataclass(kw_only=True, frozen=True)
class NodeLaunch:
    """This node's part of a multi-node job.

    Attributes:
        nnodes: Nodes in the job (1..4096).
        node_rank: This node (0..nnodes-1); node 0 hosts the rendezvous.
        rdzv_endpoint: ``HOST:PORT`` of node 0, reachable from every node.

    Raises:
        CollectError: a value out of range or an endpoint that is not ``HOST:PORT``.
    """

    nnodes: int
    node_rank: int
    rdzv_endpoint: str

    def __post_init__(self) -> None:
        for name, value, low, high in (("--nnodes", self.nnodes, 1, MAX_NODES),
                                       ("--node-rank", self.node_rank, 0, self.nnodes - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise CollectError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        self.host_port()  # validates

    def host_port(self) -> tuple[str, int]:
        """``(host, port)``; an IPv6 address in brackets (``[fe80::1]:29500``)."""
        host, sep, port = str(self.rdzv_endpoint).rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        ok = (sep and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
              and not any(c.isspace() for c in host) and (bracketed or ":" not in host))
        if not ok:
            raise CollectError(f"--rdzv-endpoint must be HOST:PORT (node 0's address; an IPv6 address in brackets, "
                               f"[::1]:29500), got {str(self.rdzv_endpoint)[:80]!r}")
        return host, int(port)

    def torchrun_args(self) -> list[str]:
        """The launcher options placing this node in the job."""
        host, port = self.host_port()
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--master-addr={host}",
                f"--master-port={port}"]

    def ranks(self, nproc_per_node: int) -> range:
        """The global ranks this node runs."""
        return range(self.node_rank * nproc_per_node, (self.node_rank + 1) * nproc_per_node)


def from_options(nnodes: int | None, node_rank: int | None, rdzv_endpoint: str | None,
                 nproc_per_node: int | None) -> NodeLaunch | None:
    """The command line's ``--nnodes --node-rank --rdzv-endpoint`` as a NodeLaunch; None when
    none is given, or only ``--nnodes 1``.

    Raises:
        CollectError: some given without the others, or without ``--nproc-per-node``.
    """
    given = {"--nnodes": nnodes, "--node-rank": node_rank, "--rdzv-endpoint": rdzv_endpoint}
    named = [flag for flag, value in given.items() if value is not None]
    if not named or (named == ["--nnodes"] and nnodes == 1):
        return None
    if len(named) < 3:
        missing = ", ".join(flag for flag, value in given.items() if value is None)
        raise CollectError(f"a multi-node job needs --nnodes, --node-rank and --rdzv-endpoint together; missing {missing}")
    if nproc_per_node is None:
        raise CollectError("a multi-node job needs --nproc-per-node: the ranks to start on this node")
    return NodeLaunch(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint)


def check_layout(environ=None) -> None:
    """In a rank of a multi-node job (``$PERFSCOPE_NNODES`` set by perfscope's launcher): refuse a
    world that is not the nodes times this node's ranks -- nodes started with different
    ``--nproc-per-node``, which torchrun accepts and numbers into another job than the one asked for.

    Raises:
        CollectError: naming the mismatch.
    """
    import os

    env = os.environ if environ is None else environ
    nnodes, world, local = (env.get(k, "") for k in (NNODES_ENV, "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    if nnodes.isdigit() and world.isdigit() and local.isdigit() and int(world) != int(nnodes) * int(local):
        raise CollectError(f"the job has {world} ranks, not {nnodes} nodes x {local}: every node must be started "
                           "with the same --nproc-per-node")
