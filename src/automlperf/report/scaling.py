"""Weak scaling across runs of different sizes, as the AIPerf paper's Fig. 6 draws it.

Each replica brings its own share of the workload, so a machine that scales perfectly keeps
its OPS per device as it grows: the weak-scaling efficiency of a run is its OPS per device
divided by that of the smallest run (fewest devices). Only like runs are compared: all
measured or all simulated (with the same modelled device), one ruleset, one dataset.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import jinja2

from automlperf import __version__
from automlperf.errors import UserError
from automlperf.measure.units import format_ops
from automlperf.report.compare import row
from automlperf.store.rundir import RunDirError, write_atomic


class ScalingError(UserError, ValueError):
    """Runs that cannot be compared for scaling; the message says which and why."""


def _names(rows: list[dict[str, Any]]) -> str:
    return ", ".join(r["run"] for r in rows)


def _one_kind(rows: list[dict[str, Any]]) -> None:
    """Refuse runs that do not measure the same thing."""
    simulated = [r for r in rows if r["simulated"]]
    if simulated and len(simulated) < len(rows):
        measured = [r for r in rows if not r["simulated"]]
        raise ScalingError(f"cannot compare the scaling of simulated runs ({_names(simulated)}) "
                           f"with measured ones ({_names(measured)}): give runs of one kind")
    for key, what, one in (("ruleset", "rulesets", "ruleset"), ("dataset", "datasets", "dataset"),
                           ("simulation", "simulated devices", "simulated device"),
                           ("accelerators", "accelerators", "kind of accelerator")):
        if len({repr(r.get(key)) for r in rows}) > 1:
            listed = "; ".join(f"{r['run']}: {r.get(key)}" for r in rows)
            raise ScalingError(f"the runs have different {what} ({listed}): give runs of one "
                               f"{one}")


def weak_scaling(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """One row per run, fewest devices first: devices, nodes, score, OPS per device and the
    weak-scaling efficiency against the smallest run."""
    if len(run_dirs) < 2:
        raise ScalingError("--scaling needs at least two runs of different sizes")
    try:
        rows = [row(d) for d in run_dirs]
    except (OSError, ValueError) as exc:  # a missing or damaged result.json
        raise RunDirError(str(exc)) from None
    _one_kind(rows)
    for r in rows:
        if not r["devices"] or not r["ops_per_device"]:
            raise ScalingError(f"{r['run']}: no device or no counted operation recorded; "
                               "finish the run (or `automlperf check` it) first")
    if len({r["devices"] for r in rows}) < 2:
        raise ScalingError(f"the runs all have {rows[0]['devices']} device(s) "
                           f"({_names(rows)}): give runs of different sizes")
    rows.sort(key=lambda r: (r["devices"], r["run"]))
    base = rows[0]
    for r in rows:
        r["relative_devices"] = r["devices"] / base["devices"]
        r["efficiency"] = r["ops_per_device"] / base["ops_per_device"]
        r["ideal_score"] = base["ops_per_device"] * r["devices"]
    return rows


_env = jinja2.Environment(loader=jinja2.PackageLoader("automlperf.report", "templates"),
                          autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                          lstrip_blocks=True)
_env.filters["ops"] = format_ops


def scaling(run_dirs: list[Path], page: Path) -> tuple[list[dict[str, Any]], Path]:
    """The weak-scaling rows of ``run_dirs`` and the page drawn from them at ``page``."""
    rows = weak_scaling(run_dirs)
    return rows, write_scaling_page(rows, page)


def write_scaling_page(rows: list[dict[str, Any]], path: Path) -> Path:
    """A self-contained HTML page: the table and the efficiency chart."""
    from automlperf.report import charts

    html = _env.get_template("scaling.html.j2").render(
        rows=rows, simulated=rows[0]["simulated"], simulation=rows[0].get("simulation"),
        chart=charts.scaling_chart(rows), version=__version__,
        generated=datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    write_atomic(Path(path), html)
    return Path(path)
