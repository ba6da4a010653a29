"""Pipeline efficiency: the sustained OPS of a whole run divided by the OPS the same trials
reach in pure training steps.

1. Run the benchmark (the README's main job: builtin data, small seed) for --duration.
2. For every trial it trained, time pure training steps of the same graph at the same batch
   size on the same data and threads (no validation, no search, no process or trial set-up),
   and pure validation passes (forward only, in evaluation mode and inference mode, as the
   trainer validates), giving that trial's pure training and validation OPS.
3. The pure time of the run's work charges each phase what it did: sum over trials of
   (training operations / pure training OPS + validation operations / pure validation OPS),
   and the pure OPS of the run is its operations over that time. Efficiency is the run's OPS
   (its score: operations over the run time to its last completed epoch, as the score is
   defined) over that pure OPS. Target >= 0.97. Also given: the pure time over the whole
   elapsed time, which charges the epoch cut short at the deadline too, and the efficiency as
   it was computed before, with validation charged at the training rate (which flattered it:
   validation's forward passes run nearer the ceiling than training steps).

Also reported: the share of the run that replicas spent inside epochs (training and
validation), which separates search and set-up overhead from in-epoch overhead.

Run: python bench/bench_pipeline.py [--duration 300] [--replicas 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# Before torch: the pure steps wait in OpenMP as a rank does (train/__init__.py sets it).
import automlperf.train  # noqa: F401
import torch

from automlperf.config import Config
from automlperf.graph import Graph
from automlperf.measure.score import counted_epochs
from automlperf.ops import count, epoch_ops
from automlperf.store import open_store
from automlperf.train.builder import build_module
from automlperf.train.data import builtin
from automlperf.train.evaluate import count_correct
from automlperf.train.rankenv import keep_host_memory
from automlperf.train.device import channels_last_default
from automlperf.hardware import cores_available


def pure_ops_per_s(graph: Graph, batch: int, data, channels_last: bool, steps: int = 12) -> float:
    """Training-step throughput in operations per second (forward, backward, update), in the
    memory layout the run trained in."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    module = build_module(graph, seed=0).to(memory_format=fmt)
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    batches = [b for _, b in zip(range(steps + 2), data.batches("train", 0, 1, batch, 0, 0,
                                                                  torch.device("cpu")))]
    module.train()
    images, t0 = 0, 0.0
    for i, (x, y) in enumerate(batches):
        if i == 2:  # warm-up
            t0, images = time.perf_counter(), 0
        loss = loss_fn(module(x.contiguous(memory_format=fmt)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        images += len(y)
    seconds = time.perf_counter() - t0
    ops = count(graph, batch_size=batch)
    steps_timed = len(batches) - 2
    return (images * (ops.forward + ops.backward_grad) + steps_timed * ops.update_per_step) / seconds


def pure_val_ops_per_s(graph: Graph, batch: int, data, channels_last: bool,
                       passes: int = 3) -> float:
    """Validation throughput in operations per second (forward only), as the trainer
    validates: evaluation mode, inference mode, the trial's batch, the run's layout; the best
    of ``passes`` passes over the validation set after one to warm up."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    module = build_module(graph, seed=0).to(memory_format=fmt)
    batches = list(data.batches("val", 0, 1, batch, 0, 0, torch.device("cpu")))
    count_correct(module, batches[:2], contextlib.nullcontext(), fmt)
    best = 0.0
    for _ in range(passes):
        t0 = time.perf_counter()
        _, seen = count_correct(module, batches, contextlib.nullcontext(), fmt)
        best = max(best, seen / (time.perf_counter() - t0))
    return best * count(graph).forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--replicas", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "automlperf.cli", "run", "--duration", f"{args.duration}s",
               "--replicas", str(args.replicas), "--run-dir", str(run_dir)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        result = json.loads((run_dir / "result.json").read_text())
        store = open_store(run_dir=run_dir)
        trials = {t.id: t for t in store.trials(1)}
        grace = float((result.get("charging") or {}).get("grace_s") or 0.0)
        counted = counted_epochs(store.epochs(1), store.segments(1), grace)
        ops_by_trial: dict[int, int] = defaultdict(int)
        val_ops: dict[int, int] = defaultdict(int)
        in_epochs = 0.0
        for _, e in counted:
            ops_by_trial[e.trial_id] += e.ops
            trained = epoch_ops(count(Graph.from_json(trials[e.trial_id].graph_json),
                                      batch_size=e.batch_size), e.train_images, e.steps, 0)
            val_ops[e.trial_id] += e.ops - trained
            in_epochs += e.ended_at - e.started_at
        # The pure steps run as a CPU rank runs them: its threads and host allocator.
        torch.set_num_threads(max(1, cores_available() // args.replicas))
        keep_host_memory()
        config = Config.load(run_dir / "config.toml")
        data = builtin(image_size=config.data.image_size)
        pure_time = flattering = 0.0
        train_time = val_time = 0.0
        for trial_id, ops in ops_by_trial.items():
            t = trials[trial_id]
            layout = config.train.channels_last
            graph = Graph.from_json(t.graph_json)
            fmt = channels_last_default("cpu") if layout is None else layout
            batch = t.hparams["batch_size"]
            rate = pure_ops_per_s(graph, batch, data, fmt)
            val_rate = pure_val_ops_per_s(graph, batch, data, fmt)
            train_time += (ops - val_ops[trial_id]) / rate
            val_time += val_ops[trial_id] / val_rate
            flattering += ops / rate
        # Replicas train side by side: the run's pure time is shared among them.
        pure_time = (train_time + val_time) / args.replicas
        flattering /= args.replicas
        elapsed = result["elapsed_s"]
        out = {"bench": "pipeline", "duration_s": elapsed, "replicas": args.replicas,
               "run_ops_per_s": result["score"], "pure_ops_per_s": result["total_ops"] / pure_time,
               "efficiency": result["score"] * pure_time / result["total_ops"],
               "efficiency_val_at_training_rate": result["score"] * flattering / result["total_ops"],
               "pure_val_share": val_time / (train_time + val_time),
               "pure_train_ops_per_s": sum(o - val_ops[t] for t, o in ops_by_trial.items()) / train_time,
               "pure_val_ops_per_s": sum(val_ops.values()) / val_time if val_time else None,
               "time_breakdown_shares": result["time_breakdown"]["shares"],
               "fraction_of_ceiling": result.get("fraction_of_ceiling"),
               "best_accuracy": result.get("best_accuracy"),
               "pure_share_of_elapsed": pure_time / elapsed,
               "in_epoch_share": in_epochs / args.replicas / elapsed,
               "trials": len(ops_by_trial), "epochs": len(counted), "target": 0.97}
        print(f"run {result['score']:.3e} OPS over {elapsed:.0f} s; the same trials in pure "
              f"training steps {out['pure_ops_per_s']:.3e} OPS; efficiency {out['efficiency']:.3f}"
              f" (validation charged at the training rate: {out['efficiency_val_at_training_rate']:.3f})"
              f"; replicas inside epochs {100 * out['in_epoch_share']:.1f} % of the run; pure "
              f"training {out['pure_train_ops_per_s']:.3e} OPS, pure validation "
              f"{out['pure_val_ops_per_s'] or 0:.3e} OPS")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
