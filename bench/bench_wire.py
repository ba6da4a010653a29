"""What a store call costs on its way, without the network: the run's own client
(``RemoteStore``) hands each request to the run's own service (``Service.handle``) in this
process, so every step but the socket is the real one: the client binds and encodes the
arguments, the service decodes the frame, checks the arguments, dispatches, encodes its
answer, and the client decodes it into what ``Store`` returns.

Measured, per call and by kind: the CPU time of the service's event-loop thread (the
frame's decoding and ``handle``, the loop's own work for each request; a write's commit is
the writer thread's, not counted), of the client's thread, the service's own time in
``handle`` at the median (store/service/latency.py: from the request decoded to its answer
encoded, a write's wait for its commit included), and the request's bytes. CPU times of
threads: other processes on the machine change the wall time, these much less.

Run: python bench/bench_wire.py [--calls 20000] [--replicas 200]
It uses only what a client and a service of any protocol have (``RemoteStore._once``,
``Service.handle``), so the same script measures an older checkout with
``PYTHONPATH=OLD/src``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from automlperf.store.base import Claim, EpochRecord
from automlperf.store.service import net, wire
from automlperf.store.service.client import RemoteStore
from automlperf.store.service.latency import CallTimes
from automlperf.store.service.server import Service
from automlperf.store.sql import SQLStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000, help="heartbeats; other kinds 1/10th")
    ap.add_argument("--replicas", type=int, default=200)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-wire-"))
    url = f"sqlite:///{folder / 'history.db'}"
    SQLStore(url, create=True).close()
    service = Service(url, "token")
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, name="service-loop", daemon=True)
    loop_thread.start()

    async def started() -> None:
        net.begin(service)

    asyncio.run_coroutine_threadsafe(started(), loop).result()
    assert loop_thread.ident is not None
    loop_clock = time.pthread_getcpuclockid(loop_thread.ident)
    sizes: dict[str, int] = defaultdict(int)

    async def handle(request: bytes) -> bytes:
        length, flags = wire.HEADER.unpack_from(request)
        return await service.handle(wire.decode(flags, request[wire.HEADER.size:]))

    class InProcess(RemoteStore):
        def _once(self, request: bytes, deadline_s: float | None = None) -> tuple[Any, int]:
            answer = asyncio.run_coroutine_threadsafe(handle(request), loop).result()
            sizes[json.loads(request[wire.HEADER.size:])["op"]] += len(request)
            length, flags = wire.HEADER.unpack_from(answer)
            return wire.decode(flags, answer[wire.HEADER.size:]), len(answer)

    store = InProcess(folder / "service.json", folder / "token")
    run_id = store.create_run("wire", {}, {}, 3600.0, 1.0)
    seg = store.start_segment(run_id, 1.0, 3600.0)
    reps = [store.register_replica(run_id, i, seg, f"node{i:05d}", 100 + i,
                                   [f"cuda:{d}" for d in range(8)], 1.0)
            for i in range(args.replicas)]
    trials = []
    for i, rep in enumerate(reps):
        trial = store.claim_trial(Claim(
            run_id=run_id, replica_id=rep, replica_index=i, graph_hash=f"h{i}", graph_json="{}",
            parent_id=None, morphs=[], round=1, hparams={"batch_size": 256}, now=2.0,
            lease_s=600.0))
        assert trial is not None
        trials.append(trial)
    changed = store.changes(run_id, 0).through or 0

    def epoch(k: int) -> EpochRecord:
        return EpochRecord(trial_id=trials[k % len(trials)], epoch=k // len(trials),
                           started_at=3.0, ended_at=4.0, train_images=1_281_167,
                           val_images=50_000, steps=1252, ops=3 * 10**16, train_loss=1.0,
                           val_accuracy=0.5, precision="bf16", batch_size=1024, world_size=8,
                           data_share=0.02, images_per_s=40_000.0, run_id=run_id)

    few = max(1, args.calls // 10)
    kinds = [
        ("heartbeat", args.calls, lambda k: store.heartbeat(reps[k % len(reps)], 5.0 + k, 60.0)),
        ("changes", few, lambda k: store.changes(run_id, max(0, changed - 3))),
        ("replica_changes", few, lambda k: store.replica_changes(run_id, changed - 3)),
        ("tally", few, lambda k: store.tally(run_id)),
        ("record_epoch", few, lambda k: store.record_epoch(epoch(k))),
        ("finish_trial", min(few, len(trials)),
         lambda k: store.finish_trial(trials[k], "completed", 9.0, "", 0.5)),
    ]
    out = {}
    for name, n, make in kinds:
        if name not in ("record_epoch", "finish_trial"):
            make(0)  # warm
        sizes.clear()
        service.times = CallTimes()
        client, served = time.thread_time(), time.clock_gettime(loop_clock)
        for k in range(n):
            make(k)
        client = time.thread_time() - client
        served = time.clock_gettime(loop_clock) - served
        out[name] = {"calls": n, "service_us": round(1e6 * served / n, 2),
                     "client_us": round(1e6 * client / n, 2),
                     "handle_p50_us": round(1e6 * service.times.percentile(name, 0.5), 1),
                     "request_bytes": round(sizes[name] / n, 1)}
    store.close()
    asyncio.run_coroutine_threadsafe(net.end(service), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    print(json.dumps({"protocol": wire.PROTOCOL, "replicas": args.replicas, "calls": out},
                     indent=1))


if __name__ == "__main__":
    main()
