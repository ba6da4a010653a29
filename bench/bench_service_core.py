"""The store service sized per core: what each kind of call costs the service's process in
CPU, measured one kind at a time from one client (the service otherwise idle), and from
those, with a replica's own rates (bench/control_load.py, Rates: the calls a replica makes
in a second of its run), the calls one service core sustains and the replica count at which
one service holds 70 % of a core.

The service is the real one, started by the real primary (`automlperf run --launcher
external`) on a private PostgreSQL server, as bench/bench_control.py starts it; the calls
are the store API's, through RemoteStore, with the arguments a replica sends. One client
sending one call at a time is the service's dearest case for writes: under load it commits
the writes waiting together, one transaction for many.

    python bench/bench_service_core.py [--calls 2000] [--json out.json] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_control import CONFIG, pct  # noqa: E402
from control_load import Rates  # noqa: E402

SAMPLE = {"cpu_percent": 40.0, "mem_used_gib": 900.0,
          "gpus": [{"index": i, "util": 95.0, "energy_mj": 1, "mem_used_gib": 60.0}
                   for i in range(8)]}


def per_replica_second(rates: Rates) -> dict[str, float]:
    """The calls one replica makes per second of its run, by kind (control_load's replica:
    a heartbeat every heartbeat_s, an epoch every epoch_s, samples stored every
    sample_batch_s, and per trial of trial_epochs epochs: two history reads, a claim, the
    parent's record, the finish)."""
    trial_s = rates.trial_epochs * rates.epoch_s
    return {"heartbeat": 1 / rates.heartbeat_s, "epoch": 1 / rates.epoch_s,
            "samples": 1 / rates.sample_batch_s, "history": 2 / trial_s, "claim": 1 / trial_s,
            "parent": 1 / trial_s, "finish": 1 / trial_s}


# The service's CPU each kind runs for at least: its clock counts in 10 ms ticks.
CPU_S = 2.0


def measure(service: psutil.Process, calls: int, fn: Callable[[int], Any],
            most: int | None = None) -> dict[str, float]:
    """At least ``calls`` calls of ``fn`` one after the other, and on until the service has
    spent CPU_S on them (at most 20 times as many): the service's CPU per call and the
    latency a caller sees (the service's own plus a loopback round trip)."""
    fn(-1)  # warm: the first call of a kind may load what later ones find in memory
    cpu = sum(service.cpu_times()[:2])
    took: list[float] = []
    most = 20 * calls if most is None else most
    while len(took) < min(calls, most) or (sum(service.cpu_times()[:2]) - cpu < CPU_S
                                           and len(took) < most):
        t = time.perf_counter()
        fn(len(took))
        took.append(time.perf_counter() - t)
    spent = sum(service.cpu_times()[:2]) - cpu
    return {"calls": len(took), "cpu_ms_per_call": 1000 * spent / len(took),
            "p50_ms": 1000 * pct(took, 0.5), "p99_ms": 1000 * pct(took, 0.99),
            "max_ms": 1000 * max(took)}


def run(calls: int, work: Path) -> dict[str, Any]:
    from automlperf.graph import seeds
    from automlperf.store import Claim, EpochRecord
    from automlperf.store.history import History
    from automlperf.store.pgserver import PostgresServer
    from automlperf.store.service.client import RemoteStore, service_file

    server = PostgresServer(work / "postgres")
    url = server.start()
    run_dir = work / "run"
    config = work / "core.toml"
    config.write_text(CONFIG.replace("[run]\n", "[run]\nduration_s = 3600\n"))
    primary = subprocess.Popen(
        [sys.executable, "-m", "automlperf.cli", "run", "--launcher", "external",
         "--replicas", "1", "--duration", "3600s", "--config", str(config), "--run-dir",
         str(run_dir), "--store", url], stdout=open(work / "primary.log", "w"),
        stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # a guard: the service starts in seconds
        while not (service_file(run_dir).exists() and (run_dir / "run.json").exists()):
            if primary.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the primary did not start the service: see {work}/primary.log")
            time.sleep(0.05)
        service = psutil.Process(json.loads(service_file(run_dir).read_text())["pid"])
        store = RemoteStore(service_file(run_dir))
        seg = store.segments(1)[-1]
        rid = store.register_replica(1, 0, seg.index, "node0", os.getpid(),
                                     [f"cuda:{i}" for i in range(8)], time.time())
        graph = seeds.seed("resnet50", 1000, 224, 3).to_json(None)
        history = History(1)
        made: list[int] = []

        def claim(i: int) -> None:
            found = store.claim_trial(Claim(
                run_id=1, replica_id=rid, replica_index=0, graph_hash=f"core-{i}-{len(made)}",
                graph_json=graph, parent_id=made[0] if made else None,
                morphs=[{"op": "deepen", "target": "relu", "kernel": 3}], round=len(made),
                hparams={"batch_size": 1024}, now=time.time(), lease_s=60.0))
            made.append(found)

        def epoch(i: int) -> None:
            now = time.time()
            store.record_epoch(EpochRecord(
                trial_id=made[0], epoch=i + 1, started_at=now - 32, ended_at=now,
                train_images=1_281_167, val_images=50_000, steps=1252, ops=3 * 10**16,
                train_loss=1.0, val_accuracy=0.5, precision="bf16", batch_size=1024,
                world_size=8, data_share=0.02, images_per_s=40_000.0, run_id=1))

        kinds: dict[str, Callable[[int], Any]] = {
            "heartbeat": lambda i: store.heartbeat(rid, time.time(), 60.0),
            "claim": claim,
            "epoch": epoch,
            "parent": lambda i: store.trial(made[0]),
            # A replica's read of the changes since its last: here the trials just claimed.
            "history": lambda i: history.refresh(store),
            "samples": lambda i: store.add_samples(1, "node0", [
                {**SAMPLE, "t": time.time() + k} for k in range(10)]),
            "finish": lambda i: store.finish_trial(made[1 + i], "completed", time.time(), "",
                                                   0.5),
        }
        # Each trial claimed is finished once (the claims' warm-up one by the finish's).
        figures = {kind: measure(service, calls, fn,
                                 len(made) - 1 if kind == "finish" else None)
                   for kind, fn in kinds.items()}
        store.close()
    finally:
        primary.terminate()
        primary.wait()
        server.stop()
    return figures


def project(figures: dict[str, dict[str, float]], rates: Rates) -> dict[str, float]:
    """One replica's CPU cost to the service per second of its run, and what follows."""
    mix = per_replica_second(rates)
    cpu_s = sum(mix[k] * figures[k]["cpu_ms_per_call"] / 1000 for k in mix)
    calls = sum(mix.values())
    return {"calls_per_replica_s": calls, "service_cpu_ms_per_replica_s": 1000 * cpu_s,
            "calls_per_core_s": calls / cpu_s, "replicas_at_70_percent": 0.7 / cpu_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls of each kind")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="keep everything here")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-service-core-"))
    work.mkdir(parents=True, exist_ok=True)
    figures = run(args.calls, work)
    rates = Rates()
    found = project(figures, rates)
    mix = per_replica_second(rates)
    print("| call | calls per replica-second | calls measured | service CPU per 1,000 calls | "
          "caller's p50 / p99 / max |")
    print("|---|---|---|---|---|")
    for kind, f in figures.items():
        print(f"| {kind} | {mix[kind]:.5f} | {f['calls']:,} | {f['cpu_ms_per_call']:.2f} s | "
              f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} / {f['max_ms']:.1f} ms |")
    print(f"\none replica: {found['calls_per_replica_s']:.3f} calls/s, "
          f"{found['service_cpu_ms_per_replica_s']:.4f} ms of service CPU per second; one core: "
          f"{found['calls_per_core_s']:,.0f} calls/s of that mix; 70 % of a core at "
          f"{found['replicas_at_70_percent']:,.0f} replicas")
    print(json.dumps({"bench": "service-core", "figures": figures, **found}))
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, **found}, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
