"""Energy from cumulative counters: NVML's total-energy counter per GPU (millijoules since
the driver loaded) and the CPU packages' RAPL counters (microjoules, wrapping at
``max_energy_range_uj``). Differencing counters gives exact joules between two samples,
where multiplying 30-second power snapshots by the interval would miss every spike.

``RaplReader`` reads the counters (``/sys/class/powercap``, often readable by root only);
``energy_summary`` differences the samples a run stored. Neither needs torch or NVML.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")
# Package domains only: their subzones (intel-rapl:0:0 core, :1 uncore, dram) are parts of
# the package total or outside it, and summing them would count energy twice.
_PACKAGE = re.compile(r"^intel-rapl:\d+$")


def counter_delta(before: float, after: float, wrap_at: float | None) -> float:
    """The increase of a counter that starts again from 0 after ``wrap_at`` (integers, or
    the float64 that hold them exactly)."""
    if after >= before:
        return after - before
    if not wrap_at:
        return 0  # a reset (driver reload) rather than a wrap: nothing can be said
    return wrap_at - before + after


class RaplReader:
    """The CPU package energy counters under ``root``; empty (with ``error`` saying why)
    where there are none or they are not readable."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.domains: dict[str, tuple[Path, int]] = {}
        self.error: str | None = None
        candidates = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE.match(p.name))
        if not candidates:
            self.error = f"no RAPL package domains under {root}"
        for path in candidates:
            try:
                name = (path / "name").read_text().strip()
                wrap = int((path / "max_energy_range_uj").read_text())
                int((path / "energy_uj").read_text())
            except PermissionError:
                self.error = (f"{path}/energy_uj is readable by root only: CPU energy is "
                              "not recorded")
                continue
            except (OSError, ValueError):
                continue
            self.domains[f"{path.name}/{name}"] = (path / "energy_uj", wrap)

    def read(self) -> dict[str, list[int]]:
        """{domain: [energy_uj, max_energy_range_uj]} now."""
        out = {}
        for name, (path, wrap) in self.domains.items():
            try:
                out[name] = [int(path.read_text()), wrap]
            except (OSError, ValueError):
                continue
        return out


def _segment_of(t: float, segments: Sequence[Any]) -> int | None:
    for s in segments:
        if s.started_at <= t <= s.end:
            return int(s.index)
    return None


def energy_summary(samples: Iterable[dict[str, Any]],
                   segments: Sequence[Any]) -> dict[str, Any] | None:
    """Joules used by the GPUs and CPU packages between consecutive samples of each node
    within the same session, and the mean power over the seconds covered; None when no
    counter was sampled twice."""
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_node[s.get("node", "")].append(s)
    gpu_j = cpu_j = 0.0
    covered: list[float] = []  # seconds with counters, per node that had any
    for rows in by_node.values():
        seconds = 0.0
        rows.sort(key=lambda s: s["t"])
        for a, b in zip(rows, rows[1:]):
            seg = _segment_of(a["t"], segments)
            if seg is None or seg != _segment_of(b["t"], segments):
                continue
            used = False
            before = {g.get("uuid"): g for g in a.get("gpus", [])}
            for g in b.get("gpus", []):
                prev = before.get(g.get("uuid"))
                if prev and "energy_mj" in prev and "energy_mj" in g:
                    gpu_j += counter_delta(prev["energy_mj"], g["energy_mj"], None) / 1e3
                    used = True
            before_cpu = a.get("cpu_energy_uj", {})
            for domain, (after, wrap) in b.get("cpu_energy_uj", {}).items():
                if domain in before_cpu:
                    cpu_j += counter_delta(before_cpu[domain][0], after, wrap) / 1e6
                    used = True
            if used:
                seconds += b["t"] - a["t"]
        if seconds:
            covered.append(seconds)
    if not covered:
        return None
    total = gpu_j + cpu_j
    # Nodes are sampled side by side, so the system's mean power is the energy of all of
    # them over the time one of them covered.
    seconds = sum(covered) / len(covered)
    return {"energy_j": total, "gpu_energy_j": gpu_j, "cpu_energy_j": cpu_j,
            "energy_window_s": seconds, "mean_power_w": total / seconds if seconds else None}
