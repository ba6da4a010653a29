"""The store service's network side: it listens, admits each connection at its door
(store/service/gate.py), greets each client (the protocol and the run's token), hands every
call to :meth:`Service.handle <automlperf.store.service.server.Service.handle>` and writes
back its answer; a ticker flushes
the heartbeats every ``FLUSH_S`` and takes a stalled event loop (a SIGSTOP, a swapping
machine) for an outage. The calls themselves are store/service/server.py; the process around
it, store/service/__main__.py."""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import json
import logging
import os
import resource
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from automlperf.store import schema
from automlperf.store.base import SCHEMA_VERSION, StoreError
from automlperf.store.connections import SPARE_FILES
from automlperf.store.rundir import write_atomic
from automlperf.store.service import wire
from automlperf.store.service.db import Writer
from automlperf.store.service.gate import Gate, Said, Ticket
from automlperf.store.service.server import Service

log = logging.getLogger("automlperf.store.service")

# How often heartbeats and the session's last_seen are written to the database.
FLUSH_S = 5.0
# How often the ticker looks (a stall, the times, the flush).
TICK_S = 1.0
# Connections the kernel keeps waiting for the service to take (10,000 replicas start at once).
BACKLOG = 16384
# How long to wait when taking a connection fails (out of files).
ACCEPT_AGAIN_S = 0.1
# How often the calls' times (store/service/latency.py) are written beside the service's log.
TIMES_S = 60.0
# How long a new connection may take to greet: one that does not (a port scanner, a client
# that sends a byte a second) is closed rather than held. An honest client greets within
# milliseconds; one that misses it under a storm of starts connects again.
GREETING_S = 10.0
# An event loop that stalls this long (a SIGSTOP, the machine swapping) is an outage: the
# heartbeats it could not take are not held against anyone.
STALL_S = 5.0
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
                on_listening: Callable[[int], None], replicas: int | None = None) -> None:
    """Serve ``service`` on ``host:port`` (several addresses; None: every interface) until
    SIGTERM or SIGINT; ``on_listening`` is told the port once clients can connect (another,
    when something else took ``port``). ``replicas``: the run's (any may run on this host),
    which sizes this host's share of connections. What is waiting is written before it
    returns."""
    loop = asyncio.get_running_loop()
    stop = begin(service)
    gate = Gate(client_cap(), replicas)
    listeners = listen(host if isinstance(host, list) else [host or "0.0.0.0"], port)
    acceptors = [watched(service, asyncio.create_task(accept(service, gate, listener),
                                                      name="acceptor"), stop)
                 for listener in listeners]
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_listening(listeners[0].getsockname()[1])
    ticker = watched(service, asyncio.create_task(tick(service, stop), name="ticker"), stop)
    await stop.wait()
    for task in acceptors:
        task.cancel()
    for listener in listeners:
        listener.close()
    for open_client in list(service.clients):  # their calls end; they find the next service
        open_client.close()
    ticker.cancel()
    await end(service)


