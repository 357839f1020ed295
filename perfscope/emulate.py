"""An emulated cluster on one Linux machine: nodes as network namespaces, links shaped with ``tc``.

Multi-node behaviour (an all-reduce that crosses a slow link, hierarchical all-reduce, the
tuner's choice between them) can only be shown across nodes. :class:`EmulatedCluster` builds
``N`` "nodes" on one machine (root is needed):

* each node is a network namespace ``<prefix>-<pid>-<net>-n<i>`` with one interface ``eth0``
  (``10.<net>.0.<i + 1>/24``) and its own loopback;
* the nodes' ``eth0`` are veth pairs whose other ends sit on a bridge in a namespace of their
  own (``...-sw``), so the machine's own network namespace is never touched;
* each node's ``eth0`` egress is shaped with ``tc``: the rate by a token bucket (``tbf``), a delay
  by ``netem`` where the kernel has it. Traffic between nodes leaves through the sender's shaped
  egress; traffic inside a node stays on its loopback and is not shaped;
* processes are started inside the node's namespace with ``GLOO_SOCKET_IFNAME=eth0`` (gloo then
  binds every pair to the node's address: peers on the same node reach it through the kernel's
  local route, peers on other nodes across the shaped link) and ``MASTER_ADDR`` node 0's address.

Everything is removed when the ``with`` block ends, also on an error or Ctrl-C: processes started
through :meth:`EmulatedCluster.popen` / :meth:`EmulatedCluster.run` are killed with their process
groups, then the namespaces are deleted (which deletes their interfaces). If the process that
built the cluster is killed outright, a sweeper it started first (in a session of its own, reading
a pipe from it) sees the pipe close and does the same. :func:`remove_stale` removes what was left
otherwise, matching only the names a cluster makes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from perfscope.netns import PREFIX, SWEEPER, ClusterError, ip, kill_namespace_processes, namespaces, remove_stale
from perfscope.units import parse_bandwidth

_RATE_UNITS = ("kbit", "mbit", "gbit")  # what tc reads as bits per second


def parse_rate(text: str) -> float:
    """``"200mbit"`` / ``"1Gbit"`` / ``"64kbit"`` -> bits per second (a rate ``tc`` takes as written).

    Raises:
        ValueError: not a positive number followed by kbit, mbit or gbit.
    """
    try:
        bytes_per_s, unit = parse_bandwidth(text)
    except ValueError:
        unit = None
    if unit != "bit" or not str(text).strip().lower().endswith(tuple(_RATE_UNITS)):
        raise ValueError(f"a link rate is a positive number with kbit, mbit or gbit, e.g. 200mbit; got {text!r}")
    return bytes_per_s * 8


@dataclasses.dataclass(kw_only=True, frozen=True)
class LinkShape:
    """The shaping of each node's link.

    Attributes:
        rate: Egress rate, ``tc`` notation (``"200mbit"``); None: not shaped.
        delay_ms: One-way delay added on egress (milliseconds, >= 0; needs ``sch_netem``).
    """

    rate: str | None = None
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.rate is not None:
            parse_rate(self.rate)
        if not self.delay_ms >= 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms!r}")


class EmulatedCluster:
    """``N`` nodes in network namespaces, their links shaped (module docstring).

    Args:
        nodes: Number of nodes (2..200).
        link: The shaping of every node's link.
        net: The second octet of the nodes' ``10.<net>.0.0/24`` addresses (1..254).

    Attributes:
        names: The node namespaces, node 0 first.
        addresses: Their ``eth0`` addresses.

    Raises:
        ClusterError: from ``__enter__``, when it cannot be built (named reason); nothing is
            left behind.
    """

    def __init__(self, nodes: int, link: LinkShape = LinkShape(), *, net: int = 77) -> None:
        if not 2 <= nodes <= 200:
            raise ValueError(f"nodes must be in 2..200, got {nodes!r}")
        if not 1 <= net <= 254:
            raise ValueError(f"net must be in 1..254, got {net!r}")
        self.link = link
        tag = f"{PREFIX}-{os.getpid()}-{net}"
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-n{i}" for i in range(nodes)]
        self.addresses = [f"10.{net}.0.{i + 1}" for i in range(nodes)]
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []  # the namespaces this cluster created: only these are removed
        self._sweeper: subprocess.Popen | None = None

    # --- building and tearing down -----------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        if os.geteuid() != 0:
            raise ClusterError("an emulated cluster needs root (network namespaces, veth, tc)")
        # Started first, in a session of its own: if this process is killed outright (SIGKILL, the
        # OOM killer), its end of the pipe closes and the sweeper removes the cluster.
        self._sweeper = subprocess.Popen([sys.executable, "-c", SWEEPER], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True, close_fds=True)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        taken = set(namespaces(PREFIX)) & {*self.names, self.switch}
        if taken:
            raise ClusterError(f"namespaces {', '.join(sorted(taken))} exist already (another cluster of this "
                               "process on the same net): pick another net")
        self._add(self.switch)
        ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        ip("link", "set", "br0", "up", netns=self.switch)
        for i, (ns, addr) in enumerate(zip(self.names, self.addresses)):
            self._add(ns)
            ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            ip("link", "set", f"p{i}", "master", "br0", "up", netns=self.switch)
            ip("addr", "add", f"{addr}/24", "dev", "eth0", netns=ns)
            ip("link", "set", "eth0", "up", netns=ns)
            ip("link", "set", "lo", "up", netns=ns)
            self._shape(ns)

    def _add(self, ns: str) -> None:
        ip("netns", "add", ns)
        self._made.append(ns)
        if self._sweeper is not None:  # only what this cluster made is the sweeper's to delete
            self._sweeper.stdin.write(f"{ns}\n".encode())
            self._sweeper.stdin.flush()

    def _shape(self, ns: str) -> None:
        if self.link.rate is not None:
            # A token bucket: the rate, a bucket of 1 ms of traffic (at least two full frames) so
            # that bursts stay short, and up to 100 ms of queue before packets are dropped.
            burst = max(2 * 1514, int(parse_rate(self.link.rate) / 8 / 1000))
            self._tc(ns, ["root", "handle", "1:"], "tbf", "rate", self.link.rate, "burst", str(burst),
                     "latency", "100ms")
        if self.link.delay_ms:
            where = ["parent", "1:1", "handle", "10:"] if self.link.rate is not None else ["root", "handle", "1:"]
            self._tc(ns, where, "netem", "delay", f"{self.link.delay_ms}ms")

    @staticmethod
    def _tc(ns: str, where: list[str], kind: str, *args: str) -> None:
        cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", *where, kind, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            why = proc.stderr.strip() or f"exit {proc.returncode}"
            if "unknown" in why.lower():
                why += f" (this kernel has no '{kind}' queueing discipline)"
            raise ClusterError(f"tc {kind} in {ns}: {why}")

    def close(self) -> None:
        """Kill every process started in the cluster, then delete its namespaces (idempotent)."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        existing = set(namespaces(PREFIX))
        for ns in self._made:
            if ns in existing:
                kill_namespace_processes(ns)
                ip("netns", "del", ns, check=False)
        self._made.clear()
        if self._sweeper is not None:  # removed here: the sweeper has nothing left to do
            try:
                self._sweeper.communicate(b"done\n", timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                self._sweeper.kill()
                self._sweeper.wait()
            self._sweeper = None

    # --- running in it ------------------------------------------------------------------------

    def tcp_throughput(self, sender: int, receiver: int, nbytes: int, *, port: int = 29555,
                       timeout_s: float = 300.0) -> float:
        """Bytes per second one TCP stream carried from node ``sender`` to node ``receiver``
        (``nbytes`` sent; timed at the receiver from its first byte), as iperf measures a link.

        Raises:
            ClusterError: the receiver did not start or report, or the sender failed.
        """
        import sys

        rx = self.popen(receiver, [sys.executable, "-c", _RECEIVER, str(port)], stdout=subprocess.PIPE, text=True)
        try:
            if rx.stdout.readline().strip() != "ready":
                raise ClusterError(f"node {receiver}: the throughput receiver did not start")
            tx = self.popen(sender, [sys.executable, "-c", _SENDER, self.addresses[receiver], str(port), str(nbytes)])
            if tx.wait(timeout=timeout_s) != 0:
                raise ClusterError(f"node {sender}: the throughput sender failed (exit {tx.returncode})")
            line = rx.stdout.readline().strip()
            rx.wait(timeout=30)
            return float(line)
        except (subprocess.TimeoutExpired, ValueError) as e:
            raise ClusterError(f"nodes {sender} -> {receiver}: no throughput measured ({e})") from None

    def env(self, node: int, base: dict | None = None) -> dict[str, str]:
        """The environment of a process on ``node``: gloo bound to ``eth0``, node 0 as master."""
        env = dict(os.environ if base is None else base)
        env.update(GLOO_SOCKET_IFNAME="eth0", MASTER_ADDR=self.addresses[0])
        return env

    def popen(self, node: int, cmd: Sequence[str], *, env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside ``node``'s namespace, in its own process group (killed by
        :meth:`close`); keyword arguments go to ``subprocess.Popen``."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[node], *cmd], env=self.env(node, env),
                                start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, cmds: Sequence[Sequence[str]], *, timeout_s: float = 300.0, env: dict | None = None,
            **kwargs) -> list[subprocess.CompletedProcess]:
        """Run one command per node (``cmds[i]`` on node ``i``) at once and wait for all.

        Returns:
            Each node's completed process (stdout and stderr captured as text).

        Raises:
            ClusterError: a command ran past ``timeout_s`` (all are killed).
        """
        # Each node's output goes to a file, not a pipe: a node blocked on a full pipe while another
        # waits for it (ranks in a collective) would hang them all.
        import tempfile

        with tempfile.TemporaryDirectory(prefix="perfscope-emulate-") as tmp:
            files = [(open(f"{tmp}/{i}.out", "w+"), open(f"{tmp}/{i}.err", "w+")) for i in range(len(cmds))]
            try:
                procs = [self.popen(i, cmd, env=env, stdout=out, stderr=err, text=True, **kwargs)
                         for i, (cmd, (out, err)) in enumerate(zip(cmds, files))]
                self._wait_all(procs, cmds, timeout_s)
                results = []
                for proc, (out, err) in zip(procs, files):
                    out.seek(0)
                    err.seek(0)
                    results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))
            finally:
                for out, err in files:
                    out.close()
                    err.close()
        return results

    def _wait_all(self, procs: list[subprocess.Popen], cmds: Sequence[Sequence[str]], timeout_s: float) -> None:
        """Wait for every node's command, within one deadline.

        Raises:
            ClusterError: one ran past ``timeout_s`` (the cluster and all its processes are removed).
        """
        deadline = time.monotonic() + timeout_s
        for i, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.close()
                raise ClusterError(f"node {i}: {' '.join(cmds[i])[:120]} ran past {timeout_s:g} s") from None

    def stream(self, cmds: Sequence[Sequence[str]], *, timeout_s: float = 300.0, env: dict | None = None,
               out=None, err=None) -> list[int]:
        """Run one command per node (``cmds[i]`` on node ``i``) at once, copying each node's output
        to ``out`` / ``err`` (default: this process's) as it comes, each line after ``[node i] ``.

        Returns:
            Each node's exit status.

        Raises:
            ClusterError: a command ran past ``timeout_s`` (all are killed).
        """
        import sys
        import threading

        out, err = out or sys.stdout, err or sys.stderr
        lock = threading.Lock()
        procs = [self.popen(i, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for i, cmd in enumerate(cmds)]
        relays = [threading.Thread(target=_relay, args=(pipe, f"[node {i}] ", sink, lock), daemon=True)
                  for i, p in enumerate(procs) for pipe, sink in ((p.stdout, out), (p.stderr, err))]
        for t in relays:
            t.start()
        self._wait_all(procs, cmds, timeout_s)
        for t in relays:  # the pipes close when the nodes' processes (and their children) are gone
            t.join(timeout=10)
        return [proc.returncode for proc in procs]


def _relay(stream, prefix: str, sink, lock) -> None:
    """Copy ``stream``'s lines to ``sink`` as they come, each after ``prefix`` (one writer at a time)."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            print(f"{prefix}{line}", file=sink, flush=True)
    stream.close()


# The two ends of EmulatedCluster.tcp_throughput, run inside the nodes.
_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n / (time.perf_counter() - t0), flush=True)
"""
_SENDER = """
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); break
    except OSError:
        time.sleep(0.05)
s.sendall(b"x" * int(sys.argv[3])); s.close()
"""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m perfscope.emulate --nodes N [--rate R] -- COMMAND ...``: build the cluster, run
    COMMAND once on every node at once (``{node}`` and ``{master}`` in it replaced by the node's
    index and node 0's address), print each node's output as it comes (``[node i]`` before each
    line), remove the cluster. Exit status: the
    first non-zero one of the nodes', 0 if all succeeded, 2 on bad usage or a cluster that cannot
    be built (one line on stderr)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m perfscope.emulate",
                                description="Run a command on every node of an emulated cluster (needs root).")
    p.add_argument("--nodes", type=int, default=2, help="nodes (default 2)")
    p.add_argument("--rate", default=None, help="each node's link rate, e.g. 200mbit, 1gbit (default: not shaped)")
    p.add_argument("--net", type=int, default=77, help="second octet of the nodes' 10.NET.0.0/24 (default 77)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before every node is stopped (default 3600)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS ({node}, {master} are filled in)")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command: give it after --")
    if not (0 < a.timeout < 1e7):  # NaN fails too
        p.error(f"--timeout must be a number of seconds above 0 and below 10,000,000, got {a.timeout}")
    remove_stale()

    def ended(signum, frame):  # SIGTERM, SIGHUP: leave through the with block, which removes the cluster
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ended)
    try:
        with EmulatedCluster(a.nodes, LinkShape(rate=a.rate), net=a.net) as cluster:
            cmds = [[part.replace("{node}", str(i)).replace("{master}", cluster.addresses[0]) for part in command]
                    for i in range(a.nodes)]
            statuses = cluster.stream(cmds, timeout_s=a.timeout)  # each node's lines as they come
    except (ClusterError, ValueError) as exc:
        print(f"perfscope.emulate: error: {str(exc).splitlines()[0] if str(exc) else exc!r}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("perfscope.emulate: interrupted; the cluster and its processes were removed", file=sys.stderr)
        return 130
    status = next((code for code in statuses if code), 0)
    return 128 - status if status < 0 else status  # killed by a signal: as a shell reports it


if __name__ == "__main__":
    raise SystemExit(main())
