"""Shared by the tests that run on an emulated cluster (perfscope.emulate): the root check and
the torchrun command of one node."""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from pathlib import Path

import pytest

from perfscope import netns


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# Held while a test makes network namespaces: one such test at a time on the machine, whichever
# pytest worker (pytest -n N) or run it belongs to, since a cluster's net number and the check
# that none is left behind are the machine's, not one test's.
LOCK = Path(tempfile.gettempdir()) / "perfscope-emulated-cluster-tests.lock"


@pytest.fixture
def root_cluster_host():
    """Skip where not root (the reason named); fail under CI, which runs as root. Runs the test
    holding :data:`LOCK`; afterwards, no namespace may be left behind."""
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("CI runs as root; the emulated cluster tests must run there")
        pytest.skip("the emulated cluster needs root (network namespaces, veth, tc)")
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
        assert netns.namespaces() == [], "a test left namespaces behind"


def torchrun(cluster, node: int, script, *args: str, nproc: int = 2, port: int = 29511) -> list[str]:
    """The command starting ``nproc`` ranks of ``script`` on ``node`` of ``cluster`` (static
    rendezvous at node 0's address)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(cluster.names)}",
            f"--node-rank={node}", f"--nproc-per-node={nproc}", f"--master-addr={cluster.addresses[0]}",
            f"--master-port={port}", str(script), *args]
