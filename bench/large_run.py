"""A run directory the size of a 512-node, ten-hour ImageNet run, generated in minutes.

What a replica records, through the same code paths: the run, its session and replicas
(store API), every trial claimed and finished in time order (``claim_trial``,
``finish_trial``), each trial's ``graph.json`` and ``log.jsonl`` (the lines ``JsonlSink``
writes), every node's description and the resource samples of every node (``record_node``,
``add_samples``), and result.json (``build_result``). Architectures are real: each trial
morphs an earlier, finished one (``search.morph``) from the ResNet-50 seed, and every
epoch's operations are the analytical count of its graph, so ``automlperf check`` verifies
the directory.

Only the epochs take a shortcut: they are inserted 5,000 per transaction with the statement
``record_epoch`` runs (one row per transaction), because the 500,000 single-row transactions
of a real run would take the generator most of an hour. On SQLite the store's connections
also skip fsync (durability is not what this measures).

What is modelled (stated, not measured): each node sustains ``NODE_OPS`` = 2.7e15 operations
per second (eight H100-class accelerators at ~340 TFLOPS sustained each; ``node_ops`` sets
another), so a ResNet-50-sized ImageNet epoch (~3e16 operations) takes ~11 s; accuracy
follows a seeded saturating learning curve; 1 % of trials fail; the monitor samples every
node every 30 s. Two shapes:

* counted (the default): ``trials`` trials holding ``epochs`` epochs, each trial's budget its
  round's epochs (ImageNet preset: 15, 30, 45, then 60) scaled to that total. The run ends when
  the last trial does; with few trials a node (2.25 at 10,000 nodes and 22,500 trials) most
  nodes sit idle, still sampled, for most of the run.
* timed (``duration_s``): a run's deadline, as ``run.duration`` gives it. Every replica claims
  trials until the deadline, each trial training its round's budget; the trial running at
  the deadline keeps the epochs that ended before it and stops ("deadline reached"). Every
  node trains the whole run, as in a real one.

Used by bench/bench_scale.py and tests/e2e/test_scale.py; also runnable:
    python bench/large_run.py DIR [--trials 10000] [--epochs 500000] [--replicas 512]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from automlperf import rules
from automlperf.config import Config
from automlperf.events import EpochEvent, TrialOutcome
from automlperf.graph import Graph, seeds
from automlperf.measure.result import build_result, write_result
from automlperf.ops import count, epoch_ops
from automlperf.search.morph import MorphError, morph
from automlperf.store import Claim, TrialStatus, open_store
from automlperf.store.rundir import RunDir, write_atomic
from automlperf.store.schema import T_EPOCHS
from automlperf.store.urls import strip_password

NODE_OPS = 2.7e15
TRAIN_IMAGES = 1_281_167
VAL_IMAGES = 50_000
DEVICES = 8
BATCH = 1024
SAMPLE_S = 30.0
BATCH_ROWS = 5_000


def _system(replicas: int) -> dict[str, Any]:
    accel = [{"index": i, "type": "cuda", "name": "NVIDIA H100 80GB HBM3 (generated)",
              "memory_gib": 79.1, "peak_ops": 9.89e14, "peak_precision": "bf16"}
             for i in range(DEVICES)]
    return {"host": "generated", "os": "Linux", "generated_by": "bench/large_run.py",
            "cpu": {"model": "generated", "logical_cores": 112, "physical_cores": 56,
                    "usable_cores": 112},
            "memory_gib": 2015.6, "accelerators": accel, "accelerator_count": DEVICES,
            "peak_ops_per_node": sum(a["peak_ops"] for a in accel), "nodes": replicas,
            "software": {"python": "3.11"}, "ruleset": rules.CURRENT.id, "provenance": None,
            "dataset_identity": None}


def _node(index: int) -> dict[str, Any]:
    host = f"node{index:04d}"
    accel = [{"index": i, "type": "cuda", "name": "NVIDIA H100 80GB HBM3 (generated)",
              "uuid": f"GPU-{index:04d}-{i}", "memory_gib": 79.1, "peak_ops": 9.89e14}
             for i in range(DEVICES)]
    return {"host": host, "system": {"cpu": {"model": "generated"}, "memory_gib": 2015.6,
                                     "accelerators": accel},
            "devices": [f"cuda:{i}" for i in range(DEVICES)], "ceiling_ops": 6.1e15,
            "ceiling": [{"device": f"cuda:{i}", "precision": "bf16", "side": 8192,
                         "ops_per_s": 6.1e15 / DEVICES, "kernel": "matmul"}
                        for i in range(DEVICES)]}


def _child(parent: Graph, rng: random.Random, taken: set[str]) -> tuple[Graph, list[dict[str, Any]]]:
    """A new architecture one to three morphs from ``parent``."""
    for _ in range(50):
        graph, morphs = parent, []
        try:
            for _ in range(rng.randint(1, 3)):
                graph, record = morph(graph, rng=rng, kernel_size=rng.choice((3, 5, 7)))
                morphs.append(record.to_dict())
        except MorphError:
            continue
        if graph.content_hash() not in taken:
            return graph, morphs
    raise RuntimeError("no new architecture in 50 tries")


def counted_budgets(config: Config, trials: int, epochs: int, replicas: int) -> list[int]:
    """Budget per trial of the counted shape: the configuration's epochs of its round,
    scaled so the run holds ``epochs`` epochs in ``trials`` trials."""
    per_replica = math.ceil(trials / replicas)
    budgets = [config.train.round_epochs(k % per_replica) for k in range(trials)]
    scale = epochs / sum(budgets)
    budgets = [max(1, round(b * scale)) for b in budgets]
    left, k = epochs - sum(budgets), 0
    while left and k < 100 * trials:  # spread what rounding missed, one epoch a trial
        step = 1 if left > 0 else -1
        if budgets[k % trials] + step >= 1:
            budgets[k % trials] += step
            left -= step
        k += 1
    return budgets


def _sqlite_fast(store: Any) -> None:
    if store.url.startswith("sqlite"):
        def fast(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA synchronous=OFF")

        sa.event.listen(store.engine, "connect", fast)


def generate(run_dir: Path, trials: int = 10_000, epochs: int = 500_000, replicas: int = 512,
             store_url: str | None = None, seed: int = 0, samples: bool = True,
             seed_model: str = "resnet50", progress: bool = False,
             duration_s: float | None = None, node_ops: float = NODE_OPS) -> dict[str, Any]:
    """Write the run directory; returns what was written and how long each part took.
    ``seed_model`` "resnet_small" makes smaller graphs, for a test that must be quick.
    ``duration_s``: the timed shape (module docstring); ``trials`` and ``epochs`` are then
    not used."""
    clock = time.perf_counter()
    rng = random.Random(seed)
    # The search's predictions come from a stream of their own, so that the rest of the run
    # is what it was before they were recorded.
    predictions = random.Random(seed + 1)
    search_of: dict[int, float] = {}  # what the search ranks each trial by
    rd = RunDir(Path(run_dir))
    rd.path.mkdir(parents=True, exist_ok=False)
    config = Config.for_dataset("imagenet", {"data": {"data_dir": "/generated/imagenet"},
                                             "model": {"seed_model": seed_model}})
    system = _system(replicas)
    write_atomic(rd.config, config.to_toml())
    write_atomic(rd.system, json.dumps(system, indent=1) + "\n")
    store = open_store(store_url, run_dir=rd.path, create=True)
    _sqlite_fast(store)
    t0 = 1_800_000_000.0
    # Budget per trial: the configuration's epochs of its round, scaled so the run holds
    # `epochs` epochs in `trials` trials.
    deadline = None if duration_s is None else t0 + duration_s
    budgets = [] if deadline is not None else counted_budgets(config, trials, epochs, replicas)
    run_id = store.create_run(rd.path.name, config.model_dump(mode="json"), system, 0.0, t0)
    rd.write_meta(run_id, strip_password(store_url) if store_url else None, rd.path.name)
    seed_graph = seeds.seed(seed_model, 1000, 224, 3)
    graphs: dict[int, Graph] = {}
    counts: dict[int, Any] = {}
    taken = {seed_graph.content_hash()}
    done: list[int] = []  # finished trials, by finish time (parents to choose from)
    finishing: list[tuple[float, int]] = []
    free = [(t0 + 20.0 + rng.random() * 10, r) for r in range(replicas)]  # after a launch
    heapq.heapify(free)
    replica_ids = [store.register_replica(run_id, r, 0, f"node{r:04d}", 1000 + r,
                                          [f"cuda:{i}" for i in range(DEVICES)], t0)
                   for r in range(replicas)]
    for r in range(replicas):
        node = _node(r)
        store.record_node(run_id, r, 0, node.pop("host"), node, t0 + 5.0)
    timings = {"setup_s": time.perf_counter() - clock}
    clock = time.perf_counter()
    rows: list[dict[str, Any]] = []
    finishes: list[tuple[int, str, float, float | None, float | None, str, dict[str, Any]]] = []
    rounds = [0] * replicas
    end_of_run = t0
    k = 0
    while (k < trials) if deadline is None else (free[0][0] < deadline):
        claimed_at, r = heapq.heappop(free)
        while finishing and finishing[0][0] <= claimed_at:
            done.append(heapq.heappop(finishing)[1])
        parent_id = rng.choice(done[-2000:]) if done else None
        parent = graphs[parent_id] if parent_id is not None else seed_graph
        graph, morphs = _child(parent, rng, taken)
        taken.add(graph.content_hash())
        round_index = rounds[r]
        rounds[r] += 1
        kernel = morphs[-1].get("kernel") or 3
        budget = budgets[k] if deadline is None else config.train.round_epochs(round_index)
        hparams = {"batch_size": BATCH, "kernel_size": kernel, "epochs": budget,
                   "patience": config.train.patience(round_index),
                   "tpe_trial": round_index - 3 if round_index >= 3 else None,
                   "world_size": DEVICES, "acquisition": "ucb", "generation_s": 1.2,
                   "candidate_wait_s": 0.0}
        if parent_id is not None:
            parent_accuracy = search_of[parent_id]
            hparams.update(parent_accuracy=parent_accuracy, predicted_std=0.01,
                           predicted_mean=parent_accuracy + predictions.gauss(0.005, 0.01))
        trial_id = store.claim_trial(Claim(
            run_id=run_id, replica_id=replica_ids[r], replica_index=r,
            graph_hash=graph.content_hash(), graph_json=graph.to_json(None), parent_id=parent_id,
            morphs=morphs, round=round_index, hparams=hparams, now=claimed_at, lease_s=60.0))
        assert trial_id is not None
        graphs[trial_id] = graph
        ops = counts.setdefault(trial_id, count(graph, batch_size=BATCH))
        per_epoch = epoch_ops(ops, TRAIN_IMAGES, math.ceil(math.ceil(TRAIN_IMAGES / DEVICES)
                                                           / (BATCH // DEVICES)), VAL_IMAGES)
        steps = math.ceil(math.ceil(TRAIN_IMAGES / DEVICES) / (BATCH // DEVICES))
        seconds = per_epoch / node_ops
        start = claimed_at + 3.0 + rng.random() * 2  # build the model, inherit weights
        top = 0.55 + 0.25 * rng.random()
        lines = []
        accs = []
        failed = rng.random() < 0.01  # stops after a third of its epochs
        n_epochs = max(1, budget // 3) if failed else budget
        cut = False
        for e in range(n_epochs):
            end = start + seconds * (0.97 + 0.06 * rng.random())
            if deadline is not None and end > deadline:
                cut, failed = True, False
                start = deadline
                break
            acc = top * (1 - math.exp(-(e + 1) / 8.0)) + 0.01 * rng.random()
            event = EpochEvent(trial_id=trial_id, epoch=e, started_at=start, ended_at=end,
                               train_images=TRAIN_IMAGES, val_images=VAL_IMAGES, steps=steps,
                               ops=per_epoch, train_loss=2.0 * (1 - acc), val_accuracy=acc,
                               precision="bf16", batch_size=BATCH, world_size=DEVICES,
                               data_share=0.02,
                               images_per_s=TRAIN_IMAGES / (0.95 * (end - start)))
            fields = dict(event.__dict__)  # to_dict()'s plain values, without its deep copy
            lines.append(json.dumps({"type": "epoch", **fields}))
            rows.append({**fields, "run_id": run_id})
            accs.append(acc)
            start = end + 0.2
        best: float | None = max(accs) if accs else None  # None: cut before its first epoch
        best_epoch = accs.index(best) if best is not None else None
        status = (TrialStatus.STOPPED if cut else
                  TrialStatus.FAILED if failed else TrialStatus.COMPLETED)
        reason = ("deadline reached" if cut else
                  "CUDA out of memory (generated)" if failed else "")
        extra = {"early_stopped": False, "precision": "bf16", "batch_size": BATCH,
                 "best_epoch": best_epoch}
        outcome = TrialOutcome(trial_id=trial_id, status=str(status), reason=reason, epochs=len(accs),
                               best_accuracy=best, best_epoch=best_epoch, batch_size=BATCH,
                               precision="bf16")
        lines.append(json.dumps({"type": "trial", **outcome.to_dict()}))
        folder = rd.trial(trial_id)
        folder.mkdir(parents=True)
        (folder / "graph.json").write_text(graph.to_json() + "\n")
        (folder / "log.jsonl").write_text("\n".join(lines) + "\n")
        predicted = (best * 1.1 if best is not None and round_index < config.search.hpo_start_round
                     else None)
        search_of[trial_id] = (best or 0.0) if predicted is None else predicted
        finishes.append((trial_id, str(status), start, best, predicted, reason, extra))
        heapq.heappush(finishing, (start, trial_id))
        heapq.heappush(free, (start + 1.0, r))
        end_of_run = max(end_of_run, start)
        if progress and k % 1000 == 0:
            print(f"  {k} trials", flush=True)
        k += 1
    timings["trials_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    rows.sort(key=lambda row: row["ended_at"])
    for i in range(0, len(rows), BATCH_ROWS):
        with store.engine.begin() as conn:
            conn.execute(T_EPOCHS.insert(), rows[i:i + BATCH_ROWS])
    for trial_id, status, at, best, predicted, reason, extra in finishes:
        store.finish_trial(trial_id, status, at, best_accuracy=best,
                           predicted_accuracy=predicted, reason=reason, extra=extra)
    timings["epochs_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    duration = math.ceil(end_of_run - t0 + 60.0 if duration_s is None else duration_s)
    with store.engine.begin() as conn:  # the run's duration is known only now
        conn.execute(sa.text("UPDATE amp_runs SET duration_s = :d WHERE id = :i"),
                     {"d": float(duration), "i": run_id})
    store.start_segment(run_id, t0, t0 + duration)
    store.end_segment(run_id, 0, t0 + duration)
    for replica_id in replica_ids:
        store.end_replica(replica_id, TrialStatus.STOPPED, t0 + duration)
    n_samples = 0
    if samples:
        for r in range(replicas):
            batch = []
            energy = [0] * DEVICES
            t = t0 + 2.0 + rng.random() * SAMPLE_S
            while t < t0 + duration:
                gpus = []
                for i in range(DEVICES):
                    power = 550 + 100 * rng.random()
                    energy[i] += int(power * SAMPLE_S * 1000)
                    gpus.append({"index": i, "uuid": f"GPU-{r:04d}-{i}", "util": 90 + 9 * rng.random(),
                                 "mem_used_gib": 60 + 10 * rng.random(), "mem_total_gib": 79.1,
                                 "power_w": power, "energy_mj": energy[i]})
                batch.append({"t": t, "cpu_percent": 40 + 20 * rng.random(),
                              "mem_used_gib": 900.0, "mem_total_gib": 2015.6, "gpus": gpus})
                t += SAMPLE_S
            store.add_samples(run_id, f"node{r:04d}", batch)
            n_samples += len(batch)
    timings["samples_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    config_run = json.loads(json.dumps(config.model_dump(mode="json")))
    config_run["run"]["duration_s"] = float(duration)
    config = Config.parse(config_run)
    write_atomic(rd.config, config.to_toml())
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE amp_runs SET config = :c WHERE id = :i"),
                     {"c": json.dumps(config.model_dump(mode="json")), "i": run_id})
    result = build_result(store, run_id, config, system)
    write_result(rd.result, result)
    timings["result_s"] = time.perf_counter() - clock
    store.close()
    return {"run_dir": str(rd.path), "trials": k, "epochs": len(rows),
            "replicas": replicas, "samples": n_samples, "duration_s": duration, **timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=500_000)
    ap.add_argument("--replicas", type=int, default=512)
    ap.add_argument("--store", default=None, help="a PostgreSQL URL (default: history.db)")
    ap.add_argument("--no-samples", action="store_true")
    ap.add_argument("--duration", type=float, default=None, metavar="S",
                    help="the timed shape: every replica trains until this deadline")
    ap.add_argument("--node-ops", type=float, default=NODE_OPS, help="operations/s of a node")
    args = ap.parse_args()
    print(json.dumps(generate(args.run_dir, args.trials, args.epochs, args.replicas, args.store,
                              samples=not args.no_samples, progress=True,
                              duration_s=args.duration, node_ops=args.node_ops)))


if __name__ == "__main__":
    main()
