"""A throwaway PostgreSQL server for the tests (the ``postgres_url`` fixture in conftest.py).

The server binaries come from Debian's ``postgresql`` package (``/usr/lib/postgresql/*/bin``, the
newest version found; ``.ci/run`` installs the package when they are missing) or, on other
systems, from ``initdb``/``pg_ctl`` on ``PATH``. No system cluster is used: :func:`server` runs
``initdb`` into a temporary folder, starts the server with ``pg_ctl`` on a free loopback port
(``listen_addresses=127.0.0.1``, its Unix socket in the temporary folder, durability off since
nothing is kept), creates a user with a password (allowed to create more databases) and a database
it owns, yields
``postgresql://USER:PASS@127.0.0.1:PORT/DB``, then stops the server and removes the folder.
:func:`socket_url` gives the same server through its Unix socket, for clients in a network
namespace of their own (an emulated node), whose loopback is not the machine's.

PostgreSQL refuses to run as root; as root the server runs as the ``postgres`` system user (made
by the Debian package) through ``runuser`` (or ``su``), and the folder is given to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

SERVER_USER = "postgres"  # the system user the server runs as when the tests run as root
SUPERUSER = "postgres"  # the cluster's superuser (reached over the socket, trusted)
DB_USER = "perfscope"
DB_NAME = "perfscope"
START_TIMEOUT_S = 60
_SOCKETS: dict[str, str] = {}  # a running server's URL -> the same server's Unix-socket URL


class PostgresUnavailable(Exception):
    """The server cannot be run here (no binaries, no user to run it as)."""


def in_ci() -> bool:
    """The project's rule: under CI a test that needs a service fails instead of skipping."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.parent.name  # /usr/lib/postgresql/<version>/bin/initdb
    return tuple(int(part) for part in re.findall(r"\d+", version)) or (0,)


def find_bin_dir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``psql``.

    Raises:
        PostgresUnavailable: none found.
    """
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    candidates = [Path(p).parent for p in reversed(found)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for folder in candidates:
        if all((folder / tool).is_file() for tool in ("initdb", "pg_ctl", "psql")):
            return folder
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (looked for /usr/lib/postgresql/*/bin/initdb and initdb on "
        "PATH); install Debian's `postgresql` package to run the PostgreSQL tests"
    )


def _run_as() -> list[str]:
    """The command prefix that runs the server's tools as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresUnavailable(
            f"running as root and there is no `{SERVER_USER}` user to run the PostgreSQL server as "
            "(Debian's `postgresql` package creates it)"
        ) from None
    if shutil.which("runuser"):
        return ["runuser", "-u", SERVER_USER, "--"]
    if shutil.which("setpriv"):
        user = pwd.getpwnam(SERVER_USER)
        return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--"]
    raise PostgresUnavailable("running as root and neither `runuser` nor `setpriv` is installed")


def check_available() -> None:
    """Raise :class:`PostgresUnavailable` when :func:`server` cannot run here."""
    find_bin_dir()
    _run_as()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _check(cmd: list[str], what: str, cwd: Path, log: Path | None = None, **kwargs) -> None:
    # cwd: a folder the server's user can enter (initdb fails in one it cannot, like root's).
    done = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S, cwd=cwd, **kwargs)
    if done.returncode != 0:
        detail = (done.stdout + done.stderr).strip()
        if log is not None:
            detail += "\n--- server log ---\n" + _tail(log)
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{detail}")


