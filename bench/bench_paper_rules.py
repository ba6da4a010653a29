"""The paper's rules where they move the number: the measurements behind docs/official.md's section
*Comparing with published AIPerf results*. Every run is a real ``automlperf run``.

``charge``: how run time is charged. Runs the built-in task with 1 and with 4 replicas (the
whole machine, one run at a time), and the official shape (ResNet-50 at 224, ImageNet's
image counts) on simulated accelerators with 1, 4 and 16 replicas. From the same records,
the score under three rules:

* ``last_epoch``: aiperf-2021.1 and the AIPerf reference's score.py: the operations of the
  epochs that ended by the deadline over the run time of the last of them;
* ``own_last_epoch``: each replica's operations over the run time of its own last epoch that
  ended by the deadline, summed (charges nothing in flight, but nothing idle either);
* ``per_replica``: aiperf-2021.2, the result's own: epochs in flight at the deadline finish
  inside the grace and count, each replica is charged to the deadline or to the end of its
  last counted epoch, whichever is later.

``early-stop``: early stopping on the validation accuracy with strict improvement (the rule
until now) against the validation loss with a minimum change of 0.001 (the paper's "once the
validation loss flats", its reference's Keras ``EarlyStopping(min_delta=0.001)``).

``hpo``: TPE drawn with each architecture, trained once (``with_nas``), against the paper's
order (``after_nas``: the architecture first, trained at its parent's batch size, then again
at TPE's).

For ``early-stop`` and ``hpo`` the two variants of a seed run side by side, each pinned to
its own core with one training thread, so that the machine's load hits both alike; the
variant order alternates from seed to seed. Printed: a table per study and one JSON line.

Run: python bench/bench_paper_rules.py charge --seeds 2
     python bench/bench_paper_rules.py early-stop --seeds 4 --duration 180
     python bench/bench_paper_rules.py hpo --seeds 3 --duration 600 \
         --set 'train.early_stop_metric="val_loss"' --set train.early_stop_min_delta=0.001
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from automlperf import rules
from automlperf.config import Config
from automlperf.measure.score import counted_epochs, score_run, segment_bounds
from automlperf.store import open_store

AUTOMLPERF = str(Path(sys.executable).with_name("automlperf"))
VARIANTS: dict[str, dict[str, dict[str, str]]] = {
    "early-stop": {
        "accuracy": {"train": {"early_stop_metric": "val_accuracy", "early_stop_min_delta": 0.0}},
        "loss": {"train": {"early_stop_metric": "val_loss", "early_stop_min_delta": 0.001}},
    },
    "hpo": {
        "with_nas": {"search": {"hpo_order": "with_nas"}},
        "after_nas": {"search": {"hpo_order": "after_nas"}},
    },
}


def toml(tree: dict[str, dict[str, Any]]) -> str:
    return "".join(f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
                   for section, keys in tree.items())


def start(tree: dict[str, dict[str, Any]], run_dir: Path, core: int | None = None,
          replicas: int | None = None) -> subprocess.Popen[bytes]:
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = run_dir.with_suffix(".toml")
    cfg.write_text(toml(tree))
    cmd = [AUTOMLPERF, "run", "--config", str(cfg), "--run-dir", str(run_dir)]
    if replicas is not None:
        cmd += ["--replicas", str(replicas)]
    env = dict(os.environ)
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    log = open(run_dir.with_suffix(".log"), "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def finish(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for proc, run_dir in procs:
        if proc.wait() != 0:
            raise SystemExit(f"{run_dir}: automlperf run exited {proc.returncode}; see "
                             f"{run_dir.with_suffix('.log')}")


def records(run_dir: Path) -> tuple[dict[str, Any], list[Any], list[Any], list[Any], Config]:
    result = json.loads((run_dir / "result.json").read_text())
    store = open_store(run_dir=run_dir)
    try:
        return (result, store.trials(1), store.epochs(1), store.segments(1),
                Config.load(run_dir / "config.toml"))
    finally:
        store.close()


def charge_figures(run_dir: Path) -> dict[str, Any]:
    """The score of one run under each way of charging its time."""
    result, trials, epochs, segments, config = records(run_dir)
    replica_of = {t.id: t.replica_index for t in trials}

    def scored(ruleset: rules.Ruleset, grace: float) -> dict[str, Any]:
        return score_run(epochs, segments, dataset=config.data.dataset, dataset_official=False,
                         fixed_changes=[], ruleset=ruleset, replica_of=replica_of,
                         grace_s=grace)

    last = scored(rules.AIPERF_2021_1, 0.0)
    ruleset = rules.get(result.get("ruleset"))
    mine = scored(ruleset, config.deadline_grace(ruleset))
    assert abs(mine["score"] - result["score"]) <= 1e-9 * result["score"]
    inside = counted_epochs(epochs, segments)
    bounds = segment_bounds(segments)
    start = bounds[0][0]
    ops: dict[int, int] = {}
    last_end: dict[int, float] = {}
    for t, e in inside:
        r = replica_of[e.trial_id]
        ops[r] = ops.get(r, 0) + e.ops
        last_end[r] = max(last_end.get(r, 0.0), t)
    own = sum(ops[r] / last_end[r] for r in ops)
    deadline = segments[-1].deadline_at
    late = [e for e in epochs if e.ended_at > deadline and e.started_at < deadline]
    counted_late = mine["epochs"] - last["epochs"]
    return {"run": run_dir.name, "replicas": len({t.replica_index for t in trials}),
            "elapsed_s": mine["elapsed_s"], "epochs": last["epochs"],
            "in_grace": counted_late, "past_grace": len(late) - counted_late,
            "grace_used_s": max([e.ended_at - deadline for e in late], default=0.0),
            "start_s": (min((e.started_at for e in epochs), default=start) - start),
            "epoch_s": statistics.median([e.ended_at - e.started_at for e in epochs] or [0.0]),
            "last_epoch": last["score"], "own_last_epoch": own, "per_replica": mine["score"],
            "regulated_last_epoch": last["regulated_score"],
            "regulated_per_replica": mine["regulated_score"]}


def charge(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    for seed in range(args.seeds):
        for replicas in (1, 4):
            run_dir = work / f"builtin-r{replicas}-s{seed}"
            tree = {"run": {"seed": seed, "duration_s": args.duration},
                    "data": {"dataset": "builtin"}}
            finish([(start(tree, run_dir, replicas=replicas), run_dir)])
            rows.append({"task": "builtin", "seed": seed, **charge_figures(run_dir)})
            print(json.dumps(rows[-1]), flush=True)
    for replicas in args.simulated:
        # ImageNet's counts and ResNet-50 at 224 on simulated H100-class devices (2e14 OPS
        # each), an hour modelled in duration/3600 of the time: epochs of 150 s modelled.
        run_dir = work / f"official-sim-r{replicas}"
        tree = {"run": {"duration_s": args.sim_duration, "accelerator": "simulated"},
                "data": {"dataset": "imagenet"},
                "simulation": {"time_compression": 3600 / args.sim_duration}}
        finish([(start(tree, run_dir, replicas=replicas), run_dir)])
        rows.append({"task": "official-simulated", "seed": 0, **charge_figures(run_dir)})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'run':<22}{'epochs':>7}{'in grace':>9}{'past':>6}{'epoch s':>9}"
          f"{'last_epoch':>13}{'own_last':>13}{'per_replica':>13}{'ratio':>8}")
    for r in rows:
        print(f"{r['run']:<22}{r['epochs']:>7}{r['in_grace']:>9}{r['past_grace']:>6}"
              f"{r['epoch_s']:>9.1f}{r['last_epoch']:>13.4g}{r['own_last_epoch']:>13.4g}"
              f"{r['per_replica']:>13.4g}"
              f"{r['per_replica'] / r['last_epoch'] if r['last_epoch'] else float('nan'):>8.4f}")
    return rows


def run_figures(run_dir: Path, duration: float) -> dict[str, Any]:
    """Trials, trainings, early stops, rounds, accuracy over time and the scores of a run."""
    result, trials, epochs, segments, config = records(run_dir)
    trained = [t for t in trials if t.epochs_done]
    trainings = sum(len(t.extra.get("trainings", [])) or 1 for t in trained)
    stops = sum(sum(1 for x in t.extra["trainings"] if x.get("early_stopped"))
                if "trainings" in t.extra else int(bool(t.extra.get("early_stopped")))
                for t in trained)
    start = segments[0].started_at
    best_by = {}
    for q in (0.25, 0.5, 0.75, 1.0):
        reached = [e.val_accuracy for e in epochs if e.ended_at - start <= q * duration]
        best_by[str(q)] = max(reached, default=None)
    hours = result["elapsed_s"] / 3600
    return {"trials": len(trained), "trials_per_h": len(trained) / hours,
            "trainings": trainings, "trainings_per_h": trainings / hours,
            "early_stops": stops, "epochs": result["epochs"],
            "max_round": max((t.round for t in trained), default=None),
            "best_accuracy": result["best_accuracy"], "best_by": best_by,
            "score": result["score"], "regulated_score": result["regulated_score"]}


def paired(study: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    names = list(VARIANTS[study])
    rows = []
    for seed in range(args.seeds):
        order = names if seed % 2 == 0 else names[::-1]
        procs = []
        for core, name in enumerate(order):
            run_dir = work / f"{study}-{name}-s{seed}"
            tree = {"run": {"seed": seed, "duration_s": args.duration},
                    "data": {"dataset": "builtin"}}
            for dotted, value in args.set:
                section, key = dotted.split(".")
                tree.setdefault(section, {})[key] = value
            for section, keys in VARIANTS[study][name].items():
                tree.setdefault(section, {}).update(keys)
            procs.append((start(tree, run_dir, core=core % (os.cpu_count() or 1)), run_dir))
        finish(procs)
        for (_, run_dir), name in zip(procs, order):
            rows.append({"variant": name, "seed": seed, **run_figures(run_dir, args.duration)})
            print(json.dumps(rows[-1]), flush=True)
    keys = ("trials_per_h", "trainings_per_h", "early_stops", "epochs", "max_round",
            "best_accuracy", "score", "regulated_score")
    print(f"\n{'variant':<12}" + "".join(f"{k:>17}" for k in keys))
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        cells = [statistics.median(r[k] for r in mine if r[k] is not None) for k in keys]
        print(f"{name:<12}" + "".join(f"{c:>17.4g}" for c in cells))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", choices=("charge", "early-stop", "hpo"))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=180.0, help="seconds per run")
    ap.add_argument("--simulated", default="1,4,16",
                    help="replica counts of the simulated official-shape runs (charge)")
    ap.add_argument("--sim-duration", type=float, default=180.0,
                    help="wall seconds of a simulated run (an hour modelled)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=JSON",
                    help="a setting for every run of a paired study, e.g. "
                         "train.early_stop_metric='\"val_loss\"' (repeatable)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-paper-rules"))
    args = ap.parse_args()
    args.set = [(k, json.loads(v)) for k, v in (item.split("=", 1) for item in args.set)]
    args.simulated = [int(n) for n in args.simulated.split(",") if n]
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.time()
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    rows = charge(args, args.work) if args.study == "charge" else paired(args.study, args, args.work)
    print(json.dumps({"study": args.study, "seeds": args.seeds, "duration_s": args.duration,
                      "loadavg_before": loadavg,
                      "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
                      "wall_s": round(time.time() - began), "rows": rows}))


if __name__ == "__main__":
    main()
