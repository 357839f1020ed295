"""The multi-node tuning board carries data, never commands: records are typed, validated and
(with a secret) signed; the board listens on the endpoint's address only; node 0 notices a
follower that went away. The attacks are run as they were found: a real ``TCPStore`` client
writing into the board of a live follower on loopback."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfscope.collect.nodes import NodeLaunch
from perfscope.errors import PerfscopeError
from perfscope.tuner import board as wire
from perfscope.tuner import nodes
from conftest import HANG_TIMEOUT_S  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "measure_loop.py"
SECRET = "s3cret-of-this-job-0123456789abcdef"


def free_endpoint() -> str:
    """``127.0.0.1:PORT`` with the board's 50 ports above it inside the port range."""
    port = 65535
    while port > 65535 - nodes.TRIAL_PORTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


JOB = "0123456789abcdef" * 2


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path, monkeypatch):
    """Node 0 (this process) and its followers (children) keep the job's secret here."""
    folder = tmp_path / "run"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    for key in (wire.SECRET_ENV, wire.SECRET_FILE_ENV):
        monkeypatch.delenv(key, raising=False)
    return folder


def job_secret(endpoint: str) -> bytes:
    """The secret node 0 made for the loopback board at ``endpoint``."""
    return wire.read_job_secret(int(endpoint.rpartition(":")[2]), endpoint)


def trial(k=0, **changes) -> wire.Trial:
    fields = dict(job=JOB, k=k, config={}, warmup_steps=1, measure_steps=2, profile_steps=0, seed=0, timeout_s=60.0)
    return wire.Trial(**{**fields, **changes})


# -- records ------------------------------------------------------------------------------------


def test_a_signed_record_reads_back_and_cannot_be_moved_or_altered():
    secret = SECRET.encode()
    raw = wire.encode(trial(3), "trial/3", secret)
    assert wire.decode(raw, "trial/3", secret) == trial(3)
    with pytest.raises(wire.BoardError, match="signed with another secret"):
        wire.decode(raw, "trial/4", secret)  # the key is inside the MAC
    with pytest.raises(wire.BoardError, match="signed with another secret"):
        wire.decode(raw.replace(b'"seed":0', b'"seed":1'), "trial/3", secret)
    with pytest.raises(wire.BoardError, match="signed with another secret"):
        wire.decode(raw, "trial/3", b"another-secret-0123456789")
    with pytest.raises(wire.BoardError, match="unsigned"):
        wire.decode(wire.encode(trial(3), "trial/3", None), "trial/3", secret)
    with pytest.raises(wire.BoardError, match="this node has no secret"):
        wire.decode(raw, "trial/3", None)


@pytest.mark.parametrize("raw", [
    b'{"own": ["--no-python", "sh", "-c", "id"], "launch": ["--standalone"]}',  # the old format
    b'v1.-.{"type":"trial","k":0,"own":["sh"],"config":{},"warmup_steps":1,"measure_steps":1,'
    b'"profile_steps":0,"seed":0,"timeout_s":1}',  # a field of no record
    b'v1.-.{"type":"trial","k":-1,"config":{},"warmup_steps":1,"measure_steps":1,"profile_steps":0,'
    b'"seed":0,"timeout_s":1}',  # out of range
    b'v1.-.{"type":"exec","argv":["sh"]}',
    b"v1.-." + b" " * (wire.MAX_RECORD_BYTES + 1),
    b'v1.-.{"type":"trial","job":"' + JOB.encode() + b'","k":0,"config":{"a":' + b"[" * 3000 + b"]" * 3000
    + b'},"warmup_steps":1,"measure_steps":1,"profile_steps":0,"seed":0,"timeout_s":1}',  # RecursionError before
    b'v1.-.{"type":"trial","job":"' + JOB.encode() + b'","k":0,"config":{"num_workers":{"x":1}},'
    b'"warmup_steps":1,"measure_steps":1,"profile_steps":0,"seed":0,"timeout_s":1}',  # a value not a scalar
    b'v1.-.{"type":"alive","node":1,"beat":' + b"[" * 5000 + b"]" * 5000 + b"}",
], ids=["old-format", "extra-field", "negative", "other-type", "oversized", "deep-config", "nested-value",
        "deep-alive"])
def test_what_is_not_a_record_of_the_schema_is_refused(raw):
    with pytest.raises(wire.BoardError):
        wire.decode(raw, "trial/0", None)


