"""Search quality: does the Bayesian optimiser find better models than chance, in equal time?

Three methods get the same wall-clock budget on the built-in task (the ``builtin`` preset:
MNIST sample, 16x16, small ResNet seed), each with several seeds:

* ``bo``: the benchmark's search (``Searcher``: Gaussian process on the edit distance,
  simulated-annealing tree search, UCB), children inheriting their parent's weights;
* ``random``: the same morph operators and weight inheritance, but a parent drawn at random
  among the trained models and 1 to ``max_morphs_per_child`` random morphs;
* ``seed``: no search, the seed retrained from scratch for the full epoch budget with a new
  initialisation each time.

Trials run on the real training processes (``DevicePool``/``train_trial``), with the run's
epoch schedule per round (warm-up rounds short, ranked by the predicted accuracy, as a
replica does). Batch size and kernel size stay at the preset's default (no TPE), so the
methods differ only in which architecture they train. Each (method, seed) runs in its own
process, methods interleaved within a seed so that machine load drifts hit all of them.

Reported: the best validation accuracy reached by each time (quarter marks of the budget),
median and spread (min..max) over seeds, per method.

Run: python bench/bench_search_quality.py [--budget 240] [--seeds 3] [--parallel 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

METHODS = ("bo", "random", "seed")


def one_run(method: str, seed: int, budget: float, threads: int) -> dict[str, Any]:
    from automlperf.config import Config
    from automlperf.graph import seeds
    from automlperf.search import Candidate, Model, MorphError, Searcher, morph
    from automlperf.search.curve import predict_final
    from automlperf.train.pool import DataArgs, DevicePool, train_trial
    from automlperf.train.trainer import TrialSpec

    config = Config.for_dataset("builtin")
    train, search = config.train, config.search
    batch = train.per_device_batch(None)
    kernel = min(search.kernel_sizes)
    rng = random.Random(seed * 7919)
    searcher = Searcher(search)
    history: list[Model] = []
    weights: dict[int, str] = {}
    curve: list[tuple[float, float]] = []  # (seconds since start, best accuracy so far)
    trials = []
    best = 0.0
    gen_seconds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, \
            DevicePool(["cpu"], DataArgs.from_config(config.data, threads),
                       threads_per_rank=threads) as pool:
        desc = pool.description["dataset"]
        seed_graph = seeds.seed(config.model.seed_model, desc["classes"], desc["image_size"],
                                desc["channels"])
        start = time.monotonic()
        deadline = start + budget

        def random_child(trained: list[Model], taken: set[str]) -> Candidate:
            for _ in range(200):
                parent = rng.choice(trained)
                graph, records = parent.graph, []
                for _ in range(rng.randint(1, search.max_morphs_per_child)):
                    try:
                        graph, record = morph(graph, "random", rng, kernel, searcher.limits)
                    except MorphError:
                        break
                    records.append(record.to_dict())
                if records and graph.content_hash() not in taken:
                    return Candidate(graph, parent.id, records)
            raise RuntimeError("no new random child")

        n = 0
        while time.monotonic() < deadline:
            round_index = n
            t0 = time.monotonic()
            trained = [m for m in history if m.accuracy is not None]
            if method == "seed":
                cand = Candidate(seed_graph, None, [])
                epochs = train.max_epochs
            elif method == "bo" or not trained:
                cand = searcher.next_candidate(history, seed_graph, rng, kernel)
                epochs = train.round_epochs(round_index)
            else:
                cand = random_child(trained, {m.content_hash for m in history})
                epochs = train.round_epochs(round_index)
            gen_seconds.append(time.monotonic() - t0)
            parent = cand.parent_id
            out = f"{tmp}/{n}.safetensors"
            spec = TrialSpec.from_config(
                train, config.model.initial_weights, trial_id=n, graph=cand.graph.to_dict(),
                epochs=epochs, batch_size=batch, patience=train.patience(round_index),
                seed=seed * 1_000_003 + n, weights_out=out, round=round_index,
                parent_graph=None if parent is None else history[parent].graph.to_dict(),
                parent_weights=None if parent is None else weights.get(parent))
            accs: list[float] = []

            def on_message(kind: str, msg: dict[str, Any], accs: list[float] = accs) -> None:
                nonlocal best
                if kind != "epoch":
                    return
                accs.append(msg["val_accuracy"])
                if msg["val_accuracy"] > best:
                    best = msg["val_accuracy"]
                    curve.append((time.monotonic() - start, best))

            outcome = train_trial(pool, spec, on_message,
                                should_stop=lambda: time.monotonic() >= deadline)
            ranked = None
            if accs:
                ranked = max(accs)
                if round_index < search.hpo_start_round and method != "seed":
                    ranked = predict_final(accs, train.max_epochs)
            if Path(out).exists():
                weights[n] = out
            history.append(Model(n, cand.graph, ranked if outcome.status == "completed"
                                 and ranked is not None else None,
                                 "completed" if outcome.status == "completed" else "failed"))
            trials.append({"parent": parent, "morphs": len(cand.morphs), "epochs": len(accs),
                           "best": max(accs) if accs else None, "status": outcome.status})
            n += 1
    return {"method": method, "seed": seed, "budget_s": budget, "threads": threads,
            "curve": curve, "best": best, "trials": trials,
            "generation_s_median": statistics.median(gen_seconds) if gen_seconds else None}


def best_at(curve: list[list[float]], t: float) -> float:
    reached = [a for s, a in curve if s <= t]
    return max(reached) if reached else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time")
    ap.add_argument("--threads", type=int, default=None, help="per run (default cores/parallel)")
    ap.add_argument("--log", default=None, help="append each run's JSON here as it ends")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.parallel)
    if args.one:
        print(json.dumps(one_run(args.one[0], int(args.one[1]), args.budget, threads)))
        return
    methods = args.methods.split(",")
    queue = [(m, s) for s in range(args.seeds) for m in methods]
    running: list[tuple[str, int, subprocess.Popen[str]]] = []
    results: list[dict[str, Any]] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    while queue or running:
        while queue and len(running) < args.parallel:
            m, s = queue.pop(0)
            cmd = [sys.executable, __file__, "--one", m, str(s), "--budget", str(args.budget),
                   "--threads", str(threads)]
            running.append((m, s, subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                                   env=env)))
        m, s, proc = running.pop(0)
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"run {m} seed {s} failed (exit {proc.returncode})")
        res = json.loads(stdout.strip().splitlines()[-1])
        results.append(res)
        print(f"  {m:>6} seed {s}: best {res['best']:.4f} after {len(res['trials'])} trials",
              flush=True)
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps(res) + "\n")
    summarise(results, methods, args.budget, threads, args.parallel)


def summarise(results: list[dict[str, Any]], methods: list[str], budget: float, threads: int,
              parallel: int) -> None:
    marks = [budget * q for q in (0.25, 0.5, 0.75, 1.0)]
    out: dict[str, Any] = {"bench": "search_quality", "budget_s": budget, "threads": threads,
                           "parallel": parallel, "methods": {}}
    print(f"best validation accuracy reached by each time (median [min..max] over seeds), "
          f"{budget:.0f} s budget")
    print(f"{'method':>8}{'seeds':>6}" + "".join(f"{f'{t:.0f} s':>26}" for t in marks)
          + f"{'trials':>8}")
    for m in methods:
        runs = [r for r in results if r["method"] == m]
        if not runs:
            continue
        row: dict[str, Any] = {"seeds": len(runs), "at": {}}
        cells = []
        for t in marks:
            vals = [best_at(r["curve"], t) for r in runs]
            med = statistics.median(vals)
            row["at"][f"{t:.0f}"] = {"median": round(med, 4), "min": round(min(vals), 4),
                                     "max": round(max(vals), 4)}
            cells.append(f"{med:.4f} [{min(vals):.4f}..{max(vals):.4f}]")
        row["trials_median"] = statistics.median(len(r["trials"]) for r in runs)
        row["final"] = [round(r["best"], 4) for r in runs]
        out["methods"][m] = row
        print(f"{m:>8}{len(runs):>6}" + "".join(f"{c:>26}" for c in cells)
              + f"{row['trials_median']:>8.0f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
