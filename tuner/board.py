"""What crosses the multi-node tuning board: typed records, validated when read, signed.

The board (:mod:`perfscope.tuner.nodes`) is a ``torch.distributed.TCPStore`` that any process able to reach
its port can read and write. It therefore carries *data only*: a follower builds every command
from its own command line, and takes from the board a trial's number, its step counts, seed,
timeout and configuration (the knobs' values, validated by the configuration's own schema).
Nothing read from it is run, evaluated or parsed as anything but these records.

Each value is ``v1.<mac>.<json>``: ``<mac>`` the HMAC-SHA256 (RFC 2104) of the store key and the
JSON under the job's shared secret, or ``-`` where none is set. The key is inside the MAC, so a
signed record cannot be moved to another key. A secret is required whenever the endpoint is not
a loopback address (:func:`require_secret`); on loopback, unsigned records are accepted and
still validated.

The secret comes from ``$PERFSCOPE_BOARD_SECRET``, else from the file named by
``$PERFSCOPE_BOARD_SECRET_FILE``, which must belong to the user and be readable by nobody else
(the check ssh makes of a private key). Where neither is set and the board is on loopback, node 0
makes a secret for the job (:func:`write_job_secret`) in a file only the user can read, and the
followers, on the same machine as the same user, read it (:func:`read_job_secret`): records are
signed whatever the user sets, so another local user cannot forge a trial.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Annotated, Literal, Union

import msgspec

from perfscope.errors import PerfscopeError

SECRET_ENV = "PERFSCOPE_BOARD_SECRET"
SECRET_FILE_ENV = "PERFSCOPE_BOARD_SECRET_FILE"
MIN_SECRET_BYTES = 16  # 128 bits: below that a secret can be guessed
MAX_RECORD_BYTES = 1 << 20  # a trial record is a few hundred bytes; anything this large is not ours
VERSION = b"v1"

_Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
_Node = Annotated[int, msgspec.Meta(ge=1, le=4095)]


class NodeLost(PerfscopeError):
    """A follower stopped sending heartbeats: its ranks cannot join another run."""


class BoardError(PerfscopeError):
    """A record on the board that is not node 0's (or a follower's): unsigned, mis-signed, or not
    a record of this schema."""


# A configuration's values are scalars (perfscope.runtime.config.AccelConfig): nothing nested.
_Scalar = Union[None, bool, int, float, Annotated[str, msgspec.Meta(max_length=256)]]
_Job = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]


class Trial(msgspec.Struct, tag="trial", forbid_unknown_fields=True, frozen=True):
    """Node 0's announcement of run ``k`` (a baseline, trial or confirmation round).

    Attributes:
        job: Node 0's random token for this job: a follower keeps the first it reads and refuses
            records of another (a signed record of an earlier job replayed into this one).
        k: The run's number on the board (0, 1, ...); its rendezvous port follows from it.
        config: The configuration's changes from the defaults (validated by
            :func:`perfscope.runtime.config.config_from_dict` where it is used).
        warmup_steps, measure_steps, profile_steps: The measurement's step counts.
        seed: Seed of Python, NumPy and torch.
        timeout_s: Wall-clock limit of the run (seconds).
    """

    job: _Job
    k: _Count
    config: Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)], _Scalar], msgspec.Meta(max_length=64)]
    warmup_steps: _Count
    measure_steps: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    profile_steps: _Count
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400.0)]


class Stop(msgspec.Struct, tag="stop", forbid_unknown_fields=True, frozen=True):
    """Node 0: there is no run ``k`` or later (``job`` as in :class:`Trial`)."""

    job: _Job
    k: _Count


class Done(msgspec.Struct, tag="done", forbid_unknown_fields=True, frozen=True):
    """A follower: its ranks of run ``k`` of job ``job`` ended with ``status`` (an exit status or
    ``timeout``)."""

    job: _Job
    k: _Count
    node: _Node
    status: Union[int, Literal["timeout"]]


class Stopped(msgspec.Struct, tag="stopped", forbid_unknown_fields=True, frozen=True):
    """A follower has read node 0's stop."""

    node: _Node


