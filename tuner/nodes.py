"""Tuning a job that spans nodes: node 0 drives the study, every other node runs its ranks of
each trial.

``perfscope tune SCRIPT --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --nproc-per-node G``
is run on every node, as torchrun is. On node 0 the tuner runs as on one node (profile, search,
confirm, write the results once) and, through a :class:`TrialBoard`, tells the other nodes each
trial before it starts it: a ``torch.distributed.TCPStore`` served at ``HOST:PORT`` holds, per
trial ``k``, the measurement's arguments (the trial's configuration inline) and the port of that
trial's own rendezvous. Every other node (:func:`follow`) waits for trial ``k``, starts its ranks
of it with its node rank, reports their exit status, and goes on to ``k + 1`` until node 0 says
stop. Only node 0 measures (its first rank's records), so one study and one result, however many
nodes; several such jobs can share a study through PostgreSQL as single-node runs do.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfscope.collect.nodes import NNODES_ENV, NodeLaunch
from perfscope.errors import PerfscopeError
from perfscope.text import safe

RECORDS, CONFIG = "{records}", "{config}"  # placeholders in the shared arguments, each node's own
# Trials rendezvous on ports above the board's, in turn: a trial's port is free again long before
# it comes round (its server closed when the trial ended).
TRIAL_PORTS = 50
FOLLOWER_WAIT_S = 120.0  # how long node 0 waits for the other nodes to finish a trial it ended
# How long node 0 keeps the board up after saying stop, for the other nodes to read it: a follower
# polls every POLL_S while its ranks run, then stops them. A node that is gone costs this once.
STOP_ACK_S = 15.0


def _store(nodes: NodeLaunch, master: bool, timeout_s: float):
    # A board that goes away is reported in one line (follow); c10d would also log a C++ stack.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from torch.distributed import TCPStore

    host, port = nodes.host_port()
    return TCPStore(host, port, is_master=master, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


class TrialBoard:
    """Node 0's side: announce each trial to the other nodes, and stop them at the end.

    Args:
        nodes: The job's layout (this must be node 0).
        nproc_per_node: Ranks on every node.

    Raises:
        PerfscopeError: the board's port cannot be served.
    """

    def __init__(self, nodes: NodeLaunch, nproc_per_node: int) -> None:
        self.nodes, self.nproc_per_node = nodes, nproc_per_node
        if nodes.host_port()[1] + TRIAL_PORTS > 65535:
            raise PerfscopeError(f"--rdzv-endpoint port {nodes.host_port()[1]}: the tuning also takes the "
                                 f"{TRIAL_PORTS} ports above it for its runs; pick one up to {65535 - TRIAL_PORTS}")
        try:
            self._store = _store(nodes, True, 30.0)
        except Exception as e:  # noqa: BLE001 - a port in use, an address not of this machine
            raise PerfscopeError(f"cannot serve the tuning board at {nodes.rdzv_endpoint}: {e}") from None
        self._next = 0

    def launch_args(self, k: int) -> list[str]:
        """torchrun's placement of node 0 in trial ``k``."""
        host, port = self.nodes.host_port()
        return [f"--nnodes={self.nodes.nnodes}", "--node-rank=0", f"--master-addr={host}",
                f"--master-port={port + 1 + k % TRIAL_PORTS}"]

    def announce(self, own: list[str], config_text: str | None, timeout_s: float) -> int:
        """Publish the next trial (``own``: the measurement's arguments with :data:`RECORDS`
        and :data:`CONFIG` in place of this node's paths); returns its number."""
        k = self._next
        self._next += 1
        self._store.set(f"trial/{k}", json.dumps({"own": own, "config": config_text, "launch": self.launch_args(k),
                                                  "timeout_s": timeout_s}))
        return k

    def finished(self, k: int) -> list[str]:
        """Wait (bounded) for the other nodes to end trial ``k``; one line per node that did not."""
        late = []
        for node in range(1, self.nodes.nnodes):
            try:
                self._store.wait([f"done/{k}/{node}"], datetime.timedelta(seconds=FOLLOWER_WAIT_S))
            except Exception:  # noqa: BLE001 - a node gone or hung: the next trial's rendezvous tells
                late.append(f"node {node} did not report the end of trial {k} within {FOLLOWER_WAIT_S:g} s")
        return late

    def stop(self) -> None:
        """Tell the other nodes there is no further trial, and wait (up to :data:`STOP_ACK_S`)
        until each has read it: the board is served by this process, and a follower that reads
        the stop after it ended sees only a closed connection."""
        self._store.set(f"trial/{self._next}", json.dumps({"stop": True}))
        try:
            self._store.wait([f"stopped/{node}" for node in range(1, self.nodes.nnodes)],
                             datetime.timedelta(seconds=STOP_ACK_S))
        except Exception:  # noqa: BLE001 - a node already gone: nothing to wait for
            pass