def test_the_secret_file_must_be_the_users_and_private(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    assert wire.load_secret({wire.SECRET_FILE_ENV: str(path)}) == SECRET.encode()
    path.chmod(0o640)
    with pytest.raises(PerfscopeError, match="others may read or write it"):
        wire.load_secret({wire.SECRET_FILE_ENV: str(path)})
    path.chmod(0o600)
    if os.geteuid() == 0:  # a file another user planted
        os.chown(path, 65534, 65534)
        with pytest.raises(PerfscopeError, match="belongs to uid 65534"):
            wire.load_secret({wire.SECRET_FILE_ENV: str(path)})
    with pytest.raises(PerfscopeError, match="at least 16 bytes"):
        wire.load_secret({wire.SECRET_ENV: "short"})
    assert wire.load_secret({}) is None


def test_a_secret_is_required_where_the_endpoint_is_not_loopback():
    assert wire.require_secret("127.0.0.1", "127.0.0.1:1", {}) is None
    assert wire.require_secret("::1", "[::1]:1", {}) is None
    with pytest.raises(PerfscopeError, match="reachable from other machines: set the same secret"):
        wire.require_secret("10.1.2.3", "10.1.2.3:29500", {})
    assert wire.require_secret("10.1.2.3", "10.1.2.3:29500", {wire.SECRET_ENV: SECRET}) == SECRET.encode()


def test_the_board_listens_on_the_endpoints_address_only():
    endpoint = free_endpoint()
    board = nodes.TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint), 1)
    port = int(endpoint.rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    with pytest.raises(ConnectionRefusedError):  # another address of this machine: nothing listens
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
    del board


# -- a live follower, attacked through the store ------------------------------------------------


def _attacker(endpoint: str):
    from torch.distributed import TCPStore

    host, _, port = endpoint.rpartition(":")
    return TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=10))


def _follower(endpoint: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", "tune", str(SCRIPT), "--nnodes", "2", "--node-rank", "1",
                             "--rdzv-endpoint", endpoint, "--nproc-per-node", "1", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    assert "following node 0's trials" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def _kill(follower: subprocess.Popen) -> None:
    """The follower and what it started, gone (a no-op once it ended)."""
    if follower.poll() is None:
        os.killpg(follower.pid, signal.SIGKILL)
        follower.wait()


@pytest.mark.parametrize("secret", [None, SECRET], ids=["loopback-no-secret", "secret"])
def test_a_command_written_into_the_board_is_never_run(tmp_path, monkeypatch, secret):
    for key in (wire.SECRET_ENV, wire.SECRET_FILE_ENV):
        monkeypatch.delenv(key, raising=False)
    if secret:  # node 0 (this process) and the follower alike
        monkeypatch.setenv(wire.SECRET_ENV, secret)
    endpoint = free_endpoint()
    board = nodes.TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint), 1)
    follower = _follower(endpoint)
    planted = tmp_path / "planted"
    try:
        store = _attacker(endpoint)
        if secret is None:  # what ran as root before: the follower's command taken from the board
            store.set("trial/0", f'{{"own": ["--no-python", "sh", "-c", "id > {planted}"], "launch": '
                                 '["--standalone"], "config": null, "timeout_s": 30}')
        else:  # a record of the right shape, unsigned
            store.set("trial/0", wire.encode(trial(0), "trial/0", None))
        out, err = follower.communicate(timeout=HANG_TIMEOUT_S)
    finally:
        _kill(follower)
    assert follower.returncode != 0
    assert not planted.exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "node 0's tuning board: trial/0" in lines[0], err
    assert ("not a record of perfscope's" if secret is None else "unsigned; refusing it") in lines[0]
    assert "Traceback" not in err
    del board


def test_a_configuration_that_is_not_of_the_schema_is_refused_by_the_follower(tmp_path):
    endpoint = free_endpoint()
    board = nodes.TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint), 1)
    follower = _follower(endpoint)
    try:
        signed = wire.encode(trial(0, config={"script": "evil.py"}), "trial/0", job_secret(endpoint))
        _attacker(endpoint).set("trial/0", signed)  # one who can read the secret: the schema still holds
        _, err = follower.communicate(timeout=HANG_TIMEOUT_S)
    finally:
        _kill(follower)
    assert follower.returncode != 0
    assert "its configuration is not valid: unknown config key(s) 'script'" in err, err
    del board


def test_node_0_notices_a_follower_that_went_away_within_seconds(monkeypatch):
    monkeypatch.setattr(nodes, "LOST_AFTER_S", 3.0)
    endpoint = free_endpoint()
    board = nodes.TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint), 1)
    follower = _follower(endpoint)
    try:
        deadline = time.monotonic() + 60
        while not board._beats and time.monotonic() < deadline:  # its first heartbeat
            assert board.lost() is None
            time.sleep(0.2)
        assert board._beats, "no heartbeat from the follower"
    finally:
        _kill(follower)
    killed = time.monotonic()
    line = None
    while line is None and time.monotonic() - killed < 60:
        line = board.lost()
        time.sleep(0.2)
    assert line is not None and line.startswith("node 1 stopped sending heartbeats"), line
    late = board.finished(0)  # no waiting for a gone node's end of the run
    assert late and late[0].startswith("node 1 stopped sending heartbeats")