def watched(service: Service, task: asyncio.Task[None],
            stop: asyncio.Event) -> asyncio.Task[None]:
    """A task the service cannot go on without (the ticker): if it ends before the service
    stops, the service says why and stops, and its primary starts it again."""

    def ended(done: asyncio.Task[None]) -> None:
        if stop.is_set() or done.cancelled():
            return
        failed = done.exception()
        log.critical("the store service's %s stopped (%s); stopping the service",
                     done.get_name(), "no error" if failed is None else
                     f"{type(failed).__name__}: {failed}", exc_info=failed)
        service.task_failed = failed or RuntimeError(f"the {done.get_name()} stopped")
        stop.set()

    task.add_done_callback(ended)
    return task


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
    logged, the threads and connections closed; :class:`StoreError` if the writer (or the
    ticker) failed."""
    try:
        await service.flush()
    except Exception as exc:  # noqa: BLE001 - the rest still closes; said, and raised below
        log.error("the last heartbeats could not be written: %s: %s", type(exc).__name__, exc)
    write_times(service)
    log.info("calls served (the service's own time): %s", service.times.line())
    service.writer.stop()
    service.writer.join()
    service.readers.shutdown()
    service.db.close()
    for what, failed in (("writer", service.writer.failed), ("ticker", service.task_failed)):
        if failed is not None:
            raise StoreError(f"the store service's {what} failed: {type(failed).__name__}: "
                             f"{failed}")


def listen(hosts: list[str], port: int) -> list[socket.socket]:
    """A listening socket on each of ``hosts``, all on one port (``port``, or the first one's
    free port): the one written to the service's file. A ``port`` something else holds (a
    process that took it while the service was restarting) gives way to a free one: the
    service's file names it, and the clients read it again."""
    try:
        first = _listener(hosts[0], port)
    except OSError as exc:
        if not port or exc.errno != errno.EADDRINUSE:
            raise
        log.warning("port %d is taken (%s): listening on another, which %s names", port, exc,
                    "the service's file")
        first = _listener(hosts[0], 0)
    listeners = [first]
    port = first.getsockname()[1]
    for other in hosts[1:]:
        try:
            listeners.append(_listener(other, port))
        except OSError as exc:
            log.warning("not listening on %s:%d: %s", other, port, exc)
    return listeners


def _listener(host: str, port: int) -> socket.socket:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    sock = socket.create_server(address, family=family, backlog=BACKLOG)
    sock.setblocking(False)
    return sock