POLL_S = 2.0  # how often a follower checks node 0's board while its ranks run


def _ack_stop(store, node_rank: int) -> None:
    try:  # node 0 keeps its board up until every node has said it read the stop (TrialBoard.stop)
        store.set(f"stopped/{node_rank}", "1")
    except Exception:  # noqa: BLE001 - node 0 stopped waiting: nothing more to tell it
        pass


def _wait_run(proc: subprocess.Popen, store, k: int, timeout_s: float, node_rank: int):
    """The run's exit status; ``"timeout"``; ``"stopped"`` once node 0 has said stop.

    Raises:
        PerfscopeError: the board went away (node 0 killed) while the run was going.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            return "timeout"
        try:  # node 0 said stop (Ctrl-C, an error) while this run went on: its ranks wait in vain
            if store.check([f"trial/{k + 1}"]) and json.loads(store.get(f"trial/{k + 1}")).get("stop"):
                _ack_stop(store, node_rank)  # read: node 0 need not wait for this node's ranks to stop
                return "stopped"
        except Exception as e:  # noqa: BLE001 - the board is gone: node 0 was killed
            raise PerfscopeError(f"node 0's tuning board went away during run {k} ({e}); stopping") from None


def follow(nodes: NodeLaunch, nproc_per_node: int, *, setup_timeout_s: float = 3600.0) -> int:
    """Run this node's ranks of every trial node 0 announces; returns 0 once told to stop.

    Raises:
        PerfscopeError: node 0's board cannot be reached, or went away mid-run.
    """
    from perfscope.collect.launch import child_env
    from tuner.procs import stop_trial, trial_command

    deadline = time.monotonic() + setup_timeout_s
    while True:  # node 0 profiles its baseline first: its board may come up late
        try:
            store = _store(nodes, False, setup_timeout_s)
            break
        except Exception as e:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise PerfscopeError(f"node 0's tuning board at {nodes.rdzv_endpoint} cannot be reached: {e}") from None
            time.sleep(1.0)
    print(f"perfscope: node {nodes.node_rank} of {nodes.nnodes}: following node 0's trials", flush=True)
    k = 0
    while True:
        try:
            store.wait([f"trial/{k}"], datetime.timedelta(seconds=setup_timeout_s))
            msg = json.loads(store.get(f"trial/{k}"))
        except Exception as e:  # noqa: BLE001 - the board closed: node 0 ended without a stop
            raise PerfscopeError(f"node 0's tuning board went away before run {k} ({e}); stopping") from None
        if msg.get("stop"):
            _ack_stop(store, nodes.node_rank)
            print(f"perfscope: node {nodes.node_rank}: {k} run(s) of node 0's done (baseline, trials, confirmation "
                  "rounds); node 0 wrote the results", flush=True)
            return 0
        with tempfile.TemporaryDirectory(prefix="perfscope-follow-") as tmp:
            config = None
            if msg.get("config") is not None:
                config = Path(tmp) / "config.yaml"
                config.write_text(msg["config"])
            records = Path(tmp) / "records"
            records.mkdir()
            own = [str(records) if a == RECORDS else str(config) if a == CONFIG else a for a in msg["own"]]
            launch = [a.replace("--node-rank=0", f"--node-rank={nodes.node_rank}") for a in msg["launch"]]
            command = [sys.executable, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc_per_node}", *own]
            env = child_env(str(config) if config else None)
            env[NNODES_ENV] = str(nodes.nnodes)
            proc = subprocess.Popen(trial_command(command, True), env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                status = _wait_run(proc, store, k, float(msg.get("timeout_s") or 900.0), nodes.node_rank)
            finally:
                stop_trial(proc, True)
        if status == "stopped":
            print(f"perfscope: node {nodes.node_rank}: node 0 stopped during run {k}; node 0 wrote what finished",
                  flush=True)
            return 0
        store.set(f"done/{k}/{nodes.node_rank}", str(status))
        print(f"perfscope: node {nodes.node_rank}: run {k} ended (exit status {safe(str(status))})", flush=True)
        k += 1
