"""The store service's door (store/service/net.py) in the test's own process, each defence on
its own: the greeting's size limit and its ban on compression, keepalive, two rooms of
connections that share no slot (strangers still greeting, and the run's own), every host's
shares counted by the host it is (this host's loopback addresses as one, other hosts from
addresses of their own in a network namespace), the primary's own token, lines about
strangers said once a minute, and the service's ticker, which survives any failure."""

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import zlib

import pytest

from automlperf.store.base import SCHEMA_VERSION
from automlperf.store.service import net, wire
from automlperf.store.service import gate as gate_module
from automlperf.store.service.gate import GREETING_PER_PEER, HERE, HERE_SPARE, PER_PEER, Gate, Said, host_key
from door import PRIMARY, TOKEN, Door, received, wait_until
from helpers import handshake


@pytest.fixture
def door():
    opened = Door()
    yield opened
    opened.close()


def hello(nonce=None, **extra):
    return {"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION, "nonce": nonce or wire.nonce(),
            **extra}


def test_each_address_counts_as_the_host_it_is():
    own = frozenset({"192.0.2.2", "2001:db8::2"})
    for here in ("127.0.0.1", "127.0.0.2", "127.9.8.7", "::1", "::ffff:127.0.0.1", "192.0.2.2",
                 "::ffff:192.0.2.2", "2001:db8::2"):
        assert host_key(here, own) == HERE, here
    assert host_key("198.51.100.7", own) == "198.51.100.7"
    # An IPv6 host may hold all of its /64.
    assert host_key("2001:db8:1:2::7", own) == host_key("2001:db8:1:2:ffff::9", own) == \
        "2001:db8:1:2::/64"
    assert host_key("2001:db8:1:3::7", own) != host_key("2001:db8:1:2::7", own)


def test_strangers_greeting_never_take_a_proven_slot_and_the_oldest_make_room():
    closed = []
    gate = Gate(total=100, replicas=None, own=frozenset())
    assert (gate.greeting_room, gate.room) == (50, 50)

    def admit(host):
        return gate.admit(host, lambda: closed.append(host))

    # One host's share of connections still greeting: a newer one closes its oldest.
    first = [admit("198.51.100.7") for _ in range(GREETING_PER_PEER)]
    assert not closed
    newer = admit("198.51.100.7")
    assert closed == ["198.51.100.7"] and first[0] not in gate.greeting.all
    assert len(gate.greeting_from["198.51.100.7"].all) == GREETING_PER_PEER
    # The room for them all: once full, the oldest of anyone's closes for a newer one.
    others = [admit(f"198.51.100.{i}") for i in range(10, 10 + 50 - GREETING_PER_PEER)]
    assert len(gate.greeting.all) == 50 and len(closed) == 1
    others.append(admit("198.51.100.99"))
    assert len(closed) == 2 and first[1] not in gate.greeting.all
    # Strangers hold every slot for greeting; the run's own still get in (each closing a
    # stranger's oldest) and, proven, take slots of their own room.
    proven = [admit("203.0.113.5") for _ in range(20)]
    assert len(closed) == 22
    assert all(gate.proven(t, "203.0.113.5") for t in proven)
    assert len(gate.greeting.all) == 30 and gate.held["203.0.113.5"] == 20
    # ... up to their own room, however many are still greeting.
    more = [admit(f"203.0.113.{i}") for i in range(6, 36)]
    assert all(gate.proven(t, "") for t in more)
    assert not gate.proven(admit("203.0.113.99"), "203.0.113.99")
    assert sum(gate.held.values()) == 50 and gate.refused == 1
    for t in [newer, *first, *others, *proven, *more]:
        gate.leave(t)
    assert not gate.held and not gate.greeting.all and not gate.greeting_from
    assert not gate.greeting.silent and gate.held_total == 0


