"""The store service attacked on its own port: a real service (as a run's primary starts it) on
a private PostgreSQL server, each attack sent over a raw socket, the service's resident memory
read before and after it, and what the service did (closed the connection, answered one line).
Then the run's own client makes a write, which must be stored by the same service process.

Run: python bench/bench_service_attacks.py [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import psutil

from automlperf.store import open_store
from automlperf.store.base import SCHEMA_VERSION
from automlperf.store.pgserver import PostgresServer
from automlperf.store.service import wire
from automlperf.store.service.client import RemoteStore
from automlperf.store.service.process import ServiceProcess

def bomb(size: int = 1 << 30) -> bytes:
    squeeze = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"".join(squeeze.compress(chunk) for _ in range(size >> 20)) + squeeze.flush()


def outcome(sock: socket.socket, limit: float = 120.0) -> str:
    """What the service did: the answer it sent, if any, and whether it closed."""
    sock.settimeout(limit)
    got = b""
    try:
        while chunk := sock.recv(1 << 16):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return "kept the connection open"
    said = ""
    if len(got) >= wire.HEADER.size:
        length, flags = wire.HEADER.unpack(got[:wire.HEADER.size])
        said = str(wire.decode(flags, got[wire.HEADER.size:wire.HEADER.size + length],
                               wire.MAX_FRAME).get("m", ""))
    return f"answered {said!r}, closed" if said else "closed, no answer"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--idle", type=int, default=5000, help="connections that never greet")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="amp-attacks-"))
    pg = PostgresServer(work / "pg")
    pg.start()
    url = pg.create_database("attacks")
    open_store(url, create=True).close()
    service = ServiceProcess(work / "run", url)
    service.start()
    found = json.loads(service.file.read_text())
    host, port, token = found["host"], found["port"], service.token_file.read_text().strip()
    proc = psutil.Process(service.proc.pid)
    squeezed = bomb()

    def connect() -> socket.socket:
        return socket.create_connection((host, port), timeout=120)

    def prove(sock: socket.socket, proven: str) -> None:
        """Greet on ``sock``, proving ``proven`` as the token."""
        ours = wire.nonce()
        sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION,
                                  "nonce": ours}))
        answer = wire.read_frame(sock)[0]
        sock.sendall(wire.encode({"proof": wire.proof(proven, "client", answer["nonce"], ours)}))

    def greeted() -> socket.socket:
        sock = connect()
        prove(sock, token)
        return sock

    attacks: list[tuple[str, Any]] = [
        ("wrong token", lambda s: prove(s, "x")),
        ("another protocol", lambda s: s.sendall(wire.encode({"hello": wire.PROTOCOL - 1}))),
        ("no nonce", lambda s: s.sendall(wire.encode({"hello": wire.PROTOCOL,
                                                      "schema": SCHEMA_VERSION}))),
        ("a 1 GiB length header", lambda s: s.sendall(wire.HEADER.pack(1 << 30, 0) + b"x" * 4096)),
        (f"a compressed greeting ({len(squeezed) >> 10} KiB -> 1 GiB)",
         lambda s: s.sendall(wire.HEADER.pack(len(squeezed), 1) + squeezed)),
        ("garbage (an HTTP request)", lambda s: s.sendall(b"GET / HTTP/1.1\r\n\r\n")),
    ]
    rows = []
    for name, send in attacks:
        before = proc.memory_info().rss
        sock = connect()
        send(sock)
        did = outcome(sock)
        rows.append((name, did, before, proc.memory_info().rss))
    for name, body in [
        (f"with the token: a compressed call ({len(squeezed) >> 10} KiB -> 1 GiB)",
         wire.HEADER.pack(len(squeezed), 1) + squeezed),
        ("with the token: a call missing an argument",
         wire.encode({"op": "heartbeat", "a": {"replica_id": 1}})),
        ("with the token: a wrong-type call",
         wire.encode({"op": "touch_segment", "a": {"run_id": 1, "index": "zero", "now": None}})),
    ]:
        before = proc.memory_info().rss
        sock = greeted()
        wire.read_frame(sock)
        sock.sendall(body)
        if "call (" in name:
            did = outcome(sock)
        else:
            did = f"answered {wire.read_frame(sock)[0].get('m')!r}"
            sock.close()
        rows.append((name, did, before, proc.memory_info().rss))
    before = proc.memory_info().rss
    slow = connect()
    slow.sendall(b"\x00")
    started = time.monotonic()
    did = outcome(slow, limit=600)
    rows.append((f"one byte, then silence ({time.monotonic() - started:.0f} s)", did, before,
                 proc.memory_info().rss))
    remote = RemoteStore(service.file)
    # Many connections that never greet, held together while the run's client is served.
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    before = proc.memory_info().rss
    idle = [connect() for _ in range(args.idle)]
    served_id = remote.create_run("beside idle connections", {}, {}, 60.0, 1.0)
    held = proc.memory_info().rss
    for sock in idle:
        sock.close()
    rows.append((f"{args.idle} connections that never greet, held at once",
                 f"held; the run's client served beside them (run {served_id})", before, held))
    # A client of the run's that sends calls and never reads the answers.
    before = proc.memory_info().rss
    deaf = greeted()
    wire.read_frame(deaf)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.setblocking(False)
    asks, sent = wire.encode({"op": "replicas", "a": {"run_id": served_id}}), 0
    try:
        while sent < 64 << 20:
            sent += deaf.send(asks)
    except BlockingIOError:
        pass
    remote.create_run("beside a deaf client", {}, {}, 60.0, 1.0)
    rows.append(("with the token: calls sent, answers never read",
                 f"stopped reading it after {sent >> 10} KiB; the run's client served",
                 before, proc.memory_info().rss))
    deaf.close()
    run_id = remote.create_run("after", {}, {}, 60.0, 1.0)
    same = service.proc.pid == proc.pid and service.restarts == 0
    print("| attack | what the service did | RSS before (MiB) | after (MiB) |")
    print("|---|---|---|---|")
    for name, did, rss0, rss1 in rows:
        print(f"| {name} | {did} | {rss0 / 2**20:.1f} | {rss1 / 2**20:.1f} |")
    print(f"\nafterwards: the run's own client stored run {run_id}; same service process, "
          f"no restart: {same}")
    remote.close()
    service.stop()
    pg.stop()


if __name__ == "__main__":
    main()
