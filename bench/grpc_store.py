"""The store service over gRPC, for bench/bench_transport.py only: the same service (its calls,
its group commit, what it keeps in memory, its own time per call) served by grpc.aio instead
of the service's own framing, so that the two transports can be compared on the same work.

As a hardened deployment would run it: TLS with a certificate made for the run and pinned by
the clients through the run directory (the server proves itself before a client sends
anything), the run's token in each call's metadata, gRPC's own message-size limit, keepalive
and idle timeout. Each call's request and answer are the service's own frames, carried as
gRPC messages (bytes, no protobuf): what differs is only the transport. ``--insecure``: the
same without TLS, to separate gRPC's cost from TLS's.

Serve: python bench/grpc_store.py --file RUN/store-service.json --token-file TOKEN
       [--calls-file F] [--insecure]   (the store's URL in $AUTOMLPERF_STORE_URL)
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import grpc

from automlperf.store.rundir import write_atomic
from automlperf.store.service import net, wire
from automlperf.store.service.client import RemoteStore, ServiceUnavailable
from automlperf.store.service.server import Service
from automlperf.store.urls import resolve_store_url

METHOD = "/automlperf.Store/Call"
NAME = "automlperf-store"  # the certificate's name, which clients check
OPTIONS = [("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000),
           ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key for this run (made once, the key private)."""
    cert, key = folder / "store-service.crt", folder / ".store-service.key"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                        f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME}", "-keyout",
                        str(key), "-out", str(cert)], check=True, capture_output=True)
        key.chmod(0o600)
    return cert, key


async def serve(service: Service, port: int, tls: tuple[Path, Path] | None,
                on_listening: Any) -> None:
    loop = asyncio.get_running_loop()
    stop = net.begin(service)
    token = service.token.encode()

    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        given = dict(context.invocation_metadata()).get("token", "")
        if not hmac.compare_digest(str(given).encode(), token):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong token")
        try:
            length, flags = wire.HEADER.unpack_from(request)
            wire.check_header(length, flags, wire.MAX_REQUEST)
            message = wire.decode(flags, request[wire.HEADER.size:], wire.MAX_REQUEST)
        except (wire.ProtocolError, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return await service.handle(message)

    server = grpc.aio.server(options=OPTIONS + [
        ("grpc.max_receive_message_length", wire.MAX_REQUEST + wire.HEADER.size),
        ("grpc.max_connection_idle_ms", 3_600_000)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "automlperf.Store", {"Call": grpc.unary_unary_rpc_method_handler(call)}),))
    if tls is None:
        port = server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        cert, key = tls
        port = server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials(
            [(key.read_bytes(), cert.read_bytes())]))
    await server.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_listening(port)
    ticker = asyncio.create_task(net.tick(service, stop))
    await stop.wait()
    await server.stop(5)
    ticker.cancel()
    await net.end(service)


class GrpcStore(RemoteStore):
    """A replica's store through the gRPC service: one channel (one connection of its own,
    as a replica on its own node would have), the run's certificate pinned."""

    def __init__(self, service_file: Path | str, **kwargs: Any) -> None:
        self._stub: Any = None
        self._channel: Any = None
        super().__init__(service_file, **kwargs)

    def _open(self) -> None:
        host, port, token = self._address()
        found = json.loads(self.service_file.read_text())
        options = OPTIONS + [("grpc.use_local_subchannel_pool", 1),
                             ("grpc.max_receive_message_length", -1)]
        if found.get("certificate"):
            pinned = Path(found["certificate"]).read_bytes()
            self._channel = grpc.secure_channel(
                f"{host}:{port}", grpc.ssl_channel_credentials(root_certificates=pinned),
                options=options + [("grpc.ssl_target_name_override", NAME)])
        else:
            self._channel = grpc.insecure_channel(f"{host}:{port}", options=options)
        self._meta = (("token", token),)
        self._stub = self._channel.unary_unary(METHOD)

    def _once(self, request: bytes, deadline_s: float | None = None) -> tuple[Any, int]:
        if self._stub is None:
            self._open()
        try:
            body = self._stub(request, timeout=deadline_s or self.retry_s + 60.0,
                              metadata=self._meta)
        except grpc.RpcError as exc:
            raise ServiceUnavailable(f"{exc.code().name}: {exc.details()}") from None
        length, flags = wire.HEADER.unpack_from(body)
        return wire.decode(flags, body[wire.HEADER.size:], wire.MAX_FRAME), len(body)

    def close(self) -> None:
        super().close()
        if self._channel is not None:
            self._channel.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, required=True)
    ap.add_argument("--token-file", type=Path, required=True)
    ap.add_argument("--calls-file", type=Path, default=None)
    ap.add_argument("--insecure", action="store_true")
    args = ap.parse_args()
    url = resolve_store_url(None)
    if not url:
        raise SystemExit("error: no store: set AUTOMLPERF_STORE_URL")
    service = Service(url, args.token_file.read_text().strip())
    service.times_file = args.calls_file
    tls = None if args.insecure else certificate(args.file.parent)

    def listening(port: int) -> None:
        write_atomic(args.file, json.dumps(
            {"host": "127.0.0.1", "port": port, "pid": os.getpid(), "protocol": wire.PROTOCOL,
             "certificate": str(tls[0]) if tls else None}) + "\n")

    asyncio.run(serve(service, 0, tls, listening))


if __name__ == "__main__":
    main()
