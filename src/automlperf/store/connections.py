"""How many connections a run opens to a PostgreSQL store, the size of a private server for
it, and whether a given server allows them (said before the run starts, with the fix).

A run on PostgreSQL reaches it through its store service (store/service/), which the
primary starts: the replicas open no database connection at all, however many they are.

* The service holds ``SERVICE`` (4): its writer's, which commits the calls waiting for it in
  one transaction, and its readers'.
* The primary holds ``PRIMARY`` (2) at most: its own store (which creates or resumes the run
  and reads the finished run's records), one pooled connection and one more while two of its
  threads overlap.
* A replica's TPE study is a journal file in the run directory: none.

A run therefore opens ``needed()`` = 6 at most, independent of its replicas; a private
server keeps ``PRIVATE_MIN`` for the tools (`check`, `report`, a person's psql) beside it.
SQLite needs none of this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POOL_SIZE = 1
MAX_OVERFLOW = 1
PER_PROCESS = POOL_SIZE + MAX_OVERFLOW
# store/service/db.py CONNECTIONS (the writer and three readers).
SERVICE = 4
PRIMARY = PER_PROCESS
# `check`, `report`, a person's psql and the like while the run goes on.
TOOLS = 10
# A private server's size, whatever the run's: what the run opens, with room to spare.
PRIVATE_MIN = 200


def engine_kwargs() -> dict[str, Any]:
    """SQLAlchemy pool settings of a PostgreSQL store (see the module's description)."""
    # No liveness check on every checkout (a round trip each): a connection the server
    # dropped fails its statement, which the store retries on a new one.
    return {"pool_size": POOL_SIZE, "max_overflow": MAX_OVERFLOW,
            # Waiting for the one pooled connection is normal under load, not an error.
            "pool_timeout": 600,
            # A server whose host drops packets would hold a connect for the kernel's TCP
            # timeout (minutes), past the store's retry limit and its notice.
            "connect_args": {"connect_timeout": 10}}


def needed(replicas: int = 1) -> int:
    """The most connections a run opens at once: the same for any number of replicas."""
    return SERVICE + PRIMARY


def server_size(replicas: int = 1) -> int:
    """``max_connections`` of a private server for a run (of any number of replicas)."""
    return PRIVATE_MIN


@dataclass
class Capacity:
    """What a PostgreSQL server lets this user open: its ``max_connections`` less the slots
    kept for superusers, less the connections already open (other than this one), and the
    role's and database's own limits (-1: none)."""

    max_connections: int
    reserved: int
    in_use: int
    role_limit: int
    database_limit: int
    database_in_use: int
    role_in_use: int

    def available(self) -> int:
        free = self.max_connections - self.reserved - self.in_use
        if self.role_limit >= 0:
            free = min(free, self.role_limit - self.role_in_use)
        if self.database_limit >= 0:
            free = min(free, self.database_limit - self.database_in_use)
        return free


def capacity(conn: Any) -> Capacity:
    """The server's limits and use, read through an open SQLAlchemy connection."""
    import sqlalchemy as sa

    def scalar(sql: str) -> int:
        value = conn.execute(sa.text(sql)).scalar()
        return int(value) if value is not None else 0

    reserved = scalar("SELECT current_setting('superuser_reserved_connections')::int")
    # PostgreSQL 16 adds reserved_connections (for pg_use_reserved_connections).
    reserved += scalar("SELECT coalesce(current_setting('reserved_connections', true), '0')::int")
    backend = "backend_type = 'client backend' AND pid <> pg_backend_pid()"
    return Capacity(
        max_connections=scalar("SELECT current_setting('max_connections')::int"),
        reserved=reserved,
        in_use=scalar(f"SELECT count(*) FROM pg_stat_activity WHERE {backend}"),
        role_limit=scalar("SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user"),
        database_limit=scalar("SELECT datconnlimit FROM pg_database "
                              "WHERE datname = current_database()"),
        database_in_use=scalar(f"SELECT count(*) FROM pg_stat_activity WHERE {backend} "
                               "AND datname = current_database()"),
        role_in_use=scalar(f"SELECT count(*) FROM pg_stat_activity WHERE {backend} "
                           "AND usename = current_user"))


def shortfall(cap: Capacity, replicas: int) -> str | None:
    """Why a run of ``replicas`` replicas would be refused connections mid-run, and the fix;
    None when the server has room."""
    need = needed(replicas)
    free = cap.available()
    if need <= free:
        return None
    limits = [f"max_connections = {cap.max_connections} ({cap.reserved} reserved, "
              f"{cap.in_use} already open)"]
    if cap.role_limit >= 0:
        limits.append(f"this role's CONNECTION LIMIT {cap.role_limit}")
    if cap.database_limit >= 0:
        limits.append(f"this database's CONNECTION LIMIT {cap.database_limit}")
    target = cap.max_connections + (need - free) + TOOLS
    return (f"the store allows {max(0, free)} more connections ({'; '.join(limits)}), but a "
            f"run opens up to {need} ({SERVICE} for its store service, {PRIMARY} for the "
            f"primary), however many replicas ({replicas} here): raise max_connections to at "
            f"least {target} (ALTER SYSTEM SET max_connections = {target}, then restart the "
            "server) and any role or database CONNECTION LIMIT, close other connections, or, "
            "on SLURM, leave out --store so that the job starts a private server")


def check_room(url: str | None, replicas: int) -> None:
    """Refuse, before anything is written, a run that the PostgreSQL store at ``url`` would
    refuse connections mid-run (SQLite has no such limit)."""
    if not url or not url.startswith("postgresql"):
        return
    import sqlalchemy as sa

    from automlperf.store.base import StoreError
    from automlperf.store.urls import redact

    try:
        # A login node may not reach a server only the compute nodes see: give up quickly.
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool,
                                  connect_args={"connect_timeout": 10})
    except ModuleNotFoundError:
        return  # no driver: opening the store says so, with the fix
    try:
        with engine.connect() as conn:
            why = shortfall(capacity(conn), replicas)
    except sa.exc.DBAPIError:
        return  # reaching it is the store's own business: it retries, then says why not
    finally:
        engine.dispose()
    if why:
        raise StoreError(f"store {redact(url)}: {why}")


