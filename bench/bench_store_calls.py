"""The CPU one process spends per store call on SQLite, as a local run's replica and primary
make them: for each trial a claim, two epochs, a heartbeat, a sample and the finish, each
its own transaction. Prints CPU-ms per call of each kind (the median of ``--repeats``
rounds, each on a new store); run it under another checkout's ``PYTHONPATH`` for a before.

Run: python bench/bench_store_calls.py [--trials 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from automlperf.store import Claim, EpochRecord, open_store


def one_round(trials: int) -> dict[str, float]:
    """CPU-ms per call of each kind over ``trials`` trials, on a store of its own."""
    spent: dict[str, float] = defaultdict(float)

    def timed(kind: str, call, *args, **kwargs):
        began = time.process_time()
        out = call(*args, **kwargs)
        spent[kind] += time.process_time() - began
        return out

    with tempfile.TemporaryDirectory() as where:
        store = open_store(None, run_dir=Path(where), create=True)
        run_id = store.create_run("bench", {}, {}, 3600.0, 1.0)
        segment = store.start_segment(run_id, 1.0, 3601.0)
        replica = store.register_replica(run_id, 0, segment, "node", 1, ["cpu"], 1.0)
        graph = json.dumps({"layers": [{"name": f"l{i}", "op": "conv"} for i in range(60)]})
        for t in range(trials):
            now = 2.0 + t
            trial = timed("claim_trial", store.claim_trial, Claim(
                run_id=run_id, replica_id=replica, replica_index=0, graph_hash=f"g{t}",
                graph_json=graph, parent_id=None, morphs=[], round=t, hparams={"lr": 0.1},
                now=now, lease_s=600.0))
            for e in range(2):
                timed("record_epoch", store.record_epoch, EpochRecord(
                    trial_id=trial, epoch=e, started_at=now, ended_at=now + 0.5,
                    train_images=1000, val_images=100, steps=10, ops=10**12,
                    train_loss=2.0, val_accuracy=0.5, precision="fp32", batch_size=100,
                    world_size=1, data_share=1.0, images_per_s=1000.0, run_id=run_id))
            timed("heartbeat", store.heartbeat, replica, now, 600.0)
            timed("add_samples", store.add_samples, run_id, "node",
                  [{"t": now, "host": {"cpu": 50.0}}])
            timed("finish_trial", store.finish_trial, trial, "completed", now + 1.0,
                  best_accuracy=0.5)
        store.close()
    return {kind: 1000 * seconds / (trials * (2 if kind == "record_epoch" else 1))
            for kind, seconds in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    one_round(20)  # imports and SQLAlchemy's statement cache, outside the figures
    rounds = [one_round(args.trials) for _ in range(args.repeats)]
    out = {kind: round(statistics.median(r[kind] for r in rounds), 3) for kind in rounds[0]}
    print(json.dumps({"cpu_ms_per_call": out, "trials": args.trials, "repeats": args.repeats}))


if __name__ == "__main__":
    main()
