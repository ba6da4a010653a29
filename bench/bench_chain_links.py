"""A chain of three jobs on the local SLURM cluster, each stopped by its own time limit's
signal, with the data staged on the nodes: what each job reserves besides its run (before:
the signal's lead a share of the whole run; now: what writing the result takes, measured),
and the staging done once (each job's copied bytes, from the nodes' staging records).

The local cluster (automlperf/testing/slurm.py) has a partition `short` of 5-minute jobs:
`automlperf slurm --chain --partition short` with 30 s of start-up and 30 s of staging
allowance plans a minute of run per job (9 jobs for a run of 420 s and its 2 s of grace:
eight and a spare); each job runs from its clock to its own limit's signal, two minutes before
its end, which is more than a minute where the start-up is quick (about 165 s here), so the
run takes three jobs, and the third, which ends it, cancels the rest. Simulated accelerators on an ImageNet-layout
folder of 4,000 files; this machine's 2-core AMD EPYC, no GPU. The lead a chain of longer
jobs is given at scale is computed by the planner (runner/chain.py) from the same rules.

    python bench/bench_chain_links.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

# Each job runs about 165 s of the run here (its clock from a start-up of seconds to its
# signal): a run of 420 s takes three.
DURATION_S = 420


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from helpers import sim_config
    from trees import make_tree

    from automlperf.runner.chain import plan_chain
    from automlperf.runner.joblimits import link_lead, margins, measured_finish
    from automlperf.testing.slurm import start_slurm, stop_slurm

    found: dict = {"links": []}
    with tempfile.TemporaryDirectory(prefix="amp-chain-", dir="/tmp") as tmp:
        work = Path(tmp)
        data = make_tree(work / "imagenet", per_class=(3, 1))
        env = start_slurm(work / "cluster", 2, "ampchain", memory_mb=1000)
        try:
            (work / "sim.toml").write_text(sim_config(
                sustained_ops=2e14, time_compression=10.0, stop_grace_s=10, deadline_grace_s=2,
                image_folders=True))
            run_dir, local = work / "run", work / "local"
            local.mkdir()
            done = subprocess.run([sys.executable, "-m", "automlperf.cli", "slurm", "--nodes", "2",
                                   "--duration", f"{DURATION_S}s", "--config", str(work / "sim.toml"),
                                   "--data-dir", str(data), "--stage-to", str(local),
                                   "--stage-time", "30s", "--startup-time", "30s", "--chain",
                                   "--partition", "short", "--run-dir", str(run_dir), "--submit"],
                                  env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
            found["plan"] = next(x for x in done.stdout.splitlines() if x.startswith("a chain"))
            jobs = re.search(r"submitted jobs ([\d ]+) \(", done.stdout).group(1).split()
            for job in jobs:
                state = _wait(job, env)
                out = run_dir / "logs" / f"slurm-{job}.out"
                text = out.read_text() if out.exists() else ""
                # A node's current record, or (the run over, its copy removed) the record
                # kept of it, the newest.
                records: dict = {}
                for path in sorted((run_dir / "staging").glob("*.json"),
                                   key=lambda p: json.loads(p.read_text()).get("at", 0)):
                    record = json.loads(path.read_text())
                    records[record["node"]] = record
                staged = re.search(r"dataset staged on the nodes in (\d+) ms", text)
                before = re.search(r"start-up before the clock: ([\d.]+) s", text)
                status = re.search(r"automlperf primary finished with status (\d+)", text)
                found["links"].append({
                    "job": job, "state": state,
                    "primary_status": int(status.group(1)) if status else None,
                    "staging_ms": int(staged.group(1)) if staged else None,
                    "before_clock_s": float(before.group(1)) if before else None,
                    "copied_bytes": {n: r["copied_bytes"] for n, r in records.items()},
                    "nothing_left": "nothing left to run" in text})
                print(json.dumps(found["links"][-1]), flush=True)
            result = json.loads((run_dir / "result.json").read_text())
            found["segments"] = [round(s["ended_at"] - s["started_at"], 1)
                                 for s in result["segments"]]
            found["elapsed_s"] = result["elapsed_s"]
            found["measured_finish_s"] = measured_finish(run_dir)
            found["copies_left"] = sorted(p.name for p in local.iterdir())
            verified = subprocess.run([sys.executable, "-m", "automlperf.cli", "check",
                                       str(run_dir)], env=env, capture_output=True, text=True)
            found["verified"] = verified.returncode == 0 and "verified" in verified.stdout
        finally:
            stop_slurm(env)
    need = DURATION_S + 2
    found["reserved_here"] = {
        "before": 60 + margins(need)[1] + 60, "after": 60 + link_lead(None) + 60,
        "after_measured": 60 + link_lead(found["measured_finish_s"]) + 60}
    # The docs' chain: 24 h and 6 h of grace in 8-hour jobs, 25 min of start-up and staging.
    whole, measured = 30 * 3600, found["measured_finish_s"]
    at_scale = {"before": plan_chain(whole, 8 * 3600, 1500, margins(whole)[1]),
                "after": plan_chain(whole, 8 * 3600, 1500, link_lead(None)),
                "after_100s": plan_chain(whole, 8 * 3600, 1500, link_lead(100.0)),
                "after_this_run": plan_chain(whole, 8 * 3600, 1500, link_lead(measured))}
    found["at_scale"] = {k: {"reserved_s": p.reserved_s, "run_per_link_s": p.run_per_link_s,
                             "links": p.links, "lead_s": p.lead_s} for k, p in at_scale.items()}
    print(json.dumps({k: v for k, v in found.items() if k != "links"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")


def _wait(job: str, env: dict[str, str]) -> str:
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                         text=True).stdout.strip():
        time.sleep(1)
    shown = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=env,
                           capture_output=True, text=True).stdout
    found = re.search(r"JobState=(\S+)", shown)
    return found.group(1) if found else "gone"


if __name__ == "__main__":
    main()