def test_a_connection_that_greeted_outlasts_those_that_say_nothing():
    """A client of the run's sends its greeting as it connects: a stranger's silent
    connections, however many it opens after, are closed before it."""
    closed = []
    gate = Gate(total=1000, replicas=None, own=frozenset())
    silent = [gate.admit("198.51.100.7", lambda: closed.append("silent"))
              for _ in range(GREETING_PER_PEER - 1)]
    honest = gate.admit("198.51.100.7", lambda: closed.append("honest"))
    gate.spoke(honest)
    for _ in range(3 * GREETING_PER_PEER):
        gate.admit("198.51.100.7", lambda: closed.append("silent"))
    assert set(closed) == {"silent"} and honest in gate.greeting.all
    assert silent[0] not in gate.greeting.all and gate.proven(honest, "198.51.100.7")


def test_this_hosts_shares_are_sized_by_the_runs_replicas():
    gate = Gate(total=100_000, replicas=100, own=frozenset())
    assert gate._greeting_share(HERE) == GREETING_PER_PEER + HERE_SPARE + 200
    assert gate._share(HERE) == PER_PEER + HERE_SPARE + 200
    assert gate._share("198.51.100.7") == PER_PEER
    assert Gate(total=100_000)._share(HERE) is None  # a run of unknown size: the total


def test_a_greeting_over_its_size_is_refused_from_its_header(door):
    """A well-formed greeting one byte over the limit gets nothing: refused from its header,
    before its bytes are read (without the limit, the service would answer it)."""
    text = json.dumps(hello(pad=""), separators=(",", ":"))
    text = json.dumps(hello(pad="x" * (wire.MAX_GREETING + 1 - len(text))), separators=(",", ":"))
    assert len(text) == wire.MAX_GREETING + 1
    sock = door.connect()
    sock.sendall(wire.HEADER.pack(len(text), 0) + text.encode())
    assert received(sock) == b""
    # The same greeting within the limit is answered.
    sock = door.connect()
    sock.sendall(wire.encode(hello(pad="x" * 100)))
    assert "proof" in wire.read_frame(sock)[0]
    sock.close()


def test_a_compressed_greeting_is_refused(door):
    """A greeting that would inflate is not inflated: before anyone is known nothing is
    (without the ban, this one, 60 bytes that inflate to 4 KiB, would be answered)."""
    squeezed = zlib.compress(json.dumps(hello(pad=" " * 3900)).encode())
    assert len(squeezed) < 200
    sock = door.connect()
    sock.sendall(wire.HEADER.pack(len(squeezed), wire.COMPRESSED) + squeezed)
    assert received(sock) == b""


def test_both_sides_keep_their_connections_alive(door, tmp_path):
    """TCP keepalive on the service's side and the client's: a node that vanished without
    a word is noticed in about two minutes."""
    from automlperf.store.service.client import RemoteStore

    remote = RemoteStore(door.service_file(tmp_path), retry_s=60.0)
    try:
        sides = [remote._idle[0], *door.on_loop(lambda: [
            w.get_extra_info("socket") for w in door.calls.clients])]
        assert len(sides) == 2
        for sock in sides:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 6
    finally:
        remote.close()


def test_loopback_peers_count_as_this_one_host(monkeypatch):
    """A local user's connections from 127.0.0.2, .3, ... are this host's, within its share of
    connections still greeting; the oldest make room, so the run's own client still greets."""
    monkeypatch.setattr(net, "GREETING_S", 3600.0)  # closed for room, not for time
    door = Door()
    share = door.gate._greeting_share(HERE)
    strangers = [door.connect(f"127.0.0.{2 + i % 50}") for i in range(share + 60)]
    wait_until(lambda: door.on_loop(lambda: door.gate.evicted) == 60, what="60 closed")
    assert door.greeting_from() == {HERE: share}
    own = door.connect()
    assert "v" in handshake(own, TOKEN)
    assert door.held() == {HERE: 1}
    assert received(strangers[0]) == b""  # the oldest, closed
    for sock in [own, *strangers]:
        sock.close()
    door.close()


