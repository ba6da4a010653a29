"""The engine's efficiency against the node's measured ceiling, in the same run.

1. ``train``: the official shape (ResNet-50 at 224) trained by ``automlperf train`` on
   synthetic images, as a user runs it. The ceiling (``measure/ceiling.py``, the run's own
   measurement, with the same threads) is measured just before and just after the command;
   their mean is the denominator. Reported: OPS inside training steps (each epoch's training
   operations over its training time) and over the whole command (every operation of the
   command over its wall time, start-up and validation included), as fractions of the ceiling.
2. ``run``: the default ``automlperf run`` (the README's main job: 3 minutes on the built-in
   dataset), ``--runs`` times, each in a fresh run directory: its score over the ceiling its
   replica measured at the start (``fraction_of_ceiling`` in result.json), and where the time
   went.

Pipeline efficiency (run OPS over the same trials' pure-step OPS) is bench_pipeline.py.

Run: python bench/bench_efficiency.py [--skip-train] [--runs 3] [--epochs 2] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from automlperf.graph import seeds
from automlperf.hardware import cores_available
from automlperf.ops import count


def ceiling(threads: int, seconds: float = 3.0) -> float:
    """The node's ceiling as a run measures it, in a process of its own."""
    done = subprocess.run([sys.executable, "-m", "automlperf.measure.ceiling", "--devices", "cpu",
                           "--threads", str(threads), "--seconds", str(seconds)],
                          capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["ceiling_ops"])


def train_efficiency(epochs: int, batch: int, images: int) -> dict[str, float]:
    threads = cores_available()
    per_image = count(seeds.resnet50(1000, 224, 3))
    config = Path(tempfile.mkdtemp()) / "synthetic.toml"
    config.write_text(f"[data]\ndataset = \"synthetic\"\nsynthetic_images = {images}\n")
    before = ceiling(threads)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "automlperf.cli", "train", "--model", "resnet50",
                           "--config", str(config), "--epochs", str(epochs), "--batch-size",
                           str(batch), "--json"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = ceiling(threads)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    step_ops = step_seconds = 0.0
    for e in events:
        step_ops += e["ops"] - e["val_images"] * per_image.forward
        step_seconds += e["train_images"] / e["images_per_s"]
    total_ops = sum(e["ops"] for e in events)
    denominator = (before + after) / 2
    return {"ceiling_before": before, "ceiling_after": after, "wall_s": wall,
            "epochs": len(events), "images_per_s": statistics.mean(e["images_per_s"] for e in events),
            "step_ops_per_s": step_ops / step_seconds, "command_ops_per_s": total_ops / wall,
            "steps_fraction": step_ops / step_seconds / denominator,
            "command_fraction": total_ops / wall / denominator}


def run_efficiency(runs: int) -> list[dict[str, object]]:
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            subprocess.run([sys.executable, "-m", "automlperf.cli", "run", "--run-dir", str(run_dir)],
                           check=True, stdout=subprocess.DEVNULL)
            result = json.loads((run_dir / "result.json").read_text())
        shares = result["time_breakdown"]["shares"]
        out.append({"score": result["score"], "ceiling_ops": result["ceiling_ops"],
                    "fraction_of_ceiling": result["fraction_of_ceiling"],
                    "best_accuracy": result["best_accuracy"], "trials": result["trials"],
                    "epochs": result["epochs"], "shares": {k: round(v, 4) for k, v in shares.items()}})
        print(f"run: {result['score'] / 1e9:.1f} GOPS of {result['ceiling_ops'] / 1e9:.1f} = "
              f"{result['fraction_of_ceiling']:.3f}; best {result['best_accuracy']:.4f}; "
              f"{result['trials']} trials, {result['epochs']} epochs; time: "
              + ", ".join(f"{k.removesuffix('_s')} {v:.1%}" for k, v in shares.items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--images", type=int, default=192, help="Synthetic training images an epoch.")
    ap.add_argument("--runs", type=int, default=3, help="Default runs (0: none).")
    args = ap.parse_args()
    out: dict[str, object] = {"bench": "efficiency"}
    if not args.skip_train:
        t = train_efficiency(args.epochs, args.batch, args.images)
        out["train"] = t
        print(f"train resnet50 at 224, batch {args.batch}: {t['images_per_s']:.2f} img/s; "
              f"ceiling {t['ceiling_before'] / 1e9:.0f} / {t['ceiling_after'] / 1e9:.0f} GOPS; "
              f"steps {t['step_ops_per_s'] / 1e9:.1f} GOPS = {t['steps_fraction']:.3f}; whole "
              f"command ({t['wall_s']:.0f} s) {t['command_ops_per_s'] / 1e9:.1f} GOPS = "
              f"{t['command_fraction']:.3f}", flush=True)
    if args.runs:
        runs = run_efficiency(args.runs)
        out["runs"] = runs
        out["run_fraction_median"] = statistics.median(float(r["fraction_of_ceiling"]) for r in runs)  # type: ignore[arg-type]
        print(f"default run: median fraction of the ceiling {out['run_fraction_median']:.3f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
