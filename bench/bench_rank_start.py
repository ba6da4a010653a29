"""What a training process pays before its first trial's first step: with torch's SGD, the
trials' (train/optim.py, which never imports torch._dynamo), and the trials' with the module's
memory given by ``Module.to_empty`` (which imports sympy; train/builder.py gives it without):
fresh interpreters that import torch, build the small seed and its optimizer, and take one
step, the three alternated, each timed by its own CPU (user + system, getrusage) and wall clock.

Run: python bench/bench_rank_start.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import resource, sys, time
t0 = time.perf_counter()
import torch
from automlperf.graph import seeds
from automlperf.train import builder
from automlperf.train.builder import build_module
from automlperf.train.optim import trial_optimizer
if sys.argv[1] == "to_empty":
    builder._allocate = lambda module, device: module.to_empty(device=device)
graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=3)
module = build_module(graph, seed=0)
if sys.argv[1] == "torch":
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, nesterov=True)
else:
    opt = trial_optimizer(module, 0.1, 5e-4, 0.9, True)
loss = torch.nn.functional.cross_entropy(module(torch.randn(8, 3, 8, 8)), torch.zeros(8, dtype=torch.long))
opt.zero_grad(set_to_none=True)
loss.backward()
opt.step()
r = resource.getrusage(resource.RUSAGE_SELF)
print(r.ru_utime + r.ru_stime, time.perf_counter() - t0, "torch._dynamo" in sys.modules,
      "sympy" in sys.modules)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, float, bool, bool]]] = {
        "torch": [], "to_empty": [], "trials": []}
    for _ in range(args.repeats):
        for kind in runs:  # alternated, so that a change in the machine's load hits both
            out = subprocess.run([sys.executable, "-c", CHILD, kind], capture_output=True,
                                 text=True, check=True).stdout.split()
            runs[kind].append((float(out[0]), float(out[1]), out[2] == "True", out[3] == "True"))
    result = {}
    print("| optimizer, memory | CPU-s to the first step (median) | wall s (median) | "
          "imports torch._dynamo | imports sympy |")
    print("|---|---|---|---|---|")
    for kind, rows in runs.items():
        cpu = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        result[kind] = {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                        "dynamo": all(r[2] for r in rows), "sympy": all(r[3] for r in rows)}
        print(f"| {kind} | {cpu:.2f} | {wall:.2f} | {rows[0][2]} | {rows[0][3]} |")
    result["cpu_saved_s"] = round(result["torch"]["cpu_s"] - result["trials"]["cpu_s"], 3)
    result["to_empty_cpu_s"] = round(result["to_empty"]["cpu_s"] - result["trials"]["cpu_s"], 3)
    print(json.dumps({"bench": "rank_start", "repeats": args.repeats, **result}))


if __name__ == "__main__":
    main()