def test_the_primary_proves_a_token_of_its_own(door):
    for primary, role in ((None, "replica"), (PRIMARY, "primary")):
        sock = door.connect()
        assert handshake(sock, TOKEN, primary)["v"]["role"] == role
        sock.sendall(wire.encode({"op": "x", "a": []}))
        assert wire.read_frame(sock)[0]["v"] == {"role": role}
        sock.close()
    sock = door.connect()
    assert "not this run's primary" in handshake(sock, TOKEN, TOKEN)["m"]
    sock.close()


def test_lines_about_strangers_are_said_once_a_minute(door, caplog):
    caplog.set_level(logging.WARNING, logger="automlperf.store.service")
    for _ in range(20):
        sock = door.connect()
        assert "wrong token" in handshake(sock, "not the token")["m"]
        sock.close()
        sock = door.connect()
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"\n" * 20)
        assert received(sock) == b""
    wait_until(lambda: door.on_loop(lambda: sum(door.gate.said.unsaid.values())) == 38,
               what="every refusal counted")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("refused a client" in line for line in lines) == 1
    assert sum("closed a connection" in line for line in lines) == 1
    said = Said(every=0.0)
    with caplog.at_level(logging.WARNING):
        said("x", "one %s", "line")
    assert caplog.records[-1].getMessage() == "one line"


NAMESPACE_CLIENT = textwrap.dedent("""
    import json, signal, socket, sys
    sys.path.insert(0, sys.argv[1])
    from helpers import handshake
    signal.alarm(300)  # self-stopping, whatever the test does
    host, port, token, per_peer = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])

    def connect(source):
        sock = socket.socket()
        sock.settimeout(120)
        sock.bind((source, 0))
        sock.connect((host, port))
        return sock

    idle = [connect(sys.argv[6]) for _ in range(60)]
    answers = []
    proven = []
    for _ in range(per_peer + 1):
        sock = connect(sys.argv[6])
        answers.append(sorted(handshake(sock, token)))
        proven.append(sock)
    other = connect(sys.argv[7])
    answers.append(sorted(handshake(other, token)))
    print(json.dumps(answers), flush=True)
    sys.stdin.readline()  # held until the test has looked
""")


@pytest.fixture
def namespace():
    """A network namespace of this test's own, joined to this host by a veth pair: this side
    198.18.N.1, the other side 198.18.N.2 and .3 (a benchmarking range no network uses), as
    two other hosts would reach the service. Removed afterwards."""
    tag = os.getpid() % 250
    name, here, there = f"amp-door-{os.getpid()}", f"ampd{os.getpid() % 100000}h", \
        f"ampd{os.getpid() % 100000}n"
    subnet = f"198.18.{tag}"

    def ip(*args, inside=False):
        prefix = ["ip", "netns", "exec", name] if inside else []
        return subprocess.run([*prefix, "ip", *args], capture_output=True, text=True, timeout=60)

    made = ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"network namespaces are unavailable here ({made.stderr.strip()}): the "
                    "per-host caps need other addresses than this host's")
    try:
        for step in (ip("link", "add", here, "type", "veth", "peer", "name", there),
                     ip("link", "set", there, "netns", name),
                     ip("addr", "add", f"{subnet}.1/24", "dev", here),
                     ip("link", "set", here, "up"),
                     ip("addr", "add", f"{subnet}.2/24", "dev", there, inside=True),
                     ip("addr", "add", f"{subnet}.3/24", "dev", there, inside=True),
                     ip("link", "set", there, "up", inside=True),
                     ip("link", "set", "lo", "up", inside=True)):
            assert step.returncode == 0, step.stderr
        yield name, subnet
    finally:
        ip("link", "del", here)
        ip("netns", "del", name)


