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
        host, sep, port = str(self.rdzv_endpoint).rpartition(":")
        host = host.strip("[]")  # [::1]:29500
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise CollectError(f"--rdzv-endpoint must be HOST:PORT (node 0's address), got {self.rdzv_endpoint!r}")
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
