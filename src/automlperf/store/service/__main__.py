"""The store service as a process, ``python -m automlperf.store.service --file FILE``: it
serves the store at $AUTOMLPERF_STORE_URL (its password from the environment, as every
process of a run reads it) and writes where it listens to FILE. The primary starts it
(store/service/process.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from automlperf.procutil import die_with_parent
from automlperf.store.base import StoreError
from automlperf.store.rundir import write_atomic
from automlperf.store.service import net, wire
from automlperf.store.service.client import MIN_TOKEN
from automlperf.store.service.process import ADDRESS_ENV
from automlperf.store.service.server import Service, log
from automlperf.store.urls import redact, resolve_store_url


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m automlperf.store.service")
    ap.add_argument("--file", type=Path, required=True, help="where to write the address")
    ap.add_argument("--token-file", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1", help="the name clients reach it by")
    ap.add_argument("--listen-all", action="store_true", help="accept other nodes")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--calls-file", type=Path, default=None,
                    help="where to write the calls' times by kind (store/service/latency.py)")
    ap.add_argument("--restarted", action="store_true",
                    help="started again after it died: grant every lease a full term")
    ap.add_argument("--no-parent", action="store_true",
                    help="keep serving when the process that started it dies")
    ap.add_argument("--primary-token-stdin", action="store_true",
                    help="read the primary's own token (its calls: store/service/calls.py) "
                         "from the first line of stdin")
    ap.add_argument("--replicas", type=int, default=None,
                    help="the run's replicas, any of which may run on this host")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s store-service %(levelname)s %(message)s")
    if not args.no_parent:
        die_with_parent()
    url = resolve_store_url(None)
    if not url:
        raise SystemExit("error: no store: set AUTOMLPERF_STORE_URL")
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"error: the store service's token: {exc}") from None
    primary = sys.stdin.readline().strip() if args.primary_token_stdin else None
    for name, value in (("token in " + str(args.token_file), token),
                        ("primary's token", primary)):
        if value is not None and len(value) < MIN_TOKEN:
            # An empty key would prove anything: anyone who reaches the port would get in.
            raise SystemExit(f"error: the {name} is {len(value)} characters, fewer than "
                             f"{MIN_TOKEN}: start the run's primary again, which writes a new "
                             "one")
    try:
        service = Service(url, token, args.restarted, primary)
    except StoreError as exc:
        raise SystemExit(f"error: {exc}") from None
    service.times_file = args.calls_file

    def listening(port: int) -> None:
        write_atomic(args.file, json.dumps({"host": args.host, "port": port,
                                            "pid": os.getpid(), "protocol": wire.PROTOCOL})
                     + "\n")
        log.info("serving %s on %s:%d", redact(service.url), args.host, port)

    listen: str | list[str] | None = args.host
    if args.listen_all:
        # Only where the other nodes reach this host, by the name they are given.
        listen = net.listen_addresses(args.host)
        if listen is None:
            log.warning("listening on every interface: %s resolves here to no address but "
                        "loopback; set %s to the address the nodes reach this host by",
                        args.host, ADDRESS_ENV)
    try:
        asyncio.run(net.serve(service, listen, args.port, listening, args.replicas))
    except StoreError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
