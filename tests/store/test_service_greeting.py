"""The store service's greeting and its door: each side proves it holds the run's token
without sending it, so a process that took the service's port learns nothing and
acknowledges nothing; another protocol or schema is refused in one line naming both (and
proven); and no one holds more connections than the service has room for. A real service process,
on a real SQLite store."""

import json
import os
import socket
import sys
import threading

import pytest

from automlperf.store import open_store
from automlperf.store.base import SCHEMA_VERSION, SchemaMismatch, StoreError
from automlperf.store.service import wire
from automlperf.store.service.client import RemoteStore
from automlperf.store.service.process import ServiceProcess
from helpers import handshake

pytestmark = pytest.mark.slow


@pytest.fixture
def sqlite_service(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    started = ServiceProcess(tmp_path / "run", url)
    started.start()
    yield started
    started.stop()


def address(service):
    found = json.loads(service.file.read_text())
    return found["host"], found["port"]


def hello(service, **fields):
    """A raw connection that has sent a greeting of ``fields`` (over the right ones): it and
    the service's first answer."""
    sock = socket.create_connection(address(service), timeout=120)
    ours = wire.nonce()
    sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION, "nonce": ours,
                              **fields}))
    return sock, ours, wire.read_frame(sock)[0]


class Relay:
    """A TCP relay in front of the service that keeps every byte either way."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(self.target)
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            self.seen += data
            dst.sendall(data)


def greeted(host, port, token, primary=None):
    """A raw connection past the greeting, with ``token`` (and ``primary``'s)."""
    sock = socket.create_connection((host, port), timeout=120)
    assert "v" in handshake(sock, token, primary)
    return sock


def service_file_for(tmp_path, host, port, token):
    """A service file (and its token file) that sends a client to ``host:port``."""
    path = tmp_path / "elsewhere" / "store-service.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"host": host, "port": port}))
    (path.parent / ".store-service.token").write_text(token)
    return path


def test_the_service_and_its_clients_prove_the_token_without_sending_it(sqlite_service,
                                                                      tmp_path):
    token = sqlite_service.token_file.read_text().strip()
    relay = Relay(address(sqlite_service))
    remote = RemoteStore(service_file_for(tmp_path, "127.0.0.1", relay.port, token),
                         primary_token=sqlite_service.primary_token)
    try:
        run_id = remote.create_run("r", {}, {}, 3600.0, 1.0)
        assert remote.start_segment(run_id, 1.0, 3600.0) == 0
    finally:
        remote.close()
    assert b'"proof"' in relay.seen  # the greeting went through the relay
    assert token.encode() not in relay.seen
    assert sqlite_service.primary_token.encode() not in relay.seen


def test_a_process_on_the_services_port_that_cannot_prove_the_token_gets_nothing(tmp_path):
    """What took the port of a restarted service answers the greeting as a service would,
    but cannot prove the token: the client sends it no proof and no call, and gives up in
    one line once the store's retry time is spent."""
    impostor = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def pose():
        while True:
            try:
                conn, _ = impostor.accept()
            except OSError:
                return
            with conn:
                length, flags = wire.HEADER.unpack(conn.recv(wire.HEADER.size, socket.MSG_WAITALL))
                greeting = json.loads(conn.recv(length, socket.MSG_WAITALL))
                assert set(greeting) == {"hello", "schema", "nonce"}
                conn.sendall(wire.encode({"nonce": wire.nonce(), "proof": "0" * 64}))
                conn.settimeout(5)
                try:
                    while chunk := conn.recv(1 << 16):
                        received.extend(chunk)
                except OSError:
                    pass

    threading.Thread(target=pose, daemon=True).start()
    token = "t" * 43
    path = service_file_for(tmp_path, "127.0.0.1", impostor.getsockname()[1], token)
    with pytest.raises(StoreError) as refused:
        RemoteStore(path, retry_s=2.0)
    impostor.close()
    message = str(refused.value)
    assert "did not prove it holds the token" in message and "\n" not in message
    assert received == b""  # after its greeting, not one byte: no proof, no call


def test_another_protocol_schema_or_token_is_refused_in_one_line(sqlite_service, tmp_path):
    token = sqlite_service.token_file.read_text().strip()
    for fields, kind, said in [
            # Protocol 3 sent a call's arguments in order: refused before its first call.
            ({"hello": 3}, "protocol", f"speaks protocol {wire.PROTOCOL}, this client 3"),
            # Protocol 4 took any refusal unproven, and a replica's token for the primary's.
            ({"hello": 4}, "protocol", f"speaks protocol {wire.PROTOCOL}, this client 4"),
            ({"schema": SCHEMA_VERSION + 1}, "schema",
             f"schema version {SCHEMA_VERSION}, this client reads version {SCHEMA_VERSION + 1}"),
            ({"nonce": "not hex"}, "protocol", "without its nonce")]:
        sock, ours, answer = hello(sqlite_service, **fields)
        assert answer["e"] == kind and said in answer["m"] and "\n" not in answer["m"]
        if kind == "schema":  # proven: the client trusts no other refusal
            assert wire.proves(token, f"refusal schema {answer['m']}", ours, answer["nonce"],
                               answer["proof"])
        sock.close()
    # The right greeting from a client without the token: the service's proof, then no.
    sock, ours, answer = hello(sqlite_service)
    assert set(answer) == {"nonce", "proof"}
    sock.sendall(wire.encode({"proof": wire.proof("not the token", "client", answer["nonce"],
                                                  ours)}))
    refused = wire.read_frame(sock)[0]
    assert (refused["e"], refused["m"]) == ("protocol", "wrong token for this store service")
    sock.close()
    # The run's token, and a primary's proof that does not hold: refused, not taken as a
    # replica's connection.
    sock, ours, answer = hello(sqlite_service)
    sock.sendall(wire.encode({"proof": wire.proof(token, "client", answer["nonce"], ours),
                              "primary": wire.proof(token, "primary", answer["nonce"], ours)}))
    assert "not this run's primary" in wire.read_frame(sock)[0]["m"]
    sock.close()
    # A client whose token is not the run's cannot tell the service from a stranger on its
    # port: it sends nothing past its greeting, and says which token file it holds.
    path = service_file_for(tmp_path, *address(sqlite_service), "not the token" * 4)
    with pytest.raises(StoreError, match="did not prove it holds the token in .*elsewhere"):
        RemoteStore(path, retry_s=1.0)
    # Strangers choose how often: one line a minute, with how many were not said.
    log = (sqlite_service.logs / "store-service.log").read_text()
    assert log.count("refused a client from 127.0.0.1") == 1


def test_another_schema_is_a_schema_mismatch_for_the_client(sqlite_service, monkeypatch):
    from automlperf.store.service import client

    monkeypatch.setattr(client, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(SchemaMismatch, match=f"serves schema version {SCHEMA_VERSION}"):
        RemoteStore(sqlite_service.file)


def test_connections_past_the_open_file_limit_are_refused_and_the_run_goes_on(tmp_path):
    """A service whose process may open few files (its limit set here as a site's might
    be): proven connections past its room are refused in one line, not accepted until it
    runs out of files, and the run's own client is served once the others leave."""
    import resource
    import subprocess
    import time

    from automlperf.store.connections import SPARE_FILES

    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    file, token_file = tmp_path / "store-service.json", tmp_path / ".store-service.token"
    token_file.write_text("k" * 43)
    room = 40

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (SPARE_FILES + room, SPARE_FILES + room))

    proc = subprocess.Popen([sys.executable, "-m", "automlperf.store.service",
                             "--file", str(file), "--token-file", str(token_file),
                             "--no-parent"], preexec_fn=limited,
                            env={**os.environ, "AUTOMLPERF_STORE_URL": url},
                            stderr=open(tmp_path / "service.log", "wb"))
    try:
        deadline = time.monotonic() + 300
        while not file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        host, port = json.loads(file.read_text())["host"], json.loads(file.read_text())["port"]
        # Connections that greeted with the token, and are therefore held for as long as
        # they stay open: half the room (the other half is for connections still greeting).
        held = [greeted(host, port, "k" * 43) for _ in range(room // 2)]
        extra = socket.create_connection((host, port), timeout=120)
        assert handshake(extra, "k" * 43)["e"] == "busy"  # no room for it once it has greeted
        with pytest.raises(StoreError, match="as many connections as it has room for"):
            RemoteStore(file, retry_s=1.0)
        for sock in held:
            sock.close()
        # A local user's flood: ten times the service's open files in connections that never
        # greet, from 127.0.0.2 on, all offered at once. Each is taken and counted as it comes
        # (the oldest closed for it), so the service never runs out of files, and the run's
        # own client greets among them.
        flood = []
        for i in range(10 * (SPARE_FILES + room)):
            sock = socket.socket()
            sock.bind((f"127.0.{i // 250}.{2 + i % 250}", 0))
            sock.setblocking(False)
            sock.connect_ex((host, port))
            flood.append(sock)
        remote = RemoteStore(file, retry_s=120.0)
        assert remote.last_epoch_number() == 0
        remote.close()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        for sock in locals().get("flood", []):
            sock.close()
    log = (tmp_path / "service.log").read_text()
    assert "refused connections over the limits (20 in all" in log
    assert "closed connections still greeting to admit newer ones" in log
    assert "Too many open files" not in log and "Traceback" not in log


def test_a_service_for_other_nodes_listens_only_where_they_reach_it(tmp_path, monkeypatch):
    """Reachable from other nodes, the service listens on the address they are given (the
    host's name, or AUTOMLPERF_SERVICE_ADDRESS), not on every interface; a name that
    resolves here only to loopback (a hosts file's 127.0.1.1) keeps every interface."""
    import psutil

    from automlperf.store.service.net import listen_addresses
    from automlperf.store.service.process import ADDRESS_ENV

    ours = [a.address for addresses in psutil.net_if_addrs().values() for a in addresses
            if a.family == socket.AF_INET and not a.address.startswith("127.")]
    if not ours:
        pytest.skip("this machine has no network interface but loopback")
    assert listen_addresses(ours[0]) == [ours[0]]
    assert listen_addresses("127.0.0.1") is None
    assert listen_addresses("203.0.113.7") is None  # not this host's: every interface
    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    monkeypatch.setenv(ADDRESS_ENV, ours[0])
    service = ServiceProcess(tmp_path / "run", url, listen_all=True)
    service.start()
    try:
        host, port = address(service)
        assert host == ours[0]
        remote = RemoteStore(service.file, primary_token=service.primary_token)
        assert remote.create_run("r", {}, {}, 60.0, 1.0) > 0
        remote.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=120)
    finally:
        service.stop()


def test_every_write_sent_again_takes_effect_once(sqlite_service, tmp_path):
    """Each write a client sends again (``"r": true``: its answer was lost, its first try may
    have committed) answers as the first did, and the database holds it once."""
    import sqlalchemy as sa

    from automlperf.store import schema
    from automlperf.store.service.calls import CALLS
    from helpers import call, epoch_of, new_claim

    token = sqlite_service.token_file.read_text().strip()
    sock = greeted(*address(sqlite_service), token, sqlite_service.primary_token)

    def twice(op, *args, **kwargs):
        sent = CALLS[op].sent(*args, **kwargs)
        first = call(sock, {"op": op, "a": sent})
        again = call(sock, {"op": op, "a": sent, "r": True})
        assert "v" in first and again["v"] == first["v"], (op, first, again)
        return first["v"]

    run_id = twice("create_run", "r", {"k": 1}, {}, 3600.0, 1.0)
    seg = twice("start_segment", run_id, 1.0, 3600.0)
    rep = twice("register_replica", run_id, 0, seg, "n0", 7, [], 1.0)
    trial = twice("claim_trial", new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                           graph_hash="a", now=2.0, lease_s=600.0))
    twice("record_epoch", epoch_of(run_id, trial, 0))
    twice("finish_trial", trial, "completed", 3.0, best_accuracy=0.5)
    twice("end_replica", rep, "stopped", 4.0)
    twice("end_segment", run_id, seg, 5.0)
    twice("record_node", run_id, 0, seg, "n0", {"devices": []}, 6.0)
    sock.close()
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'h.db'}")
    with engine.connect() as conn:
        counts = {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
                  for t in (schema.T_RUNS, schema.T_SEGMENTS, schema.T_REPLICAS,
                            schema.T_TRIALS, schema.T_EPOCHS, schema.T_NODES)}
    engine.dispose()
    assert set(counts.values()) == {1}, counts

