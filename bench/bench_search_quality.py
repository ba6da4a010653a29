"""Search quality: does the Bayesian optimiser find better models than simpler searches, in
the same time and the same number of trials?

Every run is a real ``automlperf run`` (primary, replica, training process, store, scoring)
on the built-in task, one replica on one core, with the same wall-clock budget and the same
number of trials (``run.max_rounds``); the methods differ only in the search settings:

* ``bo``: the benchmark's search (Gaussian process on the edit distance, UCB, children
  inheriting their parent's weights, TPE over batch and kernel size from round 3);
* ``random``: random morphs of a trained model drawn at random (``search.strategy``);
* ``greedy``: random morphs of the most accurate model so far;
* ``bo-scratch``: the optimiser, each child trained from fresh weights
  (``search.inherit_weights = false``);
* ``bo-no-tpe``: the optimiser with TPE off (``search.hpo = "none"``: the default batch and
  the smallest kernel size in every round).

All methods keep the same morphs, epoch schedule, warm-up prediction and seeds: with run seed
``s``, the first trial (the seed model, same initialisation) is the same training for every
method. Runs go ``--parallel`` at a time, each pinned to its own core (one training thread),
methods interleaved within a seed and their order rotated from seed to seed, so that the
machine's load hits every method alike.

Reported per method: the median and 95 % bootstrap interval (percentile, 10,000 resamples)
over seeds of the best validation accuracy reached by 25/50/75/100 % of the budget and of the
regulated score of result.json; and, paired by seed, the differences against ``random`` with
their bootstrap interval, wins/ties/losses and the Wilcoxon signed-rank p-value.

The task: the built-in MNIST sample (2,000 training and 3,000 validation images) at 8x8
(``--image-size``), the small ResNet seed, 2-epoch trials (``--epochs``: rounds 0-2 train 1,
1 and 2 epochs, ranked by the predicted accuracy; every trial's learning rate decays over 2
epochs), 20 trials (``--trials``) within 240 s (``--budget``). A trial takes a few seconds
on one core, so 8 seeds of the 5 methods take about an hour at 2 runs at a time. A run's
choices follow from its seed and the order of its events, not from time, and training on one
core is deterministic: the machine's load moves the time marks, not the figures after k
trials (unless a run's budget ends before its k-th trial).

Run: python bench/bench_search_quality.py --seeds 8 --trials 20 --budget 240 --epochs 2
(a --log file keeps each run's figures as it ends; a second call with the same --log runs
only what is missing, and --summarise-only prints the tables from it)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

METHODS: dict[str, dict[str, Any]] = {
    "bo": {},
    "random": {"strategy": "random"},
    "greedy": {"strategy": "greedy"},
    "bo-scratch": {"inherit_weights": False},
    "bo-no-tpe": {"hpo": "none"},
}
BASELINE = "random"
# Paired differences are taken against the baseline and, for the ablations, the optimiser.
REFERENCES = (BASELINE, "bo")
QUARTERS = (0.25, 0.5, 0.75, 1.0)
AUTOMLPERF = str(Path(sys.executable).with_name("automlperf"))


def config_text(method: str, seed: int, budget: float, trials: int, epochs: int,
                image_size: int) -> str:
    search = "".join(f"{k} = {json.dumps(v)}\n" for k, v in METHODS[method].items())
    return (f"[run]\nduration_s = {budget}\nseed = {seed}\nmax_rounds = {trials}\n"
            f"[data]\ndataset = \"builtin\"\nimage_size = {image_size}\n"
            # The narrow seed, as measured: the built-in preset widens it for throughput.
            f"[model]\nseed_width = 1\n"
            f"[train]\nmax_epochs = {epochs}\nchannels_last = false\n"
            f"[monitor]\nceiling_s = 0.5\n"
            f"[search]\n{search}")


def start_run(method: str, seed: int, args: argparse.Namespace, core: int | None,
              work: Path) -> tuple[subprocess.Popen[bytes], Path]:
    run_dir = work / f"{method}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = work / f"{method}-s{seed}.toml"
    cfg.write_text(config_text(method, seed, args.budget, args.trials, args.epochs,
                               args.image_size))
    cmd = [AUTOMLPERF, "run", "--config", str(cfg), "--run-dir", str(run_dir)]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(work / f"{method}-s{seed}.log", "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), run_dir


def read_run(method: str, seed: int, run_dir: Path, budget: float,
             wall_s: float) -> dict[str, Any]:
    """What the comparison needs from a finished run directory."""
    from automlperf.measure.score import counted_epochs, timeline
    from automlperf.report.progress import gp_ranking
    from automlperf.store import open_store
    from automlperf.store.rundir import RunDir

    rd = RunDir(run_dir)
    result = json.loads(rd.result.read_text())
    store = open_store(run_dir=run_dir)
    try:
        run_id = int(rd.meta()["run_id"])
        counted = counted_epochs(store.epochs(run_id), store.segments(run_id))
        trials = store.trials(run_id)
    finally:
        store.close()
    marks = timeline(counted, budget, marks_at=[q * budget for q in QUARTERS])
    ranking = gp_ranking(trials)
    return {
        "method": method, "seed": seed, "budget_s": budget, "wall_s": round(wall_s, 1),
        "best_at": [m.best_accuracy for m in marks],
        "regulated_at": [m.regulated for m in marks],
        "regulated_score": result["regulated_score"], "score": result["score"],
        "best_accuracy": result["best_accuracy"], "elapsed_s": result["elapsed_s"],
        "trials": len(trials),
        "completed": sum(t.status == "completed" for t in trials),
        "epochs": len(counted),
        "gp_ranked_above": ranking.ranked_above, "gp_improved": ranking.improved_when_above,
        "improved_otherwise": ranking.improved_otherwise, "others": ranking.others,
        "trial_rows": [{"id": t.id, "parent": t.parent_id, "round": t.round,
                        "status": t.status, "best": t.best_accuracy,
                        "search": t.search_accuracy, "epochs": t.epochs_done,
                        "batch": t.hparams.get("batch_size"),
                        "kernel": t.hparams.get("kernel_size"),
                        "predicted_mean": t.hparams.get("predicted_mean"),
                        "parent_accuracy": t.hparams.get("parent_accuracy"),
                        "morphs": [m["op"] for m in t.morphs]} for t in trials],
    }


def queue_of(methods: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Seed by seed, the methods' order rotated by one each seed: no method always starts
    first, or always shares the machine with the same other."""
    out = []
    for i, seed in enumerate(seeds):
        k = i % len(methods)
        out += [(m, seed) for m in methods[k:] + methods[:k]]
    return out


