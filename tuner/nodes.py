"""Tuning a job that spans nodes: node 0 drives the study, every other node runs its ranks of
each trial.

``perfscope tune SCRIPT --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --nproc-per-node G``
is run on every node, as torchrun is. On node 0 the tuner runs as on one node (profile, search,
confirm, write the results once) and, through a :class:`TrialBoard`, tells the other nodes each
run before it starts it: a ``torch.distributed.TCPStore`` served at ``HOST:PORT`` (bound to that
address only) holds, per run ``k``, a :class:`perfscope.tuner.board.Trial` record: the configuration's
values and the measurement's step counts, seed and timeout. Every other node (:func:`follow`)
waits for run ``k``, builds the command from its *own* command line (script, arguments,
``--nproc-per-node``, node rank; the rendezvous port from its own endpoint and ``k``), runs its
ranks, reports their exit status, and goes on to ``k + 1`` until node 0 says stop. Only node 0
measures (its first rank's records), so one study and one result, however many nodes.

Records are validated and, with a shared secret, signed (:mod:`perfscope.tuner.board`). Followers send a
heartbeat every :data:`HEARTBEAT_S`; node 0 stops the tuning within :data:`LOST_AFTER_S` of the
last one from a node that went away, as a follower stops once node 0's board is gone.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from perfscope.collect.nodes import NNODES_ENV, NodeLaunch
from perfscope.errors import PerfscopeError
from perfscope.text import safe
from perfscope.tuner.board import (Alive, BoardError, Done, Record, Stop, Stopped, Trial, board_secret, decode, encode,
                                   remove_job_secret, require_secret)
from perfscope.tuner.board import NodeLost  # noqa: F401 - raised by run_trial, named here too (nodes.NodeLost)

# Runs rendezvous on ports above the board's, in turn: a run's port is free again long before it
# comes round (its server closed when the run ended).
TRIAL_PORTS = 50
FOLLOWER_WAIT_S = 120.0  # how long node 0 waits for the other nodes to finish a run it ended
# How long node 0 keeps the board up after saying stop, for the other nodes to read it: a follower
# polls every POLL_S while its ranks run, then stops them. A node that is gone costs this once.
STOP_ACK_S = 15.0
POLL_S = 2.0  # how often a follower checks node 0's board while its ranks run
HEARTBEAT_S = 1.0  # a follower's heartbeat period
# A follower silent this long is gone: ten beats, so that a busy machine's scheduling delays
# (seconds at a load of 15) are not taken for a dead node.
LOST_AFTER_S = 10.0
# How long a read of a key that was there a moment ago may wait: an attacker who deletes it between
# the check and the read would otherwise hold the reader for the store's whole timeout.
GET_TIMEOUT_S = 10.0


def trial_launch_args(nodes: NodeLaunch, k: int) -> list[str]:
    """torchrun's placement of ``nodes``' node in run ``k``: its own endpoint's host, and the
    port ``k`` takes above the board's (every node derives it alike; nothing read from the board)."""
    host, port = nodes.host_port()
    return [f"--nnodes={nodes.nnodes}", f"--node-rank={nodes.node_rank}", f"--master-addr={host}",
            f"--master-port={port + 1 + k % TRIAL_PORTS}"]


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket bound to ``host``'s address (not every interface).

    Raises:
        OSError: the name does not resolve, the address is not this machine's, the port is taken.
    """
    error: OSError = OSError(f"{host} resolves to no address")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error


def _store(nodes: NodeLaunch, timeout_s: float, listen_fd: int | None = None):
    # A board that goes away is reported in one line (follow); c10d would also log a C++ stack.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from torch.distributed import TCPStore

    host, port = nodes.host_port()
    return TCPStore(host, port, is_master=listen_fd is not None, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=listen_fd)


class Board:
    """Typed, checked reads and writes of one store (either side of the board).

    Args:
        store: A ``TCPStore`` client or server.
        secret: The job's shared secret, or None (loopback only).
    """

    def __init__(self, store, secret: bytes | None) -> None:
        self.store, self.secret = store, secret
        store.set_timeout(datetime.timedelta(seconds=GET_TIMEOUT_S))  # waits give their own

    def put(self, key: str, record: Record) -> None:
        """Write ``record`` under ``key``, signed where this board has a secret."""
        self.store.set(key, encode(record, key, self.secret))

    def has(self, key: str) -> bool:
        """Whether ``key`` holds a value now (of anyone's: :meth:`get` checks it)."""
        return bool(self.store.check([key]))

    def get(self, key: str) -> Record:
        """The record under ``key`` (waits for it up to the store's timeout).

        Raises:
            BoardError: not a valid record signed with this node's secret.
        """
        return decode(self.store.get(key), key, self.secret)


class TrialBoard:
    """Node 0's side: announce each run to the other nodes, watch their heartbeats, stop them
    at the end.

    Args:
        nodes: The job's layout (this must be node 0).
        nproc_per_node: Ranks on every node.

    Raises:
        PerfscopeError: no secret where the endpoint is not loopback (:func:`perfscope.tuner.board.require_secret`);
            the board's port cannot be served at the endpoint's address.
    """

    def __init__(self, nodes: NodeLaunch, nproc_per_node: int) -> None:
        self.nodes, self.nproc_per_node = nodes, nproc_per_node
        host, port = nodes.host_port()
        if port + TRIAL_PORTS > 65535:
            raise PerfscopeError(f"--rdzv-endpoint port {port}: the tuning also takes the "
                                 f"{TRIAL_PORTS} ports above it for its runs; pick one up to {65535 - TRIAL_PORTS}")
        # Written before the board listens: a follower reads the job's secret once it has connected.
        secret, self._secret_file = board_secret(host, port, nodes.rdzv_endpoint, node0=True)
        try:
            self._socket = _listen(host, port)  # kept open: the store serves on this socket
            self._board = Board(_store(nodes, 30.0, self._socket.fileno()), secret)
        except Exception as e:  # noqa: BLE001 - a port in use, an address not of this machine
            remove_job_secret(self._secret_file, secret)
            raise PerfscopeError(f"cannot serve the tuning board at {nodes.rdzv_endpoint}: {e}") from None
        self._next = 0
        self.job = secrets.token_hex(16)  # followers refuse records of another job (tuner.board.Trial)
        self._beats: dict[int, tuple[int, float]] = {}  # node: (last beat, when it was first seen)
        self._checked = 0.0

    def launch_args(self, k: int) -> list[str]:
        """torchrun's placement of node 0 in run ``k``."""
        return trial_launch_args(self.nodes, k)

    def announce(self, config: dict, *, warmup_steps: int, measure_steps: int, profile_steps: int, seed: int,
                 timeout_s: float) -> int:
        """Publish the next run (``config``: the configuration's changes from the defaults);
        returns its number."""
        k = self._next
        self._next += 1
        self._board.put(f"trial/{k}", Trial(job=self.job, k=k, config=config, warmup_steps=warmup_steps, measure_steps=measure_steps,
                                            profile_steps=profile_steps, seed=seed, timeout_s=float(timeout_s)))
        return k

    def _beat_of(self, node: int):
        """The follower's last heartbeat record on the board, or None (none yet, or unreadable)."""
        key = f"alive/{node}"
        try:
            return self._board.get(key) if self._board.has(key) else None
        except Exception:  # noqa: BLE001 - not the node's, or deleted since: as good as no beat
            return None

    def lost(self) -> str | None:
        """One line naming a follower whose heartbeat stopped :data:`LOST_AFTER_S` ago (checked
        at most every half second), else None. A node not yet seen is not judged: the run's
        rendezvous waits for it."""
        now = time.monotonic()
        if now - self._checked < 0.5:
            return None
        self._checked = now
        for node in range(1, self.nodes.nnodes):
            beat = self._beat_of(node)
            seen = self._beats.get(node)
            if isinstance(beat, Alive) and beat.node == node and (seen is None or beat.beat > seen[0]):
                self._beats[node] = (beat.beat, now)
            elif seen is not None and now - seen[1] > LOST_AFTER_S:
                return f"node {node} stopped sending heartbeats {now - seen[1]:.0f} s ago (gone or cut off)"
        return None

    def finished(self, k: int) -> list[str]:
        """Wait (bounded, and no longer than a node's heartbeats last) for the other nodes to end
        run ``k``; one line per node that did not."""
        late = []
        for node in range(1, self.nodes.nnodes):
            key, deadline = f"done/{k}/{node}", time.monotonic() + FOLLOWER_WAIT_S
            while not self._reported(key, k, node):
                gone = self.lost()
                if gone or time.monotonic() > deadline:
                    late.append(gone or f"node {node} did not report the end of run {k} within {FOLLOWER_WAIT_S:g} s")
                    break
                time.sleep(0.1)
        return late

    def _reported(self, key: str, k: int, node: int) -> bool:
        """Whether ``node`` reported the end of run ``k`` (a valid record, not just the key)."""
        try:
            done = self._board.get(key) if self._board.has(key) else None
        except Exception:  # noqa: BLE001 - not the node's, or deleted since
            return False
        return isinstance(done, Done) and done.job == self.job and done.k == k and done.node == node

    def stop(self) -> None:
        """Tell the other nodes there is no further run, and wait (up to :data:`STOP_ACK_S`)
        until each has read it: the board is served by this process, and a follower that reads
        the stop after it ended sees only a closed connection."""
        try:
            self._board.put(f"trial/{self._next}", Stop(job=self.job, k=self._next))
            self._board.store.wait([f"stopped/{node}" for node in range(1, self.nodes.nnodes)],
                                   datetime.timedelta(seconds=STOP_ACK_S))
        except Exception:  # noqa: BLE001 - a node already gone: nothing to wait for
            pass
        finally:  # the followers read the job's secret at their start
            remove_job_secret(self._secret_file, self._board.secret)
            self._secret_file = None


def _ack_stop(board: Board, node_rank: int) -> None:
    try:  # node 0 keeps its board up until every node has said it read the stop (TrialBoard.stop)
        board.put(f"stopped/{node_rank}", Stopped(node=node_rank))
    except Exception:  # noqa: BLE001 - node 0 stopped waiting: nothing more to tell it
        pass


def _board_error(e: BoardError) -> PerfscopeError:
    return PerfscopeError(f"node 0's tuning board: {e}")


def _wait_run(proc: subprocess.Popen, board: Board, k: int, timeout_s: float, node_rank: int, job: str):
    """The run's exit status; ``"timeout"``; ``"stopped"`` once node 0 has said stop.

    Raises:
        PerfscopeError: the board went away (node 0 killed) while the run was going, or holds a
            record that is not node 0's.
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
            said = board.get(f"trial/{k + 1}") if board.has(f"trial/{k + 1}") else None
            if isinstance(said, Stop) and said.job == job:
                _ack_stop(board, node_rank)  # read: node 0 need not wait for this node's ranks to stop
                return "stopped"
        except BoardError as e:
            raise _board_error(e) from None
        except Exception as e:  # noqa: BLE001 - the board is gone: node 0 was killed
            raise PerfscopeError(f"node 0's tuning board went away during run {k} ({e}); stopping") from None


class _Heartbeat:
    """A follower's heartbeat, from a thread with its own connection to the board."""

    def __init__(self, nodes: NodeLaunch, secret: bytes | None) -> None:
        self._stop = threading.Event()
        self._board = Board(_store(nodes, 30.0), secret)
        self._node = nodes.node_rank
        self._thread = threading.Thread(target=self._beat, name="perfscope-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        beat = 0
        while not self._stop.is_set():
            try:
                self._board.put(f"alive/{self._node}", Alive(node=self._node, beat=beat))
            except Exception:  # noqa: BLE001 - the board is gone: the main loop says so
                return
            beat += 1
            self._stop.wait(HEARTBEAT_S)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def _connect(nodes: NodeLaunch, setup_timeout_s: float):
    deadline = time.monotonic() + setup_timeout_s
    while True:  # node 0 profiles its baseline first: its board may come up late
        try:
            return _store(nodes, setup_timeout_s)
        except Exception as e:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise PerfscopeError(f"node 0's tuning board at {nodes.rdzv_endpoint} cannot be reached: {e}") from None
            time.sleep(1.0)


def _next_record(board: Board, k: int, setup_timeout_s: float, job: str | None) -> Trial | Stop:
    """Run ``k``'s record; ``job``: the job token of the records read so far (None before the first)."""
    key = f"trial/{k}"
    try:
        board.store.wait([key], datetime.timedelta(seconds=setup_timeout_s))
        record = board.get(key)
    except BoardError as e:
        raise _board_error(e) from None
    except Exception as e:  # noqa: BLE001 - the board closed: node 0 ended without a stop
        raise PerfscopeError(f"node 0's tuning board went away before run {k} ({str(e).splitlines()[0][:200]}); "
                             "stopping") from None
    if not isinstance(record, (Trial, Stop)) or record.k != k:
        raise _board_error(BoardError(f"{key}: holds {type(record).__name__.lower()} record "
                                      f"{getattr(record, 'k', '')}, not run {k}'s"))
    if job is not None and record.job != job:
        raise _board_error(BoardError(f"{key}: a record of another job (replayed?); refusing it"))
    return record


def _run(nodes: NodeLaunch, nproc_per_node: int, script: str, script_args: tuple[str, ...], record: Trial,
         board: Board):
    """This node's ranks of ``record``'s run, built from this node's own command line."""
    from perfscope.process.group import child_env
    from perfscope.runtime.config import CONFIG_ENV, ConfigError, config_env_of, config_from_dict, save_config
    from perfscope.tuner.procs import stop_trial, trial_command
    from perfscope.tuner.trial import TrialSpec, measure_command

    try:
        config = config_from_dict(record.config)
    except ConfigError as e:
        raise _board_error(BoardError(f"trial/{record.k}: its configuration is not valid: {e}")) from None
    spec = TrialSpec(script=script, script_args=script_args, nproc_per_node=nproc_per_node,
                     warmup_steps=record.warmup_steps, measure_steps=record.measure_steps, target_rse=None,
                     profile_steps=record.profile_steps, seed=record.seed, timeout_s=record.timeout_s)
    with tempfile.TemporaryDirectory(prefix="perfscope-follow-") as tmp:
        config_path = None
        if config.changes():
            config_path = str(save_config(config, Path(tmp) / "config.yaml", only_changes=True))
        records = Path(tmp) / "records"
        records.mkdir()
        command = measure_command(spec, records, config_path, record.profile_steps,
                                  trial_launch_args(nodes, record.k))
        env = child_env(config_env_of(config_path))
        if config_path is None:
            env.pop(CONFIG_ENV, None)  # the baseline runs as the user runs it, as on node 0
        env[NNODES_ENV] = str(nodes.nnodes)
        proc = subprocess.Popen(trial_command(command, True), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return _wait_run(proc, board, record.k, record.timeout_s, nodes.node_rank, record.job)
        finally:
            stop_trial(proc, True)


def follow(nodes: NodeLaunch, nproc_per_node: int, script: str, script_args: tuple[str, ...] = (), *,
           setup_timeout_s: float = 3600.0) -> int:
    """Run this node's ranks of every run node 0 announces; returns 0 once told to stop.

    Args:
        nodes: This node's place in the job (``node_rank`` > 0).
        nproc_per_node: Ranks to start on this node.
        script, script_args: This node's own script (absolute path) and its arguments: every
            command is built from these, never from the board.
        setup_timeout_s: How long to wait for node 0's board, and for each next run (seconds).

    Raises:
        PerfscopeError: no secret where the endpoint is not loopback; node 0's board cannot be
            reached, went away mid-run, or holds a record that is not node 0's (one line).
    """
    host, port = nodes.host_port()
    require_secret(host, nodes.rdzv_endpoint)  # none set off loopback: said now, not after the wait for node 0
    store = _connect(nodes, setup_timeout_s)
    # After connecting: node 0 writes the job's own secret (loopback, none set) before its board listens.
    secret, _ = board_secret(host, port, nodes.rdzv_endpoint, node0=False)
    board = Board(store, secret)
    heartbeat = _Heartbeat(nodes, secret)
    print(f"perfscope: node {nodes.node_rank} of {nodes.nnodes}: following node 0's trials", flush=True)
    try:
        k, job = 0, None
        while True:
            record = _next_record(board, k, setup_timeout_s, job)
            job = record.job
            if isinstance(record, Stop):
                _ack_stop(board, nodes.node_rank)
                print(f"perfscope: node {nodes.node_rank}: {k} run(s) of node 0's done (baseline, trials, "
                      "confirmation rounds); node 0 wrote the results", flush=True)
                return 0
            status = _run(nodes, nproc_per_node, script, script_args, record, board)
            if status == "stopped":
                print(f"perfscope: node {nodes.node_rank}: node 0 stopped during run {k}; node 0 wrote what finished",
                      flush=True)
                return 0
            board.put(f"done/{k}/{nodes.node_rank}", Done(job=job, k=k, node=nodes.node_rank, status=status))
            print(f"perfscope: node {nodes.node_rank}: run {k} ended (exit status {safe(str(status))})", flush=True)
            k += 1
    finally:
        heartbeat.close()