def test_each_other_host_holds_its_own_share_of_connections(namespace, monkeypatch):
    """From another host (an address of its own, in a network namespace): 60 connections
    that never greet keep at most its share open, the oldest closed for newer ones; its
    proven connections stop at its share (the next is refused in one line); and a second
    host beside it greets and is served throughout."""
    name, subnet = namespace
    monkeypatch.setattr(gate_module, "PER_PEER", 4)
    monkeypatch.setattr(net, "GREETING_S", 3600.0)  # closed for room, not for time
    opened = Door(host=f"{subnet}.1")
    try:
        client = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", NAMESPACE_CLIENT,
             os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f"{subnet}.1",
             str(opened.port), TOKEN, "4", f"{subnet}.2", f"{subnet}.3"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = client.stdout.readline()
            assert line, client.stderr.read()
            answers = json.loads(line)
            assert answers == [["v"]] * 4 + [["e", "m"]] + [["v"]]
            # Of the 60 idle, all but the share closed for newer ones (the first to greet
            # found the share full too); each that greeted left the greeting room.
            assert opened.on_loop(lambda: opened.gate.evicted) == \
                60 + 1 - GREETING_PER_PEER
            assert opened.greeting_from() == {f"{subnet}.2": GREETING_PER_PEER - 1}
            assert opened.held() == {f"{subnet}.2": 4, f"{subnet}.3": 1}
        finally:
            client.communicate("done\n", timeout=120)
    finally:
        opened.close()


class Beating:
    """What the ticker flushes: ``failures`` failed flushes (of any kind), then good ones."""

    times_file = None

    def __init__(self, failures):
        self.failures = failures
        self.flushes = 0
        self.restored_at = 0.0
        self.times = None

    async def flush(self):
        self.flushes += 1
        if self.flushes <= self.failures:
            raise TypeError("cannot dump lists of mixed types")


def test_the_ticker_survives_any_failure_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(net, "TICK_S", 0.01)
    monkeypatch.setattr(net, "FLUSH_S", 0.0)
    caplog.set_level(logging.WARNING, logger="automlperf.store.service")
    beating = Beating(failures=3)

    async def watch():
        stop = asyncio.Event()
        task = asyncio.create_task(net.tick(beating, stop))
        while beating.flushes < 6:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 120)

    asyncio.run(watch())
    lines = [r.getMessage() for r in caplog.records]
    assert sum("heartbeats could not be written (TypeError" in line for line in lines) == 1
    assert sum("written again after 3 failed flushes" in line for line in lines) == 1


def test_a_task_the_service_needs_that_stops_stops_the_service(caplog):
    class Service:
        task_failed = None

    async def broken():
        raise RuntimeError("a bug")

    async def watch():
        stop = asyncio.Event()
        net.watched(Service, asyncio.create_task(broken(), name="ticker"), stop)
        await asyncio.wait_for(stop.wait(), 120)

    asyncio.run(watch())
    assert isinstance(Service.task_failed, RuntimeError)
    assert "the store service's ticker stopped (RuntimeError: a bug)" in caplog.text


def test_a_writer_that_dies_stops_the_service_it_serves(tmp_path):
    """net.begin wires the writer's death to the service's stop, and net.end says why:
    the process exits, and its primary starts it again (a dead writer in a live service would
    leave every write waiting)."""
    from automlperf.store import StoreError, open_store
    from automlperf.store.service.db import Job
    from automlperf.store.service.server import Service

    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    service = Service(url, TOKEN)

    class Fatal(BaseException):
        pass

    def fatal(conn, again):
        raise Fatal("the writer's thread is gone")

    async def serve():
        stop = net.begin(service)
        service.writer.submit(Job(fatal, False, lambda value, error: None))
        await asyncio.wait_for(stop.wait(), 120)
        await net.end(service)

    with pytest.raises(StoreError, match="the store service's writer failed: Fatal"):
        asyncio.run(serve())