@contextmanager
def server() -> Iterator[str]:
    """Run a PostgreSQL server for the duration of the ``with`` block; yields its URL.

    Raises:
        PostgresUnavailable: no binaries, or no user to run them as (see :func:`check_available`).
        RuntimeError: the binaries are there but the server did not start (holds the server's
            log).
    """
    bin_dir = find_bin_dir()
    run_as = _run_as()
    # As root the folder must be reachable by the server's user: /tmp rather than a $TMPDIR that
    # may sit in root's home.
    parent = "/tmp" if run_as and os.path.isdir("/tmp") else None
    root = Path(tempfile.mkdtemp(prefix="perfscope-pg-", dir=parent))
    data, sock, log = root / "data", root / "sock", root / "server.log"
    sock.mkdir()
    if run_as:
        user = pwd.getpwnam(SERVER_USER)
        for path in (root, sock):
            os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(root, 0o700)
    password = secrets.token_hex(12)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    started, url = False, None
    try:
        # Environment for the server's tools: a locale that exists everywhere, no inherited PG*
        # variables (PGDATA, PGPORT...) that would point them elsewhere.
        env.update(LC_ALL="C", LANG="C")
        _check(
            [*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "-E", "UTF8",
             "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
            "initdb", root, env=env,
        )
        # Server settings on the command line (pg_ctl passes -o through a shell; the paths are
        # mkdtemp's, without spaces). Durability is off: nothing is kept.
        options = (f"-c listen_addresses=127.0.0.1 -k {sock} -c fsync=off -c synchronous_commit=off"
                   " -c full_page_writes=off -c max_connections=100 -c shared_buffers=32MB")
        port = 0
        for attempt in range(3):  # another process may take the free port before the server
            port = _free_port()
            try:
                _check(
                    [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                     "-t", str(START_TIMEOUT_S), "-o", f"{options} -p {port}", "start"],
                    "pg_ctl start", root, log=log, env=env,
                )
                started = True
                break
            except RuntimeError:
                if attempt == 2 or "could not bind" not in _tail(log, 40):
                    raise
        psql = [str(bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(sock),
                "-p", str(port), "-U", SUPERUSER, "-d", "postgres"]
        _check(
            [*psql, "-c", f"CREATE ROLE {DB_USER} LOGIN CREATEDB PASSWORD '{password}'",
             "-c", f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}"],
            "creating the test user and database", root, log=log, env=env,
        )
        url = f"postgresql://{DB_USER}:{password}@127.0.0.1:{port}/{DB_NAME}"
        _SOCKETS[url] = f"postgresql://{DB_USER}:{password}@/{DB_NAME}?host={sock}&port={port}"
        yield url
    finally:
        _SOCKETS.pop(url, None)
        if started:
            subprocess.run(
                [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                 "stop"],
                check=False, capture_output=True, timeout=START_TIMEOUT_S, env=env, cwd=root,
            )
        _remove(root)


def socket_url(url: str) -> str:
    """The URL of the running :func:`server` ``url`` through its Unix socket
    (``postgresql://USER:PASS@/DB?host=FOLDER&port=PORT``; local connections are trusted, the
    password is kept so that the URL reads like a real one).

    Raises:
        KeyError: ``url`` is not a server running now.
    """
    return _SOCKETS[url]


def _remove(root: Path) -> None:
    for _ in range(5):  # the stopping server may still be closing files
        shutil.rmtree(root, ignore_errors=True)
        if not root.exists():
            return
        time.sleep(0.2)


def create_login(url: str, user: str, password: str) -> str:
    """A new login role ``user`` with ``password`` (any characters) on the running :func:`server`
    ``url``, owning a new database of its name; created as the superuser over the Unix socket.

    Returns:
        The server's ``host:port`` (the caller spells the URL, encoded as it wishes to test).
    """
    bin_dir = find_bin_dir()
    params = dict(parse_qsl(urlsplit(socket_url(url)).query))
    quoted_user = '"' + user.replace('"', '""') + '"'
    quoted_password = "'" + password.replace("'", "''") + "'"
    psql = [str(bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", params["host"], "-p", params["port"],
            "-U", SUPERUSER, "-d", "postgres"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    _check([*psql, "-c", f"CREATE ROLE {quoted_user} LOGIN PASSWORD {quoted_password}",
            "-c", f"CREATE DATABASE {quoted_user} OWNER {quoted_user}"],
           f"creating the login {user!r}", Path(params["host"]).parent, env=env)
    return url.rsplit("@", 1)[1].split("/", 1)[0]

