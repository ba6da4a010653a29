"""The submission bundle of a 10,000-trial run: its size, and how long `submit` and `check`
take on it.

The run is bench/large_run.py's (10,000 trials, ~500,000 epochs, 512 nodes sampled every
30 s: ~1 M resource samples; SQLite). It has no weights and no report, which a bundle needs:
the best trial's weights are written here as its architecture freshly initialised (as large
as trained weights, and as incompressible), and the report by `automlperf report`.

Measured, one each (wall clock, and CPU time of the command and its worker processes):
``automlperf submit RUN`` (it verifies the run first), the bundle's size with and without
the weights, each part's share of it (each group of files compressed alone, in the bundle's
order), and ``automlperf check BUNDLE`` (unpacking included), which must verify it.

Run: python bench/bench_bundle.py [--work DIR] [--trials 10000] [--epochs 500000]
     [--replicas 512]   (a run already in WORK/run is reused)
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def timed(*args: Any) -> dict[str, Any]:
    """Run the automlperf command line; its wall and CPU seconds (children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "automlperf.cli", *map(str, args)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} failed ({done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "stdout": done.stdout}


def prepare(run: Path, trials: int, epochs: int, replicas: int) -> dict[str, Any]:
    """The generated run, with the best trial's weights and the report a bundle needs."""
    import large_run

    made: dict[str, Any] = {}
    if not (run / "result.json").exists():
        clock = time.perf_counter()
        made = large_run.generate(run, trials, epochs, replicas, progress=True)
        made["generate_s"] = round(time.perf_counter() - clock, 1)
    from automlperf.graph import Graph
    from automlperf.train.builder import build_module
    from automlperf.train.trainer import save_weights

    best = json.loads((run / "result.json").read_text())["best_trial"]
    weights = run / "trials" / str(best) / "weights.safetensors"
    if not weights.exists():
        graph = Graph.read(run / "trials" / str(best) / "graph.json")
        save_weights(build_module(graph, seed=0), str(weights))
    if not (run / "report.html").exists():
        made["report"] = timed("report", run)
    made["weights_bytes"] = weights.stat().st_size
    return made


def shares(folder: Path) -> dict[str, int]:
    """Each group of the bundle's files compressed alone, in the archive's order (bytes)."""
    from automlperf.submission.bundle import MANIFEST, _order, files

    groups = {0: "top-level files", 1: "records (run, sessions, replicas, nodes, trials)",
              2: "graphs", 3: "trial logs and their epochs", 4: "samples", 5: "weights",
              6: "other"}
    out: dict[str, int] = {}
    names = sorted([MANIFEST, *files(folder)], key=_order)
    for key, label in groups.items():
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        size = 0
        for name in (n for n in names if _order(n)[0] == key):
            size += len(z.compress((folder / name).read_bytes()))
        out[label] = size + len(z.flush())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_bundle"))
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=500_000)
    ap.add_argument("--replicas", type=int, default=512)
    args = ap.parse_args()
    from automlperf.submission.bundle import pack

    args.work.mkdir(parents=True, exist_ok=True)
    run = args.work / "run"
    out: dict[str, Any] = {"prepare": prepare(run, args.trials, args.epochs, args.replicas)}
    archive, folder = args.work / "bundle.tar.gz", args.work / "bundle"
    archive.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    submitted = timed("submit", run, "--out", archive)
    out["submit"] = {k: v for k, v in submitted.items() if k != "stdout"}
    out["submit"]["said"] = " ".join(submitted["stdout"].split())
    out["bundle_bytes"] = archive.stat().st_size
    checked = timed("check", archive)
    out["check"] = {k: v for k, v in checked.items() if k != "stdout"}
    out["check"]["said"] = " ".join(checked["stdout"].split())[:300]
    # The same bundle as a folder, to weigh its parts and pack it without the weights.
    timed("submit", run, "--dir", "--out", folder)
    out["shares_bytes"] = shares(folder)
    for weights in folder.glob("trials/*/weights.safetensors"):
        weights.unlink()
    pack(folder, args.work / "no-weights.tar.gz")
    out["bundle_without_weights_bytes"] = (args.work / "no-weights.tar.gz").stat().st_size
    out["unpacked_bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
