"""The store as a replica (and the primary) reaches it through the run's store service
(store/service/server.py): a :class:`~automlperf.store.base.Store` whose calls travel over
TCP (store/service/wire.py). It keeps one connection (a second is made while two of its
threads call at once, and closed after); a call whose connection breaks (the service
restarting, a network hiccup) is sent again on a new one, after a jittered back-off, within
the limit of a database's outages (``retry_s``), and a write sent again takes effect once
(the store's contract). The service's address is re-read from its file before each new
connection, so a service restarted elsewhere is found.

A store URL ``store-service://FILE`` names the service whose address is in FILE
(store/opening.py ``open_store`` opens it)."""

from __future__ import annotations

import functools
import json
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from automlperf.store.base import (BACKOFF_MAX_S, SCHEMA_VERSION, SampleFigures, SchemaMismatch,
                                   SegmentRecord, Store, StoreError)
from automlperf.store.retry import OUTAGE_NOTICE_S, RETRY_ENV, configured_retry_s
from automlperf.store.service import wire
from automlperf.store.service.calls import CALLS

SCHEME = "store-service://"
SERVICE_FILE = "store-service.json"
TOKEN_FILE = ".store-service.token"
# The shortest token either side accepts (the primary writes 32 characters, 192 bits).
MIN_TOKEN = 32
# How long a new connection may take (a host that drops packets would hold it for minutes),
# and its greeting: the service closes one it has not finished in net.GREETING_S (10 s), so
# what takes longer is not the service (a process on its port that says nothing).
CONNECT_S = 10.0
GREETING_WAIT_S = 30.0
# Connections a store keeps between calls: 10,000 replicas, 10,000 connections at the service.
KEEP = 1
# A heartbeat's own deadline, a quarter of the lease it renews (at least this): one sent on a
# connection whose peer vanished without a word (a half-open connection) is given up and
# sent again on a new one while the lease still holds, not after the socket's timeout.
HEARTBEAT_MIN_S = 5.0
# The bulk reads of a finished run that go to the database itself where the store was given
# one (``direct``): half a million epochs need not cross the service.
DIRECT = frozenset({"trials", "epochs", "samples", "nodes"})
log = logging.getLogger("automlperf.store")


class ServiceUnavailable(ConnectionError):
    """No answer from the service on this try."""


def _forwarding() -> Any:
    """The class of Store's calls as :class:`RemoteStore` makes them: each a method with
    Store's own signature and docstring that hands its arguments to ``RemoteStore._forward``.
    Typed Any: the type checker reads the calls' types off Store, RemoteStore's other base."""

    def forwarded(name: str) -> Callable[..., Any]:
        def method(store: RemoteStore, *positional: Any, **named: Any) -> Any:
            return store._forward(name, *positional, **named)

        # Store's name, docstring and signature (``__wrapped__``), not its abstractness.
        return functools.update_wrapper(method, getattr(Store, name), updated=())

    return type("StoreCalls", (), {name: forwarded(name) for name in CALLS if name != "open"})


