"""The store service attacked on its own port, as anyone who reaches it could: strangers
refused before they cost it memory, a connection that never greets closed, and calls that
are not this protocol's answered in one line while the run's own clients go on. A real
service on a real PostgreSQL server."""

import json
import math
import socket
import zlib

import psutil
import pytest

from automlperf.store.base import SCHEMA_VERSION
from automlperf.store.limits import MAX_IDS
from automlperf.store.service import wire
from door import wait_until
from helpers import call, handshake, new_claim

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

def address(service):
    found = json.loads(service.file.read_text())
    return found["host"], found["port"], service.token_file.read_text().strip()


def connect(service):
    host, port, _ = address(service)
    sock = socket.create_connection((host, port), timeout=120)
    return sock


def closed(sock, limit=120.0):
    """Whether the service closed ``sock`` (what it sent before is read and dropped)."""
    sock.settimeout(limit)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    return True


def greet(service, token=None):
    """A connection past the greeting, proving the run's token (or ``token``): it and the
    service's last answer."""
    sock = connect(service)
    _, _, right = address(service)
    return sock, handshake(sock, right if token is None else token)


def rss(service):
    return psutil.Process(service.proc.pid).memory_info().rss


def peak(service, reset=False):
    """The service's peak resident memory since the last reset (the kernel's high-water
    mark: what an attack cost at its height, not what is left once it is over)."""
    if reset:
        with open(f"/proc/{service.proc.pid}/clear_refs", "w") as f:
            f.write("5")
    with open(f"/proc/{service.proc.pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def flood(sock, size):
    """Send ``size`` bytes on ``sock`` unless the service closes it first: the bytes it sent."""
    sent, chunk = 0, b"x" * (1 << 20)
    try:
        while sent < size:
            sent += sock.send(chunk)
    except OSError:
        pass
    return sent


def bomb(size=1 << 30):
    """A zlib stream of ``size`` zero bytes: about a thousandth of that on the wire."""
    squeeze = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    out = [squeeze.compress(chunk) for _ in range(size >> 20)]
    return b"".join(out) + squeeze.flush()


def test_strangers_are_refused_before_they_cost_the_service_memory(service, served):
    remote, direct = served
    slow = connect(service)
    slow.sendall(b"\x00")  # one byte of a header, and nothing more: never greets
    squeezed = bomb()
    assert len(squeezed) < 2 << 20
    before = peak(service, reset=True)
    # Before anyone is known, a header announcing 1 GiB and 256 MiB of it: refused from its
    # header (the rest is never read), whatever the greeting's deadline.
    sock = connect(service)
    sock.sendall(wire.HEADER.pack(1 << 30, 0))
    assert flood(sock, 256 << 20) < 256 << 20 and closed(sock)

    for token in ("wrong", ""):
        sock, answer = greet(service, token)
        assert answer["e"] == "protocol" and "wrong token" in answer["m"]
        assert closed(sock)
    sock = connect(service)
    sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION}))  # no nonce
    assert "without its nonce" in wire.read_frame(sock)[0]["m"] and closed(sock)
    # A compressed greeting that would inflate to 1 GiB, and bytes that are not this
    # protocol.
    sock = connect(service)
    sock.sendall(wire.HEADER.pack(len(squeezed), 1) + squeezed)
    assert closed(sock)
    sock = connect(service)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed(sock)
    # A JSON nested 2,000 deep, and a proof that is not ASCII: closed, nothing raised past
    # the connection (no traceback per stranger in the log).
    sock = connect(service)
    sock.sendall(wire.encode_text("[" * 2000))
    assert closed(sock)
    sock = connect(service)
    ours = wire.nonce()
    sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION, "nonce": ours}))
    wire.read_frame(sock)
    sock.sendall(wire.encode({"proof": "é" * 64}))
    assert "wrong token" in wire.read_frame(sock)[0]["m"] and closed(sock)
    strangers = peak(service) - before
    # With the run's token: a compressed bomb as a call, and a call larger than any request.
    sock, answer = greet(service)
    assert "v" in answer
    sock.sendall(wire.HEADER.pack(len(squeezed), 1) + squeezed)
    assert closed(sock)
    sock, _ = greet(service)
    sock.sendall(wire.HEADER.pack(wire.MAX_REQUEST + 1, 0))
    assert flood(sock, 128 << 20) < 128 << 20 and closed(sock)

    # At their height: the strangers' attacks cost nothing to speak of; the run's token
    # holders' at most what a call may inflate to.
    assert strangers < 32 << 20, f"the strangers' attacks took {strangers >> 20} MiB at most"
    assert peak(service) - before < 2 * wire.MAX_REQUEST + (64 << 20)
    assert closed(slow, limit=600)  # the greeting's deadline closed it
    log = (service.logs / "store-service.log").read_text()
    assert "no greeting within" in log and "inflating past" in log
    assert "Traceback" not in log
    assert service.restarts == 0  # the same service serves the run's own client
    run_id = remote.create_run("r", {}, {}, 3600.0, 1.0)
    seg = remote.start_segment(run_id, 1.0, 3600.0)
    assert remote.register_replica(run_id, 0, seg, "n0", 1, [], 1.0) > 0


