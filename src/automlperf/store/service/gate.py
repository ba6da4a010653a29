"""The store service's door: which connections it holds. Anyone may open one and must
greet within its share of a room of its own; a connection that proved the run's token has a
slot of the rest, its host's share limited, this host's sized by the run's replicas. What it
refuses or closes, it logs at most once a minute per kind (strangers decide how often)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from automlperf.store.connections import greeting_room

log = logging.getLogger("automlperf.store.service")

# Connections still greeting, in all (connections.GREETING_ROOM, or half the room for
# connections where that is less), and from any one other host: anyone may open them, so they
# never take a slot of the connections that proved the run's token, and a full share closes
# its oldest (someone holding them must keep opening new ones faster than an honest client
# greets).
GREETING_PER_PEER = 32
# Connections that proved the run's token any one other host may hold: a node's replicas
# keep one each (two while two threads call at once); more is a broken client exhausting
# the service's files. This host's are sized by the run's replicas (any may run here).
PER_PEER = 256
# The share of connections of this host (loopback, or one of its own addresses), however
# few replicas the run has here: the primary's own.
HERE_SPARE = 16
HERE = "this host"
# How often a line of one kind about strangers (refused, closed, evicted) is logged, at most.
REFUSALS_LOGGED_S = 60.0


class Said:
    """Lines of one kind logged at most once per ``every`` seconds, each with how many were
    not: strangers decide how often they happen, and the log sits on a shared file system."""

    def __init__(self, every: float = REFUSALS_LOGGED_S) -> None:
        self.every = every
        self.last: dict[str, float] = {}
        self.unsaid: Counter[str] = Counter()

    def __call__(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last.get(kind, float("-inf")) < self.every:
            self.unsaid[kind] += 1
            return
        self.last[kind] = now
        more = self.unsaid.pop(kind, 0)
        log.warning(message + (f" (and {more} more like it since the last)" if more else ""),
                    *args)


@dataclass(eq=False)
class Ticket:
    """One connection's place at the gate: its host (as the gate counts hosts) and how to
    close it if it must make room (``gone`` once it was)."""

    key: str
    close: Callable[[], None]
    proven: bool = False
    gone: bool = False
    wrapping: bool = False  # its streams are being made: closed once they are


class _Room:
    """Connections still greeting, oldest first: in all, and those that have sent nothing."""

    def __init__(self) -> None:
        self.all: dict[Ticket, None] = {}
        self.silent: dict[Ticket, None] = {}

    def oldest(self) -> Ticket:
        """The one to close for a newer one: the oldest that has said nothing (a client of
        the run's greets as it connects), else the oldest."""
        return next(iter(self.silent or self.all))


class Gate:
    """Which connections are held, in two rooms that share no slot: connections still greeting
    (anyone's: at most ``greeting_room(total)`` in all and ``GREETING_PER_PEER`` from one
    host, the oldest, silent ones first, closed to admit a newer one), and connections that
    proved the run's token (the rest of ``total``, at most ``PER_PEER`` from one other host).
    This host counts as one host whatever its address (any of 127.0.0.0/8, its own
    addresses), its shares sized by the run's ``replicas`` (None: not known, only the total
    holds its proven ones); another IPv6 host by its /64."""

    def __init__(self, total: int, replicas: int | None = None,
                 own: frozenset[str] | None = None) -> None:
        self.greeting_room = greeting_room(total)
        self.room = max(1, total - self.greeting_room)
        self.replicas = replicas
        self.own = own_addresses() if own is None else own
        self.greeting = _Room()
        self.greeting_from: dict[str, _Room] = {}
        self.held: Counter[str] = Counter()  # proven connections by host
        self.held_total = 0
        self.refused = 0
        self.evicted = 0
        self.said = Said()

    def _greeting_share(self, key: str) -> int:
        if key == HERE:
            return GREETING_PER_PEER + HERE_SPARE + 2 * (self.replicas or 0)
        return GREETING_PER_PEER

    def _share(self, key: str) -> int | None:
        if key != HERE:
            return PER_PEER
        return None if self.replicas is None else PER_PEER + HERE_SPARE + 2 * self.replicas

    def admit(self, host: str, close: Callable[[], None]) -> Ticket:
        """A new connection from ``host``, always admitted to greet: the oldest still greeting
        (its host's, when its share is full; anyone's, when the room is) is closed for it."""
        ticket = Ticket(host_key(host, self.own), close)
        mine = self.greeting_from.setdefault(ticket.key, _Room())
        if len(mine.all) >= self._greeting_share(ticket.key):
            self._evict(mine.oldest(), host)
        if len(self.greeting.all) >= self.greeting_room:
            self._evict(self.greeting.oldest(), host)
        for room in (self.greeting, mine):
            room.all[ticket] = room.silent[ticket] = None
        return ticket

    def spoke(self, ticket: Ticket) -> None:
        """``ticket``'s connection has sent its greeting."""
        self.greeting.silent.pop(ticket, None)
        mine = self.greeting_from.get(ticket.key)
        if mine is not None:
            mine.silent.pop(ticket, None)

    def _evict(self, oldest: Ticket, host: str) -> None:
        self._forget(oldest)
        self.evicted += 1
        self.said("evicted", "closed connections still greeting to admit newer ones (%d still "
                  "greeting in all at most, %d from one host): %d so far, the last for %s",
                  self.greeting_room, GREETING_PER_PEER, self.evicted, host or "an unknown peer")
        oldest.close()

    def _forget(self, ticket: Ticket) -> None:
        if self.greeting.all.pop(ticket, 0) is None:
            self.greeting.silent.pop(ticket, None)
            mine = self.greeting_from[ticket.key]
            del mine.all[ticket]
            mine.silent.pop(ticket, None)
            if not mine.all:
                del self.greeting_from[ticket.key]

    def proven(self, ticket: Ticket, host: str) -> bool:
        """Whether ``ticket``'s connection, which has proved the run's token, has a slot of
        its own; if not, it is refused."""
        self._forget(ticket)
        share = self._share(ticket.key)
        if self.held_total >= self.room or (
                share is not None and self.held[ticket.key] >= share):
            self.refused += 1
            self.said("refused", "refused connections over the limits (%d in all, %d from one "
                      "other host): %d so far, the last from %s", self.room, PER_PEER,
                      self.refused, host or "an unknown peer")
            return False
        self.held[ticket.key] += 1
        self.held_total += 1
        ticket.proven = True
        return True

    def leave(self, ticket: Ticket) -> None:
        if ticket.proven:
            ticket.proven = False
            self.held_total -= 1
            self.held[ticket.key] -= 1
            if self.held[ticket.key] <= 0:
                del self.held[ticket.key]
        elif ticket in self.greeting.all:
            self._forget(ticket)


def host_key(host: str, own: frozenset[str] = frozenset()) -> str:
    """The host a peer's address counts as: ``HERE`` for this host's (loopback, or one of
    ``own``), an IPv6 host's /64 (one host may hold all of it), else the address."""
    try:
        ip: Any = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host or "?"
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or str(ip) in own:
        return HERE
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def own_addresses() -> frozenset[str]:
    """This host's own addresses: a connection from one of them is this host's."""
    import psutil

    return frozenset(a.address.split("%")[0] for addresses in psutil.net_if_addrs().values()
                     for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6))