class Alive(msgspec.Struct, tag="alive", forbid_unknown_fields=True, frozen=True):
    """A follower's heartbeat: ``beat`` grows by one every :data:`perfscope.tuner.nodes.HEARTBEAT_S`."""

    node: _Node
    beat: Annotated[int, msgspec.Meta(ge=0)]


Record = Union[Trial, Stop, Done, Stopped, Alive]
_decoder = msgspec.json.Decoder(Record)


def _mac(secret: bytes, key: str, body: bytes) -> str:
    return hmac.new(secret, key.encode() + b"\0" + body, hashlib.sha256).hexdigest()


def encode(record: Record, key: str, secret: bytes | None) -> bytes:
    """The store value of ``record`` under ``key`` (signed when ``secret`` is given)."""
    body = msgspec.json.encode(record)
    return b".".join((VERSION, (_mac(secret, key, body) if secret else "-").encode(), body))


def _check_signature(key: str, mac: bytes, body: bytes, secret: bytes | None) -> None:
    """Refuse a signed record without a secret here, and an unsigned or wrongly signed one with it.

    Raises:
        BoardError: naming which.
    """
    if secret is None and mac != b"-":
        raise BoardError(f"{key}: signed, but this node has no secret: set ${SECRET_ENV} (or ${SECRET_FILE_ENV}) "
                         "to the job's secret on every node")
    if secret is not None and (mac == b"-" or not hmac.compare_digest(mac, _mac(secret, key, body).encode())):
        raise BoardError(f"{key}: {'unsigned' if mac == b'-' else 'signed with another secret'}; refusing it "
                         "(is another process serving the board's port?)")


def decode(raw: bytes, key: str, secret: bytes | None) -> Record:
    """The record stored under ``key``, checked.

    Raises:
        BoardError: too large, not of this format, unsigned where ``secret`` is set, signed where
            it is not, a MAC that does not match, or a record of another schema.
    """
    if len(raw) > MAX_RECORD_BYTES:
        raise BoardError(f"{key}: a value of {len(raw):,} bytes, not a record of perfscope's")
    version, _, rest = raw.partition(b".")
    mac, _, body = rest.partition(b".")
    if version != VERSION or not mac:
        raise BoardError(f"{key}: not a record of perfscope's tuning board")
    _check_signature(key, mac, body, secret)
    try:
        return _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as e:
        raise BoardError(f"{key}: not a record of perfscope's tuning board ({str(e)[:200]})") from None


def load_secret(environ=None) -> bytes | None:
    """The job's shared secret: ``$PERFSCOPE_BOARD_SECRET``, else the contents of
    ``$PERFSCOPE_BOARD_SECRET_FILE`` (surrounding whitespace dropped), else None.

    Raises:
        PerfscopeError: a secret shorter than :data:`MIN_SECRET_BYTES`; a file that cannot be
            read, is not a regular file, is not the user's, or can be read or written by others.
    """
    env = os.environ if environ is None else environ
    text = env.get(SECRET_ENV)
    if text:
        return _checked(text.strip().encode(), f"${SECRET_ENV}")
    if env.get(SECRET_FILE_ENV):
        path = env[SECRET_FILE_ENV]
        return _read_secret_file(path, f"${SECRET_FILE_ENV} ({path})")
    return None