def load_log(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_all(args: argparse.Namespace, methods: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    log_path = Path(args.log) if args.log else None
    results = load_log(log_path)
    done = {(r["method"], r["seed"]) for r in results}
    queue = [job for job in queue_of(methods, seeds) if job not in done]
    cores = len(os.sched_getaffinity(0))
    work = Path(args.work or tempfile.mkdtemp(prefix="search-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{len(queue)} runs to go ({len(done)} in the log), {args.parallel} at a time, "
          f"run directories in {work}; load average {os.getloadavg()}", flush=True)
    running: dict[int, tuple[str, int, subprocess.Popen[bytes], Path, float]] = {}
    try:
        _drive(args, queue, running, results, work, cores, log_path)
    finally:
        # Interrupted: each run stops as `automlperf run` does on SIGTERM (a background
        # job's children ignore SIGINT).
        for _, _, proc, _, _ in running.values():
            proc.terminate()
        for _, _, proc, _, _ in running.values():
            proc.wait(timeout=120)
    return results


def _drive(args: argparse.Namespace, queue: list[tuple[str, int]],
           running: dict[int, tuple[str, int, subprocess.Popen[bytes], Path, float]],
           results: list[dict[str, Any]], work: Path, cores: int, log_path: Path | None) -> None:
    while queue or running:
        for slot in range(args.parallel):
            if slot not in running and queue:
                method, seed = queue.pop(0)
                proc, run_dir = start_run(method, seed, args, slot % cores if args.pin else None,
                                          work)
                running[slot] = (method, seed, proc, run_dir, time.monotonic())
        time.sleep(1.0)
        for slot, (method, seed, proc, run_dir, started) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[slot]
            if proc.returncode != 0:
                sys.exit(f"run {method} seed {seed} failed (exit {proc.returncode}); see "
                         f"{work / f'{method}-s{seed}.log'}")
            res = read_run(method, seed, run_dir, args.budget, time.monotonic() - started)
            res["load_average"] = os.getloadavg()[0]
            results.append(res)
            print(f"  {method:>10} seed {seed}: best {res['best_accuracy']:.4f}, regulated "
                  f"{res['regulated_score']:.4e}, {res['trials']} trials in "
                  f"{res['elapsed_s']:.0f} s (load {res['load_average']:.1f})", flush=True)
            if log_path is not None:
                with log_path.open("a") as f:
                    f.write(json.dumps(res) + "\n")


# --- statistics -------------------------------------------------------------------------
def median_ci(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Median and its 95 % percentile-bootstrap interval."""
    data = np.asarray(values, dtype=float)
    med = float(np.median(data))
    if len(data) < 2 or np.all(data == data[0]):
        return med, med, med
    res = stats.bootstrap((data,), np.median, confidence_level=0.95, n_resamples=10_000,
                          method="percentile", random_state=np.random.default_rng(seed))
    return med, float(res.confidence_interval.low), float(res.confidence_interval.high)


def wilcoxon_p(diffs: list[float]) -> float | None:
    nonzero = [d for d in diffs if d != 0]
    if len(nonzero) < 2:
        return None
    return float(stats.wilcoxon(nonzero).pvalue)


def best_after(run: dict[str, Any], k: int) -> float:
    """The best validation accuracy of a run's first ``k`` trials (all it has, when the
    budget ended it sooner)."""
    reached = [t["best"] for t in run["trial_rows"][:k] if t["best"] is not None]
    return max(reached) if reached else 0.0


def figures_of(budget: float, trials: int) -> list[tuple[str, str, Any]]:
    """(name, column title, value of a run) of every figure compared."""
    out: list[tuple[str, str, Any]] = [
        (f"best@{int(q * 100)}%", f"{q * budget:.0f} s", lambda r, i=i: r["best_at"][i])
        for i, q in enumerate(QUARTERS)]
    out.append(("regulated", "regulated score (GOPS)", lambda r: r["regulated_score"]))
    for k in (round(q * trials) for q in QUARTERS):
        out.append((f"after{k}", f"{k} trials", lambda r, k=k: best_after(r, k)))
    return out


def summarise(results: list[dict[str, Any]], methods: list[str], budget: float,
              trials: int) -> dict[str, Any]:
    by = {(r["method"], r["seed"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    out: dict[str, Any] = {"bench": "search_quality", "budget_s": budget, "trials": trials,
                           "methods": {}}
    for m in methods:
        runs = [by[(m, s)] for s in seeds if (m, s) in by]
        if not runs:
            continue
        row: dict[str, Any] = {"seeds": len(runs),
                               "trials": sorted(r["trials"] for r in runs),
                               "elapsed_s_median": statistics.median(r["elapsed_s"] for r in runs)}
        for name, _, get in figures_of(budget, trials):
            vals = [get(r) or 0.0 for r in runs]
            row[name] = dict(zip(("median", "low", "high"), median_ci(vals)))
            for ref in REFERENCES:
                paired = [s for s in seeds if (m, s) in by and (ref, s) in by]
                if m == ref or not paired:
                    continue
                diffs = [(get(by[(m, s)]) or 0.0) - (get(by[(ref, s)]) or 0.0)
                         for s in paired]
                med, lo, hi = median_ci(diffs)
                row[f"{name} vs {ref}"] = {
                    "median": med, "low": lo, "high": hi, "pairs": len(paired),
                    "wins": sum(d > 0 for d in diffs), "ties": sum(d == 0 for d in diffs),
                    "losses": sum(d < 0 for d in diffs), "wilcoxon_p": wilcoxon_p(diffs)}
        row["behaviour"] = behaviour(runs)
        above = sum(r.get("gp_ranked_above") or 0 for r in runs)
        others = sum(r.get("others") or 0 for r in runs)
        if above or others:
            row["gp_ranked_above_improved"] = [sum(r["gp_improved"] for r in runs), above]
            row["others_improved"] = [sum(r["improved_otherwise"] for r in runs), others]
        out["methods"][m] = row
    return out


def behaviour(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What a method's children were: morphs per child, the kinds used, and (from round 3 on)
    the gain over the parent in the search's own accuracy and how often it was positive."""
    counts = [0, 0, 0, 0]
    kinds: dict[str, int] = {}
    gains = []
    for r in runs:
        search = {t["id"]: t["search"] for t in r["trial_rows"]}
        for t in r["trial_rows"]:
            if t["parent"] is None:
                continue
            counts[min(len(t["morphs"]), 3)] += 1
            for op in t["morphs"]:
                kinds[op] = kinds.get(op, 0) + 1
            if t["round"] >= 3 and t["status"] == "completed" and t["search"] is not None \
                    and search.get(t["parent"]) is not None:
                gains.append(t["search"] - search[t["parent"]])
    children = sum(counts)
    return {"children": children,
            "morphs_per_child": {k: counts[k] for k in (1, 2, 3)},
            "kinds": dict(sorted(kinds.items())),
            "mean_gain": statistics.mean(gains) if gains else None,
            "beat_parent": sum(g > 0 for g in gains) / len(gains) if gains else None,
            "gains": len(gains)}


def _cell(c: dict[str, Any], name: str) -> str:
    k = 1e-9 if name == "regulated" else 100
    return f"{c['median'] * k:.2f} [{c['low'] * k:.2f}, {c['high'] * k:.2f}]"


def print_tables(summary: dict[str, Any], methods: list[str]) -> None:
    figures = figures_of(summary["budget_s"], summary["trials"])
    groups = [("best validation accuracy (%) by each share of the budget, and the regulated "
               "score (GOPS)", figures[:5]),
              ("best validation accuracy (%) of the first k trials", figures[5:])]
    for title, group in groups:
        print(f"\n{title}: median [95 % bootstrap interval] over seeds")
        print("| method | seeds | trials (min–max) | " + " | ".join(t for _, t, _ in group)
              + " |")
        print("|---|---|---|" + "---|" * len(group))
        for m in methods:
            row = summary["methods"].get(m)
            if row is None:
                continue
            trials = row["trials"]
            print(f"| {m} | {row['seeds']} | {trials[0]}–{trials[-1]} | "
                  + " | ".join(_cell(row[n], n) for n, _, _ in group) + " |")
        print("\npaired by seed (points of accuracy; GOPS): median difference [95 % bootstrap "
              "interval], wins/ties/losses, Wilcoxon signed-rank p")
        print("| difference | " + " | ".join(t for _, t, _ in group) + " |")
        print("|---|" + "---|" * len(group))
        for ref in REFERENCES:
            for m in methods:
                row = summary["methods"].get(m)
                if row is None or f"{group[0][0]} vs {ref}" not in row:
                    continue
                if ref != BASELINE and m in REFERENCES:
                    continue  # already shown the other way round
                cells = []
                for name, _, _ in group:
                    c = row[f"{name} vs {ref}"]
                    p = "-" if c["wilcoxon_p"] is None else f"{c['wilcoxon_p']:.3f}"
                    cells.append(f"{_cell(c, name)} {c['wins']}/{c['ties']}/{c['losses']} "
                                 f"p={p}")
                print(f"| {m} − {ref} | " + " | ".join(cells) + " |")
    print("\nchildren: morphs per child (1/2/3), morph kinds, and from round 3 on the mean "
          "gain over the parent (points) and the share that beat it")
    for m in methods:
        b = (summary["methods"].get(m) or {}).get("behaviour")
        if b is None or not b["children"]:
            continue
        per = "/".join(str(b["morphs_per_child"][k]) for k in (1, 2, 3))
        gain = "-" if b["mean_gain"] is None else f"{100 * b['mean_gain']:+.2f}"
        share = "-" if b["beat_parent"] is None else f"{100 * b['beat_parent']:.0f} %"
        print(f"{m}: {b['children']} children, {per}; {b['kinds']}; gain {gain} over "
              f"{b['gains']}, {share} beat their parent")
    for m in methods:
        row = summary["methods"].get(m) or {}
        if "gp_ranked_above_improved" in row:
            a, n = row["gp_ranked_above_improved"]
            b, k = row["others_improved"]
            print(f"{m}: children the GP ranked above their parent that beat it: {a} of {n}"
                  + (f" ({100 * a / n:.0f} %)" if n else "") + f"; the others: {b} of {k}"
                  + (f" ({100 * b / k:.0f} %)" if k else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--trials", type=int, default=20, help="trials per run (run.max_rounds)")
    ap.add_argument("--epochs", type=int, default=2, help="train.max_epochs (rounds 0-2 "
                    "train a quarter, half and three quarters of it)")
    ap.add_argument("--image-size", type=int, default=8, help="side of the MNIST sample's "
                    "images (data.image_size)")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin each run to a core")
    ap.add_argument("--work", default=None, help="folder for the run directories")
    ap.add_argument("--log", default=None, help="JSON lines, one per finished run")
    ap.add_argument("--summarise-only", action="store_true")
    args = ap.parse_args()
    methods = args.methods.split(",")
    unknown = set(methods) - set(METHODS)
    if unknown:
        sys.exit(f"unknown method(s) {', '.join(sorted(unknown))}; known: {', '.join(METHODS)}")
    seeds = list(range(args.seeds))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the runs stop with the bench
    if args.summarise_only:
        results = [r for r in load_log(Path(args.log)) if r["method"] in methods]
    else:
        results = run_all(args, methods, seeds)
    summary = summarise(results, methods, args.budget, args.trials)
    print_tables(summary, methods)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