class _LostBoard:
    """Node 0's board as run_trial sees it, with node 1 gone."""

    nodes = NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29400")

    def announce(self, config, **counts):
        return 0

    def launch_args(self, k):
        return ["--standalone"]

    def lost(self):
        return "node 1 stopped sending heartbeats 11 s ago (gone or cut off)"

    def finished(self, k):
        return []


def test_a_trial_stops_at_once_when_a_node_is_lost(tmp_path):
    from perfscope.tuner.trial import TrialSpec, run_trial

    spec = TrialSpec(script=str(SCRIPT), script_args=("--steps", "100000"), nproc_per_node=1, timeout_s=600.0,
                     board=_LostBoard())
    with pytest.raises(nodes.NodeLost, match="node 1 stopped sending heartbeats.*run the same command on every node"):
        run_trial(spec, None, tmp_path / "t")  # stopped by the lost node, not by the 600 s timeout


def test_a_replayed_record_of_another_job_and_a_forged_report_are_refused(monkeypatch):
    endpoint = free_endpoint()
    board = nodes.TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint), 1)
    attacker = _attacker(endpoint)
    # garbage where node 1's report of run 0 belongs: node 0 keeps waiting for a real one
    attacker.set("done/0/1", b"v1.-." + b"[" * 5000)
    monkeypatch.setattr(nodes, "FOLLOWER_WAIT_S", 1.0)
    assert board.finished(0) == ["node 1 did not report the end of run 0 within 1 s"]
    attacker.set("alive/1", b"v1.-." + b"[" * 5000)
    assert board.lost() is None  # a broken heartbeat is no heartbeat, not a crash
    # a follower that read this job's run 0 refuses run 1 of another job (a replay)
    follower = _follower(endpoint)
    try:
        board.announce({}, warmup_steps=1, measure_steps=1, profile_steps=0, seed=0, timeout_s=1.0)
        attacker.set("trial/1", wire.encode(trial(1, job="f" * 32), "trial/1", job_secret(endpoint)))
        _, err = follower.communicate(timeout=HANG_TIMEOUT_S)
    finally:
        _kill(follower)
    assert "trial/1: a record of another job (replayed?); refusing it" in err, err
    del board


# -- the job's own secret on loopback -----------------------------------------------------------


def test_with_no_secret_set_a_forged_trial_on_loopback_is_refused(tmp_path):
    endpoint = free_endpoint()
    board = nodes.TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint), 1)
    follower = _follower(endpoint)
    try:  # another local user: a record of the right shape and job, unsigned
        _attacker(endpoint).set("trial/0", wire.encode(trial(0, job=board.job), "trial/0", None))
        _, err = follower.communicate(timeout=HANG_TIMEOUT_S)
    finally:
        _kill(follower)
    assert follower.returncode != 0
    assert err.strip().splitlines() == ["perfscope: error: node 0's tuning board: trial/0: unsigned; refusing it "
                                        "(is another process serving the board's port?)"], err
    board.stop()


def test_node_0_makes_a_private_secret_for_the_job_and_removes_it_at_the_end(private_runtime_dir):
    endpoint = free_endpoint()
    port = int(endpoint.rpartition(":")[2])
    path = wire.job_secret_path(port)
    path.parent.mkdir(parents=True)
    path.write_text("an earlier job's secret, left by a node 0 that was killed\n")
    board = nodes.TrialBoard(NodeLaunch(nnodes=1, node_rank=0, rdzv_endpoint=endpoint), 1)
    assert path.parent == private_runtime_dir / "perfscope" / "boards"
    assert oct(path.stat().st_mode & 0o777) == oct(0o600) and oct(path.parent.stat().st_mode & 0o777) == oct(0o700)
    secret = path.read_bytes().strip()
    assert len(secret) == 64 and secret == board._board.secret  # fresh: 256 bits, replacing the earlier one
    assert job_secret(endpoint) == secret
    board.stop()
    assert not path.exists()


def test_a_follower_without_the_jobs_secret_says_so(tmp_path):
    endpoint = free_endpoint()
    port = int(endpoint.rpartition(":")[2])
    with pytest.raises(PerfscopeError, match=r"no secret for the tuning board at 127\.0\.0\.1:\d+: node 0 writes one"):
        wire.board_secret("127.0.0.1", port, endpoint, node0=False)
    path = wire.job_secret_path(port)
    path.parent.mkdir(parents=True)
    path.write_text("x" * 64)
    path.chmod(0o644)  # another user could have read it, or written it
    with pytest.raises(PerfscopeError, match="others may read or write it"):
        wire.board_secret("127.0.0.1", port, endpoint, node0=False)
    assert wire.board_secret("10.1.2.3", port, "10.1.2.3:1", node0=True, environ={wire.SECRET_ENV: SECRET}) == (
        SECRET.encode(), None)  # one the user set wins, and no file is made
