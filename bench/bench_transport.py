"""The store service's transport against gRPC's, on the same work: N protocol-faithful simulated
replicas (bench/control_load.py, as bench/bench_control.py runs them) against one store service
on a private PostgreSQL server, once through the service's own framing and once through the
same service served by gRPC (bench/grpc_store.py: TLS with the run's certificate pinned, the
token in each call's metadata), one after the other on this machine.

What differs from bench_control.py: no primary. The bench makes the run and its segment
itself and the service serves only the replicas (the primary's few calls a second would be
the same for both), so the figures are the transport's and the service's alone. Measured per
transport: the service's own time per call by kind (store/service/latency.py), the replicas'
latencies, the service's CPU (share of a core over the session, per 1,000 calls), its memory,
its connections, records lost or duplicated, and the replicas' schedule lag (the load
generator's own saturation).

Run: python bench/bench_transport.py --replicas 5000 --window 240
     [--transports socket,grpc-tls,grpc] [--processes 4] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_control import (Watch, figures, options, rss_mib, seen, snapshot,  # noqa: E402
                           start_replicas)

HERE = Path(__file__).resolve().parent


def service_command(transport: str, run_dir: Path, replicas: int) -> list[str]:
    files = ["--file", str(run_dir / "store-service.json"), "--token-file",
             str(run_dir / ".store-service.token"), "--calls-file",
             str(run_dir / "logs" / "store-service-calls.json")]
    if transport == "socket":
        return [sys.executable, "-m", "automlperf.store.service", *files,
                "--replicas", str(replicas)]
    return [sys.executable, str(HERE / "grpc_store.py"), *files] + (
        ["--insecure"] if transport == "grpc" else [])


def client_for(transport: str, service_file: Path) -> Any:
    if transport == "socket":
        from automlperf.store.service.client import RemoteStore

        return RemoteStore(service_file)
    from grpc_store import GrpcStore

    return GrpcStore(service_file)


def connections(pid: int) -> int:
    try:
        return len(psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.Error:
        return 0


def one(transport: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from automlperf.store import open_store
    from automlperf.store.pgserver import PostgresServer
    from automlperf.store.service.process import new_token
    from automlperf.store.urls import STORE_ENV

    n = args.replicas
    run_dir = work / f"run-{transport}"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    new_token(run_dir / ".store-service.token")
    server = PostgresServer(work / f"postgres-{transport}")
    url = server.start()
    open_store(url, create=True).close()
    env = dict(os.environ, **{STORE_ENV: url})
    service = subprocess.Popen(service_command(transport, run_dir, n), env=env,
                               stdout=open(run_dir / "logs" / "store-service.log", "w"),
                               stderr=subprocess.STDOUT)
    service_file = run_dir / "store-service.json"
    while not service_file.exists():
        if service.poll() is not None:
            raise SystemExit(f"the {transport} service exited: "
                             f"{(run_dir / 'logs' / 'store-service.log').read_text()[-2000:]}")
        time.sleep(0.05)
    watch = Watch(url, work / f"postgres-{transport}")
    try:
        # The run and its session as a primary makes them: on the database, before serving.
        own = open_store(url)
        run_id = own.create_run("transport", {}, {}, args.window, time.time())
        now = time.time()
        segment = own.start_segment(run_id, now, now + args.window)
        t0 = time.time()
        procs, outs = start_replicas(args, run_dir, env, work / f"tally-{transport}",
                                     transport=transport)
        watch.pids = {"service": {service.pid}, "replicas": {p.pid for p in procs}}
        watch.start()
        held, rss, beat = [], [], 0
        while any(p.poll() is None for p in procs):
            beat += 1
            if beat % 5 == 0:  # it reads the whole machine's socket table
                held.append(connections(service.pid))
            found = rss_mib(service.pid)
            if found:
                rss.append(found)
            snapshot(run_dir, watch.times)
            time.sleep(1.0)
        own.end_segment(run_id, segment, time.time())
        own.close()
        service.terminate()
        service.wait(timeout=120)
        watch.stop.set()
        watch.join()
        found = figures(options(replicas=n, window=args.window, trial_epochs=args.trial_epochs,
                                processes=args.processes, threads=args.threads),
                        url, seen(outs), watch, t0, rss, work, run_dir)
        return {"transport": transport, **found, "service_connections_max": max(held, default=0)}
    finally:
        if service.poll() is None:
            service.kill()
        server.stop()


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| transport | service CPU (share of a core) | CPU per 1,000 calls | RSS max | "
            "connections max | lost / duplicated | heartbeat: service p50 / p99 / max ms | "
            "heartbeat: replica p50 / p99 / max ms | epoch record: service p50 / p99 ms | "
            "claim: service p50 / p99 ms |", "|---" * 10 + "|"]
    for r in results:
        s, c = r.get("service_ms") or {}, r["latency_ms"]

        def side(kind: str, parts: tuple[str, ...] = ("p50_ms", "p99_ms", "max_ms"),
                 s: dict[str, Any] = s) -> str:
            row = s.get(kind)
            return " / ".join(f"{row[p]:.2f}" for p in parts) if row else "-"

        beat = c.get("heartbeat") or {}
        rows.append(
            f"| {r['transport']} | {(r['cpu_share'].get('service') or 0) * 100:.1f} % | "
            f"{r['service_cpu_s_per_1000_calls']} s | {r['service_rss_mib_max']:.0f} MiB | "
            f"{r['service_connections_max']} | {sum(r['lost'].values())} / "
            f"{sum(r['duplicated'].values())} | {side('heartbeat')} | "
            f"{beat.get('p50')} / {beat.get('p99')} / {beat.get('max')} | "
            f"{side('record_epoch', ('p50_ms', 'p99_ms'))} | "
            f"{side('claim_trial', ('p50_ms', 'p99_ms'))} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=5000)
    ap.add_argument("--window", type=float, default=240.0)
    ap.add_argument("--transports", default="socket,grpc-tls")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=48)
    ap.add_argument("--trial-epochs", type=int, default=50)
    ap.add_argument("--epoch-s", type=float, default=32.0)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-transport-"))
    results = []
    for transport in args.transports.split(","):
        found = one(transport, args, work)
        results.append(found)
        print(json.dumps({"bench": "transport", **found}), flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