async def accept(service: Service, gate: Gate, listener: socket.socket) -> None:
    """Take the connections ``listener`` is offered one at a time, each admitted at the gate
    as it comes (an older one closed for it where a share is full), so that however fast
    they come the service holds no more open files than the gate's rooms: a server that
    takes a backlog's worth before any is counted runs out of files, and says so in a
    traceback per connection."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn, peer = await loop.sock_accept(listener)
        except OSError as exc:  # out of files after all (the spare ones too): a moment
            gate.said("accept", "could not take a connection (%s); trying again in %.1f s",
                      exc, ACCEPT_AGAIN_S)
            await asyncio.sleep(ACCEPT_AGAIN_S)
            continue
        host = str(peer[0]) if isinstance(peer, tuple) else ""
        ticket = gate.admit(host, lambda: None)
        ticket.close = functools.partial(_drop, ticket, conn)
        task = asyncio.create_task(client(service, gate, ticket, conn, host))
        service.serving.add(task)
        task.add_done_callback(service.serving.discard)
        # A turn of the loop for each: the connection closed for it goes, and the newest
        # greet as they arrive (a flood's newer connections would otherwise close a client's
        # before it could say its first word).
        await asyncio.sleep(0)


def _drop(ticket: Ticket, conn: socket.socket) -> None:
    """Close a connection that has no streams yet, to make room for a newer one (one whose
    streams are being made is closed once they are: its file is theirs until then)."""
    ticket.gone = True
    if not ticket.wrapping:
        conn.close()


async def client(service: Service, gate: Gate, ticket: Ticket, conn: socket.socket,
                 host: str) -> None:
    """One client's connection, admitted at the gate (``ticket``) to greet (it may be closed
    to admit a newer one until it has), given a slot once it has proved the run's token if
    one is left, then its calls answered in order."""
    if ticket.gone:
        return  # closed for a newer one before its turn came
    ticket.wrapping = True
    try:
        wire.keepalive(conn)
        reader, writer = await asyncio.open_connection(sock=conn)
    except OSError:
        gate.leave(ticket)
        conn.close()
        return
    ticket.close = writer.transport.abort
    if ticket.gone:
        writer.transport.abort()
        return
    service.clients.add(writer)
    said = gate.said
    role = None
    try:
        # Bounded before anyone is known: a greeting's size, no compression, a deadline.
        role = await asyncio.wait_for(greet(service, reader, writer, said,
                                            lambda: gate.spoke(ticket)), GREETING_S)
        if role is None:
            return
        if not gate.proven(ticket, host):
            await send_message(writer, {"e": "busy", "m": "the store service holds as many "
                                        "connections as it has room for; try again"})
            return
        await send_message(writer, {"v": {"schema": SCHEMA_VERSION, "role": role}})
        while True:
            message = await read_message(reader, wire.MAX_REQUEST)
            writer.write(await service.handle(message, role))
            await writer.drain()
    except wire.ProtocolError as exc:
        # A stranger's, or a client of the run's (a broken one): said apart.
        said("closed" if role is None else f"closed {role}", "closed a connection from %s%s: %s",
             _peer(writer), "" if role is None else f" (a {role}'s)", exc)
    except asyncio.TimeoutError:
        said("slow", "closed a connection from %s: no greeting within %.0f s", _peer(writer),
             GREETING_S)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    except Exception as exc:  # noqa: BLE001 - a bug closes this connection, not the service
        said("failed", "closed a connection from %s: %s: %s", _peer(writer),
             type(exc).__name__, exc)
    finally:
        service.clients.discard(writer)
        gate.leave(ticket)
        writer.close()


async def greet(service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                said: Callable[..., None] | None = None,
                spoke: Callable[[], None] | None = None) -> str | None:
    """The client's role (``primary`` when it also proved the primary's token, else
    ``replica``) when it speaks this protocol and schema and holds the run's token, which
    neither side sends (store/service/wire.py); else None, the refusal sent in one line,
    proven when the client's greeting gave a nonce to prove it with."""
    hello = await read_message(reader, wire.MAX_GREETING, compressed=False)
    if spoke is not None:
        spoke()
    refusal = wire.greeting_refusal(hello, SCHEMA_VERSION)
    ours = wire.nonce()
    if refusal is None:
        await send_message(writer, {"nonce": ours, "proof": wire.proof(
            service.token, "service", hello["nonce"], ours)})
        answer = await read_message(reader, wire.MAX_GREETING, compressed=False)
        answer = answer if isinstance(answer, dict) else {}
        if wire.proves(service.token, "client", ours, hello["nonce"], answer.get("proof")):
            if "primary" not in answer:
                return "replica"
            if service.primary_token and wire.proves(service.primary_token, "primary", ours,
                                                     hello["nonce"], answer["primary"]):
                return "primary"
            refusal = "protocol", "a primary's proof that does not hold: not this run's primary"
        else:
            refusal = "protocol", "wrong token for this store service"
    (said or Said())("refused", "refused a client from %s: %s", _peer(writer), refusal[1])
    theirs = hello.get("nonce") if isinstance(hello, dict) else None
    refused = {"e": refusal[0], "m": refusal[1]}
    if isinstance(theirs, str) and wire.NONCE.fullmatch(theirs):
        refused.update(nonce=ours, proof=wire.refusal_proof(service.token, *refusal, theirs, ours))
    await send_message(writer, refused)
    return None


async def tick(service: Service, stop: asyncio.Event) -> None:
    """Flush heartbeats every FLUSH_S; notice a stalled loop (SIGSTOP) as an outage. Any
    failure is said once (and again once it has passed), and the ticking goes on."""
    last = time.monotonic()
    flushed = written = last
    failing = 0
    while not stop.is_set():
        await asyncio.sleep(TICK_S)
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
            except Exception as exc:  # noqa: BLE001 - heartbeats must go on being taken
                failing += 1
                if failing == 1:
                    log.warning("heartbeats could not be written (%s: %s); kept for the next "
                                "flush, and said again once they are", type(exc).__name__,
                                exc, exc_info=not isinstance(exc, StoreError))
                continue
            if failing:
                log.warning("heartbeats written again after %d failed flushes", failing)
                failing = 0


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
    return wire.decode(flags, await reader.readexactly(length), limit)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "an unknown peer"


async def send_message(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(wire.encode(message))
    await writer.drain()
