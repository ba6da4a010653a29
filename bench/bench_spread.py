"""The score's own spread: the same run repeated on the same idle machine.

Two shapes, each repeated (5 by default), one run at a time through the real command:
- *default*: `automlperf run` as `make run` starts it (the built-in task, 3 minutes);
- *official*: ResNet-50 at 224 with the official preset's rules on an ImageNet-layout
  folder of textured 500x375 JPEGs of about ImageNet's weight (`bench/textured_folder.py`),
  an unofficial run only because the folder is not ImageNet-1k.

For each run: the score, the regulated score, the best accuracy, the epochs, and the
machine's 1-minute load average just before the run and as it ends (a run is only
comparable with another taken at the same load). Then each figure's mean, standard
deviation and coefficient of variation, and the gap two single results must exceed to
differ (twice the standard deviation of a difference, 2 * sqrt(2) * sd).

Run: python bench/bench_spread.py [--repeats 5] [--shapes default,official]
     [--official-duration 150s] [--out DIR]
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

FIGURES = ("score", "regulated_score", "best_accuracy")
HERE = Path(__file__).resolve().parent


def official_folder(root: Path) -> Path:
    """10 classes of 32 training and 8 validation files, made once and kept."""
    if not (root / "val").is_dir():
        subprocess.run([sys.executable, str(HERE / "textured_folder.py"), str(root),
                        "--classes", "10", "--train", "32", "--val", "8",
                        "--size", "500x375"], check=True)
    return root


def command(shape: str, run_dir: Path, data: Path | None, duration: str) -> list[str]:
    base = [sys.executable, "-m", "automlperf.cli", "run", "--run-dir", str(run_dir)]
    if shape == "default":
        return base
    return base + ["--dataset", "imagenet", "--data-dir", str(data), "--unofficial",
                   "--duration", duration]


def one_run(shape: str, run_dir: Path, data: Path | None, duration: str) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    before = os.getloadavg()[0]
    start = time.monotonic()
    done = subprocess.run(command(shape, run_dir, data, duration), capture_output=True,
                          text=True, env={**os.environ, "NO_COLOR": "1"})
    wall = time.monotonic() - start
    after = os.getloadavg()[0]
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise SystemExit(f"{shape} run in {run_dir} exited {done.returncode}: {tail}")
    result = json.loads((run_dir / "result.json").read_text())
    return {"shape": shape, "run_dir": str(run_dir), "wall_s": round(wall, 1),
            "load_before": before, "load_after": after, "epochs": result.get("epochs"),
            "trials": result.get("trials"),
            **{name: result.get(name) for name in FIGURES}}


def summary(runs: list[dict]) -> dict:
    out = {}
    for name in FIGURES:
        values = [r[name] for r in runs if r[name] is not None]
        if len(values) < 2:
            continue
        mean, sd = statistics.mean(values), statistics.stdev(values)
        out[name] = {"mean": mean, "sd": sd, "cv": sd / mean if mean else None,
                     "min": min(values), "max": max(values),
                     "differ_by": 2 * 2 ** 0.5 * sd / mean if mean else None}
    return out


def show(value: float, name: str) -> str:
    return f"{value * 100:.2f} %" if name == "best_accuracy" else f"{value / 1e9:.1f} GOPS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", default="default,official")
    parser.add_argument("--official-duration", default="150s")
    parser.add_argument("--out", type=Path, default=Path("/tmp/automlperf-spread"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = args.shapes.split(",")
    data = official_folder(args.out / "folder") if "official" in shapes else None
    runs: list[dict] = []
    for i in range(args.repeats):
        for shape in shapes:  # interleaved, so a drift of the machine touches both alike
            run = one_run(shape, args.out / f"{shape}-{i}", data, args.official_duration)
            runs.append(run)
            print(json.dumps(run), flush=True)
            (args.out / "runs.json").write_text(json.dumps(runs, indent=1))
    table = {shape: summary([r for r in runs if r["shape"] == shape]) for shape in shapes}
    (args.out / "summary.json").write_text(json.dumps(table, indent=1))
    print("\n| shape | figure | mean | sd | CV | min - max | two results differ beyond |")
    print("|---|---|---|---|---|---|---|")
    for shape, figures in table.items():
        for name, s in figures.items():
            print(f"| {shape} | {name} | {show(s['mean'], name)} | {show(s['sd'], name)} | "
                  f"{s['cv'] * 100:.1f} % | {show(s['min'], name)} - {show(s['max'], name)} "
                  f"| {s['differ_by'] * 100:.1f} % |")
    for shape in shapes:
        loads = [(r["load_before"], r["load_after"]) for r in runs if r["shape"] == shape]
        print(f"{shape}: load average before / as it ended: "
              + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in loads))


if __name__ == "__main__":
    main()
