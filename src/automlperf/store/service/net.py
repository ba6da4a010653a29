"""The store service's network side: it listens, greets each client (the protocol and the
run's token), hands every call to :meth:`Service.handle
<automlperf.store.service.server.Service.handle>` and writes back its answer; a ticker flushes
the heartbeats every ``FLUSH_S`` and takes a stalled event loop (a SIGSTOP, a swapping
machine) for an outage. The calls themselves are store/service/server.py; the process around
it, store/service/__main__.py."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import resource
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from automlperf.store import schema
from automlperf.store.base import SCHEMA_VERSION, StoreError
from automlperf.store.connections import SPARE_FILES
from automlperf.store.rundir import write_atomic
from automlperf.store.service import wire
from automlperf.store.service.db import Writer
from automlperf.store.service.server import Service

log = logging.getLogger("automlperf.store.service")

# How often heartbeats and the session's last_seen are written to the database.
FLUSH_S = 5.0
# How often the calls' times (store/service/latency.py) are written beside the service's log.
TIMES_S = 60.0
# How long a new connection may take to greet: one that does not (a port scanner, a client
# that sends a byte a second) is closed rather than held.
GREETING_S = 30.0
# An event loop that stalls this long (a SIGSTOP, the machine swapping) is an outage: the
# heartbeats it could not take are not held against anyone.
STALL_S = 5.0
# Connections any one other host may hold: a node's replicas keep one each (two while two
# threads call at once); more is someone exhausting the service's files.
PER_PEER = 256
# How often a refused connection is logged, at most.
REFUSALS_LOGGED_S = 60.0


@dataclass
class Gate:
    """Which connections are held: at most ``total``, and ``per_peer`` from any one host
    other than this one (this node's own replicas may be many: a local run's, or a
    simulated cluster's)."""

    total: int
    per_peer: int = PER_PEER
    held: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    said_at: float = float("-inf")

    def admit(self, host: str) -> bool:
        if sum(self.held.values()) >= self.total or \
                (not _local(host) and self.held[host] >= self.per_peer):
            self.refused += 1
            now = time.monotonic()
            if now - self.said_at >= REFUSALS_LOGGED_S:
                self.said_at = now
                log.warning("refused connections over the limits (%d in all, %d from one "
                            "host): %d so far, the last from %s", self.total, self.per_peer,
                            self.refused, host or "an unknown peer")
            return False
        self.held[host] += 1
        return True

    def leave(self, host: str) -> None:
        self.held[host] -= 1
        if self.held[host] <= 0:
            del self.held[host]


def _local(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_addresses(name: str) -> list[str] | None:
    """Where to listen for clients that reach this host by ``name``: the addresses it
    resolves to here. None (every interface) where it resolves only to loopback, as a host
    name does that a hosts file maps to 127.0.1.1 while the cluster's DNS gives the nodes
    another address."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    return [a for a in addresses if not _local(a) and _bindable(a)] or None


def _bindable(address: str) -> bool:
    """Whether this host has ``address`` (a name may resolve to a NAT's, which it has not)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def client_cap() -> int:
    """How many clients this process can hold: its open-file limit raised to the most it may
    have (as any process may), less what the service keeps for itself."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    usable = wanted if soft == resource.RLIM_INFINITY else soft
    return max(16, usable - SPARE_FILES)


async def serve(service: Service, host: str | list[str] | None, port: int,
                on_listening: Callable[[int], None]) -> None:
    """Serve ``service`` on ``host:port`` (several addresses; None: every interface) until
    SIGTERM or SIGINT; ``on_listening`` is told the port once clients can connect. What is
    waiting is written before it returns."""
    loop = asyncio.get_running_loop()
    stop = begin(service)
    gate = Gate(client_cap())
    servers = await listen(lambda r, w: client(service, gate, r, w),
                           host if isinstance(host, list) else [host or "0.0.0.0"], port)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_listening(servers[0].sockets[0].getsockname()[1])
    ticker = asyncio.create_task(tick(service, stop))
    await stop.wait()
    for server in servers:
        server.close()
    for open_client in list(service.clients):  # their calls end; they find the next service
        open_client.close()
    for server in servers:
        await server.wait_closed()
    ticker.cancel()
    await end(service)


def begin(service: Service) -> asyncio.Event:
    """Before a transport serves ``service``: its group commit's thread started and what the
    database holds of the change log noted. The event it returns is set when the service
    must stop (the writer failed, or a transport's signal)."""
    stop = asyncio.Event()
    service.writer = Writer(service.db, asyncio.get_running_loop())
    service.writer.on_failure = stop.set
    service.writer.start()
    with service.db.engine.connect() as conn:
        for table in (schema.T_TRIALS, schema.T_REPLICAS):
            last = conn.execute(sa.select(sa.func.max(table.c.changed))).scalar()
            service.changed_through(last or 0)
    return stop


async def end(service: Service) -> None:
    """After its transport stopped: what is waiting written, the calls' times written and
    logged, the threads and connections closed; :class:`StoreError` if the writer failed."""
    await service.flush()
    write_times(service)
    log.info("calls served (the service's own time): %s", service.times.line())
    service.writer.stop()
    service.writer.join()
    service.readers.shutdown()
    service.db.close()
    if service.writer.failed is not None:
        raise StoreError(f"the store service's writer failed: "
                         f"{type(service.writer.failed).__name__}: {service.writer.failed}")


async def listen(serve_one: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
                 hosts: list[str], port: int) -> list[asyncio.Server]:
    """A server on each of ``hosts``, all on one port (``port``, or the first one's free
    port): the one written to the service's file."""
    servers = [await asyncio.start_server(serve_one, hosts[0], port, backlog=16384)]
    port = servers[0].sockets[0].getsockname()[1]
    for other in hosts[1:]:
        try:
            servers.append(await asyncio.start_server(serve_one, other, port, backlog=16384))
        except OSError as exc:
            log.warning("not listening on %s:%d: %s", other, port, exc)
    return servers


async def client(service: Service, gate: Gate, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    """One client's connection: admitted within the limits, its greeting checked, then its
    calls answered in order."""
    peer = writer.get_extra_info("peername")
    host = str(peer[0]) if isinstance(peer, tuple) else ""
    if not gate.admit(host):
        writer.close()
        return
    service.clients.add(writer)
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            wire.keepalive(sock)
        # Bounded before anyone is known: a greeting's size, no compression, a deadline.
        if not await asyncio.wait_for(greet(service, reader, writer), GREETING_S):
            return
        while True:
            message = await read_message(reader, wire.MAX_REQUEST)
            writer.write(await service.handle(message))
            await writer.drain()
    except wire.ProtocolError as exc:
        log.warning("closed a connection from %s: %s", _peer(writer), exc)
    except asyncio.TimeoutError:
        log.warning("closed a connection from %s: no greeting within %.0f s", _peer(writer),
                    GREETING_S)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        service.clients.discard(writer)
        gate.leave(host)
        writer.close()


async def greet(service: Service, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> bool:
    """Whether the client speaks this protocol and schema and holds the run's token, which
    neither side sends (store/service/wire.py); a refusal is sent in one line."""
    hello = await read_message(reader, wire.MAX_GREETING, compressed=False)
    refusal = wire.greeting_refusal(hello, SCHEMA_VERSION)
    if refusal is None:
        ours = wire.nonce()
        await send_message(writer, {"nonce": ours, "proof": wire.proof(
            service.token, "service", hello["nonce"], ours)})
        answer = await read_message(reader, wire.MAX_GREETING, compressed=False)
        claimed = answer.get("proof") if isinstance(answer, dict) else None
        if wire.proves(service.token, "client", ours, hello["nonce"], claimed):
            await send_message(writer, {"v": {"schema": SCHEMA_VERSION}})
            return True
        refusal = "protocol", "wrong token for this store service"
    log.warning("refused a client from %s: %s", _peer(writer), refusal[1])
    await send_message(writer, {"e": refusal[0], "m": refusal[1]})
    return False


async def tick(service: Service, stop: asyncio.Event) -> None:
    """Flush heartbeats every FLUSH_S; notice a stalled loop (SIGSTOP) as an outage."""
    last = time.monotonic()
    flushed = written = last
    while not stop.is_set():
        await asyncio.sleep(1.0)
        now = time.monotonic()
        if now - last > STALL_S:
            log.warning("the store service was stalled for %.0f s", now - last)
            service.restored_at = time.time()
        last = now
        if now - written >= TIMES_S:
            written = now
            write_times(service)
        if now - flushed >= FLUSH_S:
            flushed = now
            try:
                await service.flush()
            except StoreError:
                log.warning("heartbeats could not be written; kept for the next flush",
                            exc_info=True)


def write_times(service: Service) -> None:
    """The calls' times so far, by kind, to the service's ``times_file``."""
    if service.times_file is None:
        return
    try:
        write_atomic(service.times_file, json.dumps(
            {"pid": os.getpid(), "since": service.started_at, "written": time.time(),
             "calls": service.times.summary(), "state": service.times.state()}, indent=1) + "\n")
    except OSError as exc:
        log.warning("the calls' times could not be written to %s: %s", service.times_file, exc)


async def read_message(reader: asyncio.StreamReader, limit: int,
                       compressed: bool = True) -> Any:
    """The next message, refused (:class:`~automlperf.store.service.wire.ProtocolError`) from
    its header when longer than ``limit`` or compressed where it may not be."""
    head = await reader.readexactly(wire.HEADER.size)
    length, flags = wire.HEADER.unpack(head)
    wire.check_header(length, flags, limit, compressed)
    return wire.decode(flags, await reader.readexactly(length))


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "an unknown peer"


async def send_message(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(wire.encode(message))
    await writer.drain()