# Open files a store service keeps back from its clients: the database's connections, its
# log, the event loop's own.
SPARE_FILES = 128
# Of the rest, what connections still greeting may hold (anyone's: they never take a slot of
# the run's own), or half where the rest is less than twice this.
GREETING_ROOM = 4096


def greeting_room(clients: int) -> int:
    """Of ``clients`` connections, those kept for connections still greeting."""
    return max(1, min(GREETING_ROOM, clients // 2))


def service_files_needed(replicas: int) -> int:
    """Open files a store service needs for ``replicas``: one connection each, a quarter
    more for those that open a second while two of their threads call at once, beside the
    room for connections still greeting."""
    proven = replicas + (replicas + 3) // 4
    clients = 2 * proven if 2 * proven <= 2 * GREETING_ROOM else proven + GREETING_ROOM
    return clients + SPARE_FILES


def check_open_files(replicas: int, hard: int | None = None) -> None:
    """Refuse, before anything is written, a run whose store service could not hold a
    connection per replica: the open-file limit it inherits from this process (which it
    raises to the hard limit) would refuse them mid-run. ``hard``: that limit, else this
    process's."""
    import resource

    from automlperf.store.base import StoreError

    if hard is None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    need = service_files_needed(replicas)
    if hard != resource.RLIM_INFINITY and hard < need:
        raise StoreError(f"the store service needs {need} open files for {replicas} replicas, "
                         f"but processes here may open at most {hard}: raise the hard limit "
                         "(`ulimit -Hn`, a unit's LimitNOFILE=, the batch system's or the "
                         "container's limit on open files) or start fewer replicas")
