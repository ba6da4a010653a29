"""Ranking several runs side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from automlperf.measure.result import read_result
from automlperf.store.rundir import RunDir, RunDirError


def row(run_dir: Path) -> dict[str, Any]:
    rd = RunDir(Path(run_dir))
    if not rd.result.exists():
        raise FileNotFoundError(f"{rd.result} is missing: finish the run, or `automlperf run "
                                f"--resume --run-dir {run_dir}`")
    result = read_result(rd.result)
    system = json.loads(rd.system.read_text()) if rd.system.exists() else {}
    # The accelerators every node described (result.json, which `check` recomputes from the
    # store), else those of the primary's host (a result from before nodes described theirs).
    names = (result.get("system") or {}).get("accelerators") or \
        sorted({a["name"] for a in system.get("accelerators", [])})
    # Any of the run's own records saying so marks it: an edited result.json alone does not
    # make a simulated run pass for a measured one (`check` names the edit).
    simulated = (bool(result.get("simulated")) or bool(system.get("simulated"))
                 or any(v.get("rule") == "simulated" for v in result.get("violations") or []))
    return {
        "run": str(run_dir), "name": result.get("name"),
        "system": f"{system.get('host', '?')} ({system.get('cpu', {}).get('model', '?')})",
        "accelerators": ", ".join(names) or "CPU", "devices": result.get("devices"),
        "nodes": result.get("nodes"), "dataset": result.get("dataset"),
        "score": result["score"], "regulated_score": result.get("regulated_score"),
        "ops_per_device": result.get("ops_per_s_per_device"),
        "fraction_of_peak": result.get("fraction_of_peak"),
        "fraction_of_ceiling": result.get("fraction_of_ceiling"),
        "best_accuracy": result.get("best_accuracy"), "elapsed_s": result.get("elapsed_s"),
        "energy_j": result.get("energy_j"), "mean_power_w": result.get("mean_power_w"),
        "ops_per_watt": result.get("ops_per_watt"),
        "official": result.get("official"), "valid": result.get("valid"),
        "simulated": simulated, "simulation": result.get("simulation"),
        "ruleset": result.get("ruleset"), "started_at": result.get("started_at"),
        "duration_s": result.get("duration_s"),
    }


def ranking(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """Runs ordered by score; valid results first, as an official list would rank them."""
    try:
        rows = [row(d) for d in run_dirs]
    except (OSError, ValueError) as exc:  # a missing or damaged result.json
        raise RunDirError(str(exc)) from None
    rows.sort(key=lambda r: (not r["valid"], -r["score"]))
    for rank, r in enumerate(rows, start=1):
        r["rank"] = rank
    return rows
