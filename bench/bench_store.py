"""Store throughput: epoch records per second with 1 and 8 writer processes, on SQLite and on
a private PostgreSQL server, each writer committing one record at a time (as replicas do).

Run: python bench/bench_store.py [--records 400]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from automlperf.store.pgserver import PostgresServer
from automlperf.store import open_store

WRITER = textwrap.dedent("""
    import sys, time
    from automlperf.store import Claim, EpochRecord, open_store
    url, run_id, worker, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = open_store(url)
    rep = s.register_replica(run_id, worker, 0, "bench", worker, [], time.time())
    trial = s.claim_trial(Claim(run_id=run_id, replica_id=rep, replica_index=worker,
                                graph_hash=f"w{worker}", graph_json="{}", parent_id=None, morphs=[],
                                round=0, hparams={}, now=time.time(), lease_s=600))
    print("ready", flush=True)
    sys.stdin.readline()
    for e in range(n):
        s.record_epoch(EpochRecord(
            trial_id=trial, epoch=e, started_at=1.0, ended_at=2.0, train_images=1281167,
            val_images=50000, steps=2860, ops=10**16, train_loss=2.1, val_accuracy=0.7,
            precision="bf16", batch_size=448, world_size=8, data_share=0.02,
            images_per_s=3000.0, run_id=run_id))
""")


def measure(url: str, writers: int, records: int) -> float:
    store = open_store(url, create=True)
    run_id = store.create_run("bench", {}, {}, 60.0, time.time())
    store.start_segment(run_id, time.time(), time.time() + 60)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, str(run_id), str(w),
                               str(records)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for w in range(writers)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    for p in procs:  # start together
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        assert p.wait() == 0
    elapsed = time.perf_counter() - t0
    assert len(store.epochs(run_id)) == writers * records
    store.close()
    return writers * records / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=400, help="per writer")
    args = ap.parse_args()
    out: dict[str, object] = {"bench": "store", "records_per_writer": args.records}
    with tempfile.TemporaryDirectory() as tmp:
        with PostgresServer(Path(tmp) / "pg") as pg:
            for backend in ("sqlite", "postgresql"):
                for writers in (1, 8):
                    if backend == "sqlite":
                        url = f"sqlite:///{tmp}/h-{writers}.db"
                    else:
                        url = pg.create_database(f"bench{writers}")
                    rate = measure(url, writers, args.records)
                    out[f"{backend}_{writers}_writers_per_s"] = round(rate, 1)
                    print(f"{backend:<11} {writers} writer(s): {rate:8.1f} epoch records/s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