def test_calls_that_are_not_this_protocols_get_one_line_and_the_service_goes_on(service, served):
    """A client of the run (its token) sending calls a version-skewed or broken replica
    could: each gets an error in one line; the writes before and after are stored, by the
    same service process."""
    remote, direct = served
    run_id = remote.create_run("r", {}, {}, 3600.0, 1.0)
    seg = remote.start_segment(run_id, 1.0, 3600.0)
    rep = remote.register_replica(run_id, 0, seg, "n0", 1, [], 1.0)
    other = remote.register_replica(run_id, 1, seg, "n1", 2, [], 1.0)
    first = remote.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                         graph_hash="a", now=2.0, lease_s=600.0))
    pid = service.proc.pid
    sock, _ = greet(service)  # a replica's connection: the run's token, not the primary's
    bad = [
        # The primary's calls: a broken replica would fail every running trial, rewrite the
        # run or end its session.
        {"op": "expire_leases", "a": {"run_id": run_id, "now": math.inf}},
        {"op": "extend_run", "a": {"run_id": run_id, "duration_s": 1e9, "config": {},
                                   "system": {}}},
        {"op": "create_run", "a": {"name": "r2", "config": {}, "system": {}, "duration_s": 60.0,
                                   "now": 1.0}},
        {"op": "start_segment", "a": {"run_id": run_id, "now": 1.0, "deadline_at": 2.0}},
        {"op": "touch_segment", "a": {"run_id": run_id, "index": seg, "now": 1e12}},
        {"op": "end_segment", "a": {"run_id": run_id, "index": seg, "ended_at": 1.0}},
        # Values that would poison the search, or hold the service's event loop.
        {"op": "finish_trial", "a": {"trial_id": first, "status": "completed", "now": 3.0,
                                     "best_accuracy": math.nan}},
        {"op": "finish_trial", "a": {"trial_id": first, "status": "completed", "now": 3.0,
                                     "best_accuracy": 1.5}},
        {"op": "changes", "a": {"run_id": run_id, "after": 10**12, "also": [0] * (MAX_IDS + 1)}},
        {"op": "graphs", "a": {"trial_ids": list(range(70_000))}},
        {"op": "heartbeat", "a": {"replica_id": rep}},  # too few arguments
        {"op": "heartbeat", "a": {"replica_id": rep, "now": 1.0, "lease_s": 60.0, "x": 4}},
        {"op": "heartbeat", "a": [rep, 1.0, 60.0]},  # by position, as protocol 3 sent them
        {"op": "heartbeat", "a": {"replica_id": rep, "now": "soon", "lease_s": {"x": 1}}},
        {"op": "end_replica", "a": {"replica_id": {"id": rep}, "status": "stopped", "now": 3.0}},
        {"op": "finish_trial", "a": {"trial_id": first, "status": ["completed"], "now": 3.0}},
        {"op": "claim_trial", "a": {"claim": [run_id, rep]}},  # another protocol's shape
        {"op": "record_epoch", "a": {"epoch": [1, 2, 3]}},
        {"op": "touch_segment", "a": {"run_id": run_id, "index": "zero", "now": None}},
        {"op": "no_such_call", "a": {}},
        {"op": "heartbeat", "a": "not an object"},
        {"op": "open", "a": {"self": 1}},
        ["not", "a", "call"],
    ]
    for message in bad:
        answer = call(sock, message)
        assert set(answer) == {"e", "m"}, (str(message)[:100], answer)
        assert "\n" not in answer["m"] and len(answer["m"]) < 400, answer
    said = [call(sock, m)["m"] for m in bad[:1] + bad[6:7]]
    assert said == ["expire_leases is the primary's call, and this connection did not prove "
                    "the primary's token",
                    "finish_trial: best_accuracy is float 'nan', not a number (finite, from 0 "
                    "to 1) or null"]
    # A time as a whole number beside another replica's float: both written by the next
    # flush of the heartbeats (one array of one type), which goes on.
    assert "v" in call(sock, {"op": "heartbeat", "a": {"replica_id": rep, "now": 1_700_000_000,
                                                 "lease_s": 60}})
    remote.heartbeat(other, 1_700_000_000.5, 60.0)

    def flushed():
        beats = {r.id: r.last_heartbeat for r in direct.replicas(run_id)}
        return beats == {rep: 1_700_000_000.0, other: 1_700_000_000.5}

    wait_until(flushed, what="the heartbeats' flush")
    second = remote.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                          graph_hash="b", now=2.0, lease_s=600.0))
    assert remote.finish_trial(second, "completed", 3.0, best_accuracy=0.5)
    assert service.proc.pid == pid and service.restarts == 0
    trials = {t.graph_hash: t for t in direct.trials(run_id)}
    assert set(trials) == {"a", "b"}
    assert (trials["a"].status, trials["a"].best_accuracy) == ("running", None)
    assert [s.ended_at for s in direct.segments(run_id)] == [None]
    sock.close()
    log = (service.logs / "store-service.log").read_text()
    assert "heartbeats could not be written" not in log


