"""How many connections a run opens to a PostgreSQL store, the size of a private server for
it, and whether a given server allows them (said before the run starts, with the fix).

Each process that uses the store keeps one small pool for all its threads:

* ``POOL_SIZE`` (1) connection stays open between operations. A replica's threads (the
  training loop recording epochs and claiming trials, the search thread reading the history,
  the heartbeat) each hold it for milliseconds, so one connection serves them nearly always.
* ``MAX_OVERFLOW`` (1) more is opened only while two of them overlap (a history read while an
  epoch is recorded), and closed again, so an epoch never waits behind a long read.
* The replica's TPE study (Optuna) is a journal file in the run directory: ``HPO`` (0).
* The node's resource sampler holds none: its replica copies the samples into the store.

A replica therefore holds 1 connection and at most ``PER_REPLICA`` (2) at once; the primary
at most ``PRIMARY`` (4). SQLite needs none of this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

POOL_SIZE = 1
MAX_OVERFLOW = 1
HPO = 0
PER_PROCESS = POOL_SIZE + MAX_OVERFLOW
PER_REPLICA = PER_PROCESS + HPO
# The primary: its session's store, and a second store through which an external launcher
# (mpiexec, srun) watches the replicas it did not start.
PRIMARY = PER_PROCESS + PER_PROCESS
# `check`, `report`, a person's psql and the like while the run goes on.
TOOLS = 10
# The size a private server always had; never smaller.
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


def needed(replicas: int) -> int:
    """The most connections a run of ``replicas`` replicas opens at once."""
    return replicas * PER_REPLICA + PRIMARY


def server_size(replicas: int) -> int:
    """``max_connections`` of a private server for ``replicas`` replicas: what the run needs,
    a quarter more (a replica restarted while its old connection is still being closed), and
    room for the tools."""
    return max(PRIVATE_MIN, math.ceil(1.25 * needed(replicas)) + TOOLS)


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
    return (f"the store allows {max(0, free)} more connections ({'; '.join(limits)}), but "
            f"{replicas} replica(s) open up to {need} ({PER_REPLICA} per replica, {PRIMARY} for "
            f"the primary): raise max_connections to at least {target} (ALTER SYSTEM SET "
            f"max_connections = {target}, then restart the server) and any role or database "
            "CONNECTION LIMIT, run fewer replicas, or, on SLURM, leave out --store so that the "
            "job starts a private server sized for it")


def check_room(url: str | None, replicas: int) -> None:
    """Refuse, before anything is written, a run of ``replicas`` replicas that the PostgreSQL
    store at ``url`` would refuse connections mid-run (SQLite has no such limit)."""
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