def _checked(secret: bytes, where: str) -> bytes:
    if len(secret) < MIN_SECRET_BYTES:
        raise PerfscopeError(f"{where}: the secret must be at least {MIN_SECRET_BYTES} bytes "
                             "(e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return secret


def _read_secret_file(path: str | os.PathLike, where: str) -> bytes:
    """A secret file's contents, if it is a regular file of this user's that nobody else may
    read or write (not followed where it is a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise PerfscopeError(f"{where}: cannot be read: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PerfscopeError(f"{where}: not a regular file")
        if info.st_uid != os.geteuid():
            raise PerfscopeError(f"{where}: belongs to uid {info.st_uid}, not to this user; not used")
        if info.st_mode & 0o077:
            raise PerfscopeError(f"{where}: others may read or write it (mode {stat.S_IMODE(info.st_mode):o}); "
                                 f"chmod 600 it")
        secret = os.read(fd, MAX_RECORD_BYTES).strip()
    finally:
        os.close(fd)
    return _checked(secret, where)


def job_secret_path(port: int, environ=None) -> Path:
    """Where node 0 keeps the secret it made for the loopback board on ``port``:
    ``$XDG_RUNTIME_DIR/perfscope/boards/PORT.secret`` (the user's private runtime folder, as the
    XDG Base Directory specification defines it), else ``~/.cache/perfscope/boards/PORT.secret``."""
    env = os.environ if environ is None else environ
    base = Path(env["XDG_RUNTIME_DIR"]) if env.get("XDG_RUNTIME_DIR") else Path.home() / ".cache"
    return base / "perfscope" / "boards" / f"{port}.secret"


def write_job_secret(port: int, environ=None) -> tuple[bytes, Path]:
    """Make a fresh secret for this job's loopback board and write it where the followers of
    this machine read it (:func:`job_secret_path`): a file of mode 600 in a folder of mode 700,
    both this user's, replaced atomically (an earlier job's file on the same port is replaced).

    Returns:
        The secret (64 hexadecimal digits: 256 bits) and the file's path.

    Raises:
        PerfscopeError: the folder cannot be made, or is not this user's private folder.
    """
    path = job_secret_path(port, environ)
    folder = path.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise PerfscopeError(f"cannot keep the tuning board's secret in {folder}: not a folder of this user's")
        if info.st_mode & 0o077:
            os.chmod(folder, 0o700)
        secret = secrets.token_hex(32).encode()
        tmp = folder / f".{port}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secret + b"\n")
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        raise PerfscopeError(f"cannot write the tuning board's secret to {path}: {e.strerror or e}") from None
    return secret, path


def remove_job_secret(path: Path | None, secret: bytes) -> None:
    """Remove the file :func:`write_job_secret` made, unless it now holds a later job's secret
    (another node 0 on the same port) or is gone; ``path`` None: nothing was made."""
    if path is None:
        return
    try:
        if path.read_bytes().strip() == secret:
            path.unlink()
    except OSError:  # already gone: nothing of ours is left
        pass


def read_job_secret(port: int, endpoint: str, environ=None) -> bytes:
    """The secret node 0 made for the loopback board on ``port`` (:func:`write_job_secret`).

    Raises:
        PerfscopeError: there is none (node 0 runs as another user, or with another
            ``$XDG_RUNTIME_DIR`` or home), or it is not a private file of this user's.
    """
    path = job_secret_path(port, environ)
    if not os.path.lexists(path):
        raise PerfscopeError(f"no secret for the tuning board at {endpoint}: node 0 writes one to {path} when it "
                             f"starts; run every node as the same user on this machine, or set the same "
                             f"${SECRET_ENV} on every node")
    return _read_secret_file(path, f"node 0's secret for this job ({path})")


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (127.0.0.0/8, ::1); a name
    that does not resolve is not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def require_secret(host: str, endpoint: str, environ=None) -> bytes | None:
    """The secret (:func:`load_secret`), required where the board is reachable from other machines.

    Raises:
        PerfscopeError: none is set and ``host`` is not a loopback address.
    """
    secret = load_secret(environ)
    if secret is None and not is_loopback(host):
        raise PerfscopeError(f"the tuning board at {endpoint} is reachable from other machines: set the same secret "
                             f"on every node in ${SECRET_ENV}, or in a file of mode 600 named by ${SECRET_FILE_ENV} "
                             "(docs/multinode.md)")
    return secret


def board_secret(host: str, port: int, endpoint: str, *, node0: bool, environ=None) -> tuple[bytes, Path | None]:
    """The secret this node signs and checks the board's records with: the one the user set
    (:func:`require_secret`), else, on loopback, the job's own -- made by node 0
    (:func:`write_job_secret`), read by the followers (:func:`read_job_secret`).

    Returns:
        The secret, and the path of the file node 0 made (None where it made none).

    Raises:
        PerfscopeError: as :func:`require_secret`, :func:`write_job_secret` and :func:`read_job_secret`.
    """
    secret = require_secret(host, endpoint, environ)
    if secret is not None:
        return secret, None
    if node0:
        return write_job_secret(port, environ)
    return read_job_secret(port, endpoint, environ), None