def test_idle_slow_and_deaf_clients_cost_the_service_little_and_the_run_goes_on(service,
                                                                                served):
    """5,000 connections that never greet; a client of the run's that sends its call a few
    bytes at a time; one that sends calls and never reads the answers: the service's memory
    stays bounded, the run's own client is served throughout, and the slow call is answered
    once it has all arrived."""
    import resource

    remote, direct = served
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 5_400:
        pytest.skip(f"this machine's open-file limit ({hard}) holds fewer than 5,000 sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run_id = remote.create_run("r", {}, {}, 3600.0, 1.0)
    seg = remote.start_segment(run_id, 1.0, 3600.0)
    before = rss(service)
    idle = []
    try:
        for _ in range(5_000):
            idle.append(connect(service))
        # A call of the run's, its bytes a few at a time.
        slow, _ = greet(service)
        request = wire.encode({"op": "segments", "a": {"run_id": run_id}})
        slow.sendall(request[:3])
        # A client that asks for the run's replicas again and again and never reads.
        deaf, _ = greet(service)
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.settimeout(120)
        asks = wire.encode({"op": "replicas", "a": {"run_id": run_id}})
        for i in range(100):
            remote.register_replica(run_id, i, seg, f"n{i}", i, ["cpu"] * 64, 1.0)
        sent = 0
        deaf.setblocking(False)
        try:
            while sent < 4 << 20:  # until the service stops reading from it
                sent += deaf.send(asks)
        except BlockingIOError:
            pass
        assert remote.register_replica(run_id, 100, seg, "n100", 100, [], 1.0) > 0
        assert len(direct.replicas(run_id)) == 101
        for i in range(3, len(request)):
            slow.sendall(request[i:i + 1])
        answer = wire.read_frame(slow)[0]
        assert [s[1] for s in answer["v"]] == [seg]
        grown = rss(service) - before
    finally:
        for sock in idle:
            sock.close()
    assert grown < 256 << 20, f"the service grew by {grown >> 20} MiB"
    assert service.restarts == 0
    deaf.close()
    slow.close()


class HalfOpen:
    """A TCP relay to the service whose connections can be made half-open at once: from then
    on nothing goes through them either way, and nobody is told, as when the path to a host
    drops (a switch, a firewall's state table) without a reset. New connections still pass."""

    def __init__(self, target):
        import threading

        self.target, self.cut, self.accepted = target, threading.Event(), 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while True:
            inside, _ = self.listener.accept()
            self.accepted += 1
            outside = socket.create_connection(self.target)
            cut = self.cut.is_set()  # a connection made after the cut passes
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(a, b, cut), daemon=True).start()

    def _pump(self, source, sink, already_cut):
        while True:
            data = source.recv(1 << 16)
            if not data:
                return
            if self.cut.is_set() and not already_cut:
                continue  # swallowed: the connection is half-open from here on
            sink.sendall(data)


def test_a_heartbeat_on_a_half_open_connection_is_sent_again_on_a_new_one(service, pg_url,
                                                                          tmp_path):
    """A heartbeat has a deadline of its own (a quarter of the lease, at least 5 s): one sent
    on a connection that silently went dead is given up and sent again on a new connection
    while its lease still holds, rather than after the socket's timeout (the store's retry
    time and a minute: 11 minutes here), by which time the replica's trials would have been
    expired."""
    import threading

    from automlperf.store import open_store
    from automlperf.store.service.client import RemoteStore

    host, port, _ = address(service)
    relay = HalfOpen((host, port))
    relayed = tmp_path / "relayed.json"
    relayed.write_text(json.dumps({**json.loads(service.file.read_text()), "host": "127.0.0.1",
                                   "port": relay.port}))
    direct = open_store(pg_url)
    remote = RemoteStore(relayed, service.token_file, retry_s=600)
    try:
        run_id = direct.create_run("r", {}, {}, 3600.0, 1.0)
        seg = direct.start_segment(run_id, 1.0, 3600.0)
        rep = remote.register_replica(run_id, 0, seg, "n0", 1, [], 1.0)
        assert remote.heartbeat(rep, 2.0, 20.0) is not None and relay.accepted == 1
        relay.cut.set()
        done = []
        beat = threading.Thread(target=lambda: done.append(remote.heartbeat(rep, 3.0, 20.0)),
                                daemon=True)
        beat.start()
        beat.join(timeout=300)  # generous: given up after 5 s; without a deadline, 660 s
        assert done and done[0] is not None, "the heartbeat waited on the dead connection"
        assert relay.accepted == 2  # sent again on a new connection, which passed
    finally:
        remote.close()
        direct.close()
