"""The store service's network side: it listens, greets each client (the protocol and the
run's token), hands every call to :meth:`Service.handle
<automlperf.store.service.server.Service.handle>` and writes back its answer; a ticker flushes
the heartbeats every ``FLUSH_S`` and takes a stalled event loop (a SIGSTOP, a swapping
machine) for an outage. The calls themselves are store/service/server.py; the process around
it, store/service/__main__.py."""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from automlperf.store import schema
from automlperf.store.base import SCHEMA_VERSION, StoreError
from automlperf.store.service import wire
from automlperf.store.service.db import Writer
from automlperf.store.service.server import Service

log = logging.getLogger("automlperf.store.service")

# How often heartbeats and the session's last_seen are written to the database.
FLUSH_S = 5.0
# How long a new connection may take to greet: one that does not (a port scanner, a client
# that sends a byte a second) is closed rather than held.
GREETING_S = 30.0
# An event loop that stalls this long (a SIGSTOP, the machine swapping) is an outage: the
# heartbeats it could not take are not held against anyone.
STALL_S = 5.0


async def serve(service: Service, host: str, port: int,
                on_listening: Callable[[int], None]) -> None:
    """Serve ``service`` on ``host:port`` until SIGTERM or SIGINT; ``on_listening`` is told
    the port once clients can connect. What is waiting is written before it returns."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    service.writer = Writer(service.db, loop)
    service.writer.on_failure = stop.set
    service.writer.start()
    with service.db.engine.connect() as conn:
        for table in (schema.T_TRIALS, schema.T_REPLICAS):
            last = conn.execute(sa.select(sa.func.max(table.c.changed))).scalar()
            service.changed_through(last or 0)
    server = await asyncio.start_server(lambda r, w: client(service, r, w), host, port,
                                        backlog=16384)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_listening(server.sockets[0].getsockname()[1])
    ticker = asyncio.create_task(tick(service, stop))
    await stop.wait()
    server.close()
    for open_client in list(service.clients):  # their calls end; they find the next service
        open_client.close()
    await server.wait_closed()
    ticker.cancel()
    await service.flush()
    service.writer.stop()
    service.writer.join()
    service.readers.shutdown()
    service.db.close()
    if service.writer.failed is not None:
        raise StoreError(f"the store service's writer failed: "
                         f"{type(service.writer.failed).__name__}: {service.writer.failed}")


async def client(service: Service, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    """One client's connection: its greeting checked, then its calls answered in order."""
    service.clients.add(writer)
    try:
        # Bounded before anyone is known: a greeting's size, no compression, a deadline.
        hello = await asyncio.wait_for(
            read_message(reader, wire.MAX_GREETING, compressed=False), GREETING_S)
        if not isinstance(hello, dict) or hello.get("hello") != wire.PROTOCOL:
            await send_message(writer, {"e": "protocol", "m": "this store service speaks "
                                        f"protocol {wire.PROTOCOL}: use the automlperf that "
                                        "started it"})
            return
        if not secrets.compare_digest(str(hello.get("token", "")), service.token):
            await send_message(writer, {"e": "protocol", "m": "wrong token for this store service"})
            return
        await send_message(writer, {"v": {"schema": SCHEMA_VERSION}})
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
        writer.close()


async def tick(service: Service, stop: asyncio.Event) -> None:
    """Flush heartbeats every FLUSH_S; notice a stalled loop (SIGSTOP) as an outage."""
    last = time.monotonic()
    flushed = last
    while not stop.is_set():
        await asyncio.sleep(1.0)
        now = time.monotonic()
        if now - last > STALL_S:
            log.warning("the store service was stalled for %.0f s", now - last)
            service.restored_at = time.time()
        last = now
        if now - flushed >= FLUSH_S:
            flushed = now
            try:
                await service.flush()
            except StoreError:
                log.warning("heartbeats could not be written; kept for the next flush",
                            exc_info=True)


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
