"""The store service's door (store/service/net.py ``accept`` and ``client``) in the test's own
process: the real greeting, gate and framing in front of a stand-in for the calls, on an
event loop of its own, so that a test can look at the gate and the sockets the service
holds."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path
from typing import Any

from automlperf.store.base import SCHEMA_VERSION
from automlperf.store.service import net, wire
from automlperf.store.service.gate import Gate

TOKEN = "t" * 43
PRIMARY = "p" * 43


class Calls:
    """What stands in for the service's calls: each answered with the role it came from
    (``open`` with the schema, as a client's open asks)."""

    def __init__(self) -> None:
        self.token = TOKEN
        self.primary_token = PRIMARY
        self.clients: set[asyncio.StreamWriter] = set()
        self.serving: set[asyncio.Task[None]] = set()
        self.seen: list[tuple[Any, str]] = []

    async def handle(self, message: Any, role: str) -> bytes:
        self.seen.append((message, role))
        if isinstance(message, dict) and message.get("op") == "open":
            return wire.answer(SCHEMA_VERSION, 0.0)
        return wire.answer({"role": role}, 0.0)


class Door:
    """``net.client`` serving :class:`Calls` on ``host`` (a free port) behind a gate of
    ``total`` connections for a run of ``replicas``."""

    def __init__(self, host: str = "127.0.0.1", total: int = 1000,
                 replicas: int | None = None, own: frozenset[str] = frozenset()) -> None:
        self.calls = Calls()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start() -> None:
            self.gate = Gate(total, replicas, own)
            (self.listener,) = net.listen([host], 0)
            self.acceptor = asyncio.create_task(net.accept(self.calls, self.gate,  # type: ignore[arg-type]
                                                           self.listener))
            self.port = self.listener.getsockname()[1]
            ready.set()

        def run() -> None:
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(120), "the door did not open"
        self.host = host

    def on_loop(self, fn: Any) -> Any:
        """``fn()`` run on the door's event loop (where the gate lives): its value."""

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(120)

    def greeting_from(self) -> dict[str, int]:
        return self.on_loop(lambda: {k: len(v.all) for k, v in self.gate.greeting_from.items()})

    def held(self) -> dict[str, int]:
        return self.on_loop(lambda: dict(self.gate.held))

    def service_file(self, folder: Path, token: str = TOKEN) -> Path:
        """A service file (and token file) that sends a client here."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "store-service.json"
        path.write_text(json.dumps({"host": self.host, "port": self.port}))
        (folder / ".store-service.token").write_text(token)
        return path

    def connect(self, source: str | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(120)
        if source is not None:
            sock.bind((source, 0))
        sock.connect((self.host, self.port))
        return sock

    def close(self) -> None:
        async def stop() -> None:
            self.acceptor.cancel()
            self.listener.close()
            for writer in list(self.calls.clients):
                writer.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=120)


def wait_until(condition: Any, limit: float = 120.0, what: str = "the condition") -> None:
    """Wait for ``condition()`` (a generous limit: no assumption on the machine's speed)."""
    import time

    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"waited {limit:.0f} s for {what}"
        time.sleep(0.01)


def received(sock: socket.socket, limit: float = 120.0) -> bytes:
    """Everything the door sent on ``sock`` until it closed it."""
    sock.settimeout(limit)
    got = bytearray()
    try:
        while chunk := sock.recv(1 << 16):
            got += chunk
    except ConnectionResetError:
        pass
    return bytes(got)