class RemoteStore(_forwarding(), Store):  # type: ignore[misc]
    """The store served at the address in ``service_file`` (with the token in
    ``token_file``). ``direct``: a store on the database itself, which the primary passes for
    reading a finished run's records in bulk (epochs, samples), rather than through the
    service. ``primary_token``: the primary's own, which the service was given when it
    started (never written down), for the calls only the primary makes."""

    def __init__(self, service_file: Path | str, token_file: Path | str | None = None,
                 retry_s: float | None = None, direct: Store | None = None,
                 primary_token: str | None = None) -> None:
        self.service_file = Path(service_file)
        self.token_file = Path(token_file) if token_file else self.service_file.with_name(TOKEN_FILE)
        self.url = SCHEME + str(self.service_file)
        self.retry_s = configured_retry_s() if retry_s is None else retry_s
        self.direct = direct
        self.primary_token = primary_token
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._said = False
        self.closed = False
        # What the calls cost on the wire, by call: for those who watch it (the benchmarks).
        self.calls: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        # Opening checks the schema (the service asks the database, one query).
        served = self._call("open", {})
        if served != SCHEMA_VERSION:
            raise SchemaMismatch(f"the store service at {self.service_file} serves schema "
                                 f"version {served}; this automlperf reads version "
                                 f"{SCHEMA_VERSION}. Use the automlperf that started the run")

    # --- the connection ---------------------------------------------------------------------
    def _address(self) -> tuple[str, int, str]:
        try:
            found = json.loads(self.service_file.read_text())
            host, port = str(found["host"]), int(found["port"])
            token = self.token_file.read_text().strip()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ServiceUnavailable(f"no store service address in {self.service_file} "
                                     f"({exc})") from None
        if len(token) < MIN_TOKEN:
            # An empty key would prove anything: its run's primary writes a new one when it
            # starts the service.
            raise ServiceUnavailable(f"the token in {self.token_file} is {len(token)} "
                                     f"characters, fewer than {MIN_TOKEN}: a file the run's "
                                     "primary did not finish writing")
        return host, port, token

    def _connect(self, deadline_s: float | None = None) -> socket.socket:
        host, port, token = self._address()
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_S)
        except OSError as exc:
            raise ServiceUnavailable(f"{host}:{port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.keepalive(sock)
        sock.settimeout(min(GREETING_WAIT_S, deadline_s or GREETING_WAIT_S))
        try:
            answer = self._greet(sock, token)
        except (OSError, ValueError) as exc:
            sock.close()
            if isinstance(exc, ServiceUnavailable):
                raise ServiceUnavailable(f"{host}:{port} {exc}") from None
            raise ServiceUnavailable(f"{host}:{port}: {exc}") from None
        if "e" in answer:
            sock.close()
            message = (f"store service at {host}:{port} refused this client: "
                       f"{wire.shown(answer.get('m'), 300)}")
            if answer["e"] == "busy":
                raise ServiceUnavailable(message)
            raise SchemaMismatch(message) if answer["e"] == "schema" else StoreError(message)
        sock.settimeout(self.retry_s + 60.0)  # a call waits past the service's own retries
        return sock

    def _greet(self, sock: socket.socket, token: str) -> dict[str, Any]:
        """The greeting (store/service/wire.py): the service proves it holds the token before
        this side proves it does; neither sends it. The service's last answer, or its
        refusal; a refusal it did not prove is the answer of something else on its port
        (:class:`ServiceUnavailable`: tried again, its address read again)."""
        ours = wire.nonce()
        sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION,
                                  "nonce": ours}))
        answer, _ = wire.read_frame(sock, wire.MAX_GREETING)
        if not isinstance(answer, dict):
            raise ServiceUnavailable("did not answer as a store service")
        theirs = answer.get("nonce")
        theirs = theirs if isinstance(theirs, str) else ""
        if "e" in answer:
            kind, message = str(answer["e"]), str(answer.get("m", ""))
            if wire.proves(token, f"refusal {kind} {message}", ours, theirs,
                           answer.get("proof")):
                return {"e": kind, "m": message}
            raise ServiceUnavailable(f"refused this client without proving it holds the token "
                                     f"in {self.token_file} ({wire.shown(message, 200)}): not "
                                     "taken as the run's store service's answer")
        if not wire.proves(token, "service", ours, theirs, answer.get("proof")):
            # Not the run's service (a process that took its port after a restart): nothing
            # is sent to it, and the address is read again on the next try.
            raise ServiceUnavailable(f"did not prove it holds the token in {self.token_file} "
                                     "(a process that took the run's store service's port, or a "
                                     "token file that is not the run's); nothing was sent to it")
        proofs = {"proof": wire.proof(token, "client", theirs, ours)}
        if self.primary_token:
            proofs["primary"] = wire.proof(self.primary_token, "primary", theirs, ours)
        sock.sendall(wire.encode(proofs))
        answer, _ = wire.read_frame(sock, wire.MAX_GREETING)
        if not isinstance(answer, dict) or not ("v" in answer or "e" in answer):
            raise ServiceUnavailable(f"a last greeting that is not this protocol's "
                                     f"({wire.shown(answer, 100)})")
        return answer

    def _call(self, op: str, sent: dict[str, Any], deadline_s: float | None = None) -> Any:
        """Send one call (its arguments by name, as they travel) and return its value as it
        came, riding out the service's outages; a try unanswered after ``deadline_s`` is given
        up and sent again on a new connection."""
        if self.closed:
            raise StoreError(f"store {self.url} is closed")
        request = wire.encode({"op": op, "a": sent})
        again = None
        started = time.monotonic()
        delay = 0.1
        failed: BaseException | None = None
        while True:
            try:
                answer, size = self._once(request, deadline_s)
            except ServiceUnavailable as exc:
                failed = exc
                waited = time.monotonic() - started
                if waited >= OUTAGE_NOTICE_S and not self._said:
                    self._said = True
                    log.warning("store service unavailable (%s); retrying for up to %.0f s "
                                "(%s sets how long)", exc, self.retry_s, RETRY_ENV)
                if waited + delay > self.retry_s:
                    raise StoreError(f"store service unreachable for {self.retry_s:.0f} s: "
                                     f"{exc}; check that the run's primary (`automlperf run`, "
                                     "which starts it) is running, and its log "
                                     f"({RETRY_ENV} sets how long to wait)") from None
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, BACKOFF_MAX_S)
                if again is None:
                    # Sent again: its first try may have been carried out, unanswered.
                    again = request = wire.encode({"op": op, "a": sent, "r": True})
                continue
            self.calls[op] += 1
            self.bytes_out[op] += len(request)
            self.bytes_in[op] += size
            if failed is not None:
                self.restored_at = time.time()
                self._said = False
            if not isinstance(answer, dict) or not ("v" in answer or "e" in answer):
                raise StoreError(f"the store service answered {op} with "
                                 f"{wire.shown(answer, 100)}: use the automlperf that started "
                                 "the run")
            if "e" in answer:
                kind, message = answer["e"], str(answer.get("m", ""))
                if kind == "schema":
                    raise SchemaMismatch(message)
                if kind == "value":
                    raise ValueError(message)
                raise StoreError(message)
            served = answer.get("s") or 0.0
            if isinstance(served, (int, float)) and served > self.restored_at:
                self.restored_at = served  # the service's own outage (a restart, a stall)
            return answer["v"]

    def _once(self, request: bytes, deadline_s: float | None = None) -> tuple[Any, int]:
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            sock = self._connect(deadline_s)
        try:
            if deadline_s is not None:
                sock.settimeout(deadline_s)
            sock.sendall(request)
            answer = wire.read_frame(sock)
            if deadline_s is not None:
                sock.settimeout(self.retry_s + 60.0)
        except (OSError, ValueError) as exc:
            sock.close()
            raise ServiceUnavailable(str(exc) or type(exc).__name__) from None
        with self._lock:
            if self.closed or len(self._idle) >= KEEP:
                sock.close()
            else:
                self._idle.append(sock)
        return answer

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    # --- the calls ----------------------------------------------------------------------------
    def _forward(self, name: str, /, *positional: Any, deadline_s: float | None = None,
                 **named: Any) -> Any:
        """Store's call ``name``, made on the service: its arguments bound by Store's
        signature and sent by name, its value unpacked by its declared return type (a bulk
        read of a finished run goes to ``direct`` where there is one)."""
        if name in DIRECT and self.direct is not None:
            return getattr(self.direct, name)(*positional, **named)
        call = CALLS[name]
        value = self._call(name, call.sent(*positional, **named), deadline_s=deadline_s)
        return value if call.decode_value is None else call.decode_value(value)

    def heartbeat(self, replica_id: int, now: float, lease_s: float) -> SegmentRecord | None:
        return self._forward("heartbeat", replica_id, now, lease_s,
                             deadline_s=max(HEARTBEAT_MIN_S, lease_s / 4))

    def add_samples(self, run_id: int, node: str, samples: list[dict[str, Any]]) -> None:
        if samples:
            self._forward("add_samples", run_id, node, samples)

    def sample_figure_chunks(self, run_id: int,
                             nodes: Sequence[str] | None = None) -> Iterator[list[SampleFigures]]:
        if self.direct is not None:
            return self.direct.sample_figure_chunks(run_id, nodes)
        return super().sample_figure_chunks(run_id, nodes)

    def sample_nodes(self, run_id: int) -> dict[str, int]:
        if self.direct is not None:
            return self.direct.sample_nodes(run_id)
        return super().sample_nodes(run_id)

    def sample_texts(self, run_id: int) -> Iterator[list[tuple[str, str]]]:
        if self.direct is not None:
            return self.direct.sample_texts(run_id)
        return super().sample_texts(run_id)


def service_file(run_dir: Path | str) -> Path:
    return Path(run_dir) / SERVICE_FILE
