"""The report's charts, drawn with matplotlib as inline SVG (no network needed to view)."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from automlperf.measure.units import ops_unit  # noqa: E402

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22"]
plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                     "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
                     "font.family": "sans-serif"})


def _svg(fig: Any, title: str) -> str:
    buf = io.StringIO()
    # No metadata block: it only carries a date and RDF namespaces.
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return svg.replace("<svg ", f'<svg role="img" aria-label="{title}" class="chart" ', 1)


def _time_label(hours: bool) -> str:
    return "run time (h)" if hours else "run time (min)"


def score_chart(curve: list[dict[str, float]], marks: list[dict[str, Any]]) -> str:
    """Cumulative OPS and regulated score at every epoch end; the official 0.1 h marks."""
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    long_run = bool(curve) and curve[-1]["t"] > 2 * 3600
    tx = 3600.0 if long_run else 60.0
    values = [p["ops_per_s"] for p in curve] + [p["regulated"] or 0 for p in curve]
    scale, unit = ops_unit(values)
    if curve:
        t = [p["t"] / tx for p in curve]
        ax.step(t, [p["ops_per_s"] / scale for p in curve], where="post", color=PALETTE[0],
                label="score (OPS)")
        if any(p["regulated"] is not None for p in curve):
            ax.step(t, [(p["regulated"] or 0) / scale for p in curve], where="post",
                    color=PALETTE[1], label="regulated score")
    for m in marks:
        ax.plot(m["hours"] * 3600 / tx, m["ops_per_s"] / scale, "o", color=PALETTE[0], ms=4)
        if m["regulated"] is not None:
            ax.plot(m["hours"] * 3600 / tx, m["regulated"] / scale, "o", color=PALETTE[1], ms=4)
    ax.set_xlabel(_time_label(long_run))
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    if curve:
        ax.legend(loc="upper left", frameon=False)
    return _svg(fig, "score and regulated score over time")


def error_chart(curve: list[dict[str, float]]) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    long_run = bool(curve) and curve[-1]["t"] > 2 * 3600
    tx = 3600.0 if long_run else 60.0
    pts = [p for p in curve if p.get("best_accuracy") is not None]
    if pts:
        ax.step([p["t"] / tx for p in pts], [100 * (1 - p["best_accuracy"]) for p in pts],
                where="post", color=PALETTE[2])
    ax.axhline(30, color="#999", lw=0.8, ls="--")
    ax.text(0.99, 30, "30 % maximum", transform=ax.get_yaxis_transform(), ha="right",
            va="bottom", color="#777", fontsize=8)
    ax.set_xlabel(_time_label(long_run))
    ax.set_ylabel("best error (%)")
    ax.set_ylim(0, max([100 * (1 - p["best_accuracy"]) for p in pts] + [35]) * 1.05)
    return _svg(fig, "best error over time")


def trials_chart(series: list[dict[str, Any]], best_lineage: list[Any] | None = None) -> str:
    """Every trial's validation accuracy at each epoch end, coloured by replica. A thin grey
    link joins each child's first epoch to its parent's last (lineage); the path from the
    seed to the best model is drawn bold."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    long_run = any(p[0] > 2 * 3600 for s in series for p in s["points"])
    tx = 3600.0 if long_run else 60.0
    by_id = {s["id"]: s for s in series if "id" in s and s["points"]}
    on_path = set(best_lineage or [])
    for s in series:
        parent = by_id.get(s.get("parent"))
        if parent is None or not s["points"]:
            continue
        (x0, y0), (x1, y1) = parent["points"][-1], s["points"][0]
        bold = s["id"] in on_path and parent["id"] in on_path
        ax.plot([x0 / tx, x1 / tx], [100 * y0, 100 * y1], ls="-" if bold else ":",
                color="#222" if bold else "#999", lw=1.6 if bold else 0.8, zorder=1)
    seen: set[int] = set()
    for s in series:
        colour = PALETTE[s["replica"] % len(PALETTE)]
        label = f"replica {s['replica']}" if s["replica"] not in seen else None
        seen.add(s["replica"])
        xs = [p[0] / tx for p in s["points"]]
        ys = [100 * p[1] for p in s["points"]]
        bold = s.get("id") in on_path
        ax.plot(xs, ys, "-o", color=colour, ms=3.5 if bold else 2.5, lw=2 if bold else 1,
                alpha=1.0 if bold else 0.7, label=label, zorder=3 if bold else 2,
                markeredgecolor="#222" if bold else colour, markeredgewidth=0.6)
    if on_path:
        ax.plot([], [], "-", color="#222", lw=1.6, label="lineage of the best model")
        ax.plot([], [], ":", color="#999", lw=0.8, label="parent → child")
    ax.set_xlabel(_time_label(long_run))
    ax.set_ylabel("validation accuracy (%)")
    accs = [100 * p[1] for s in series for p in s["points"]]
    # From just below the lowest point: a run that climbs from 90 % to 99 % shows its climb.
    ax.set_ylim(max(0.0, min(accs) - 2) if accs else 0.0, 100)
    if seen:
        ax.legend(loc="lower right", frameon=False, ncol=min(3, len(seen) + 2), fontsize=7)
    return _svg(fig, "trial accuracy over time, with lineage")


def resource_chart(samples: list[dict[str, Any]], start: float) -> tuple[str, str]:
    """GPU utilisation and memory over time; CPU and host memory when there are no GPUs.
    Returns (svg, what it shows)."""
    gpu = any(s.get("gpus") for s in samples)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(6.8, 2.6))
    by_key: dict[str, list[tuple[float, float, float]]] = {}
    for s in samples:
        if "t" not in s or "cpu_percent" not in s:
            continue
        t = (s["t"] - start) / 60.0
        if gpu:
            for g in s.get("gpus", []):
                if "util" in g:
                    key = f"{s.get('node', '')} gpu{g['index']}"
                    by_key.setdefault(key, []).append((t, g["util"], g["mem_used_gib"]))
        else:
            by_key.setdefault(s.get("node", "host"), []).append(
                (t, s["cpu_percent"], s["mem_used_gib"]))
    for i, (key, pts) in enumerate(sorted(by_key.items())):
        colour = PALETTE[i % len(PALETTE)]
        a1.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, lw=1, label=key)
        a2.plot([p[0] for p in pts], [p[2] for p in pts], color=colour, lw=1, label=key)
    if not by_key:
        for ax in (a1, a2):
            ax.text(0.5, 0.5, "no samples recorded", transform=ax.transAxes, ha="center",
                    va="center", color="#777")
    what = "GPU" if gpu else "CPU"
    a1.set_ylabel(f"{what} utilisation (%)")
    a1.set_ylim(0, 105)
    a2.set_ylabel("GPU memory (GiB)" if gpu else "host memory used (GiB)")
    a2.set_ylim(bottom=0)
    for ax in (a1, a2):
        ax.set_xlabel("wall time since start (min)")
    if by_key and len(by_key) <= 8:
        a2.legend(loc="lower right", frameon=False, fontsize=7)
    fig.tight_layout()
    shows = ("utilisation and memory of every GPU (NVML)" if gpu else
             "no GPU was sampled: CPU utilisation and host memory (psutil)")
    return _svg(fig, f"{what} utilisation and memory over time"), shows


def scaling_chart(rows: list[dict[str, Any]]) -> str:
    """Weak scaling (the AIPerf paper's Fig. 6): the score against the devices, beside the
    ideal of the smallest run's OPS per device on every device, and the efficiency."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.0, 3.0))
    devices = [r["devices"] for r in rows]
    scale, unit = ops_unit([r["score"] for r in rows] + [r["ideal_score"] for r in rows])
    a1.plot(devices, [r["ideal_score"] / scale for r in rows], "--", color="#999", lw=1,
            label="ideal (smallest run per device)")
    a1.plot(devices, [r["score"] / scale for r in rows], "-o", color=PALETTE[0], ms=4,
            label="score")
    a1.set_ylabel(f"score ({unit})")
    a1.set_ylim(bottom=0)
    a1.legend(loc="upper left", frameon=False, fontsize=7)
    a2.axhline(1.0, color="#999", lw=0.8, ls="--")
    a2.plot(devices, [r["efficiency"] for r in rows], "-o", color=PALETTE[1], ms=4)
    for r in rows:
        a2.annotate(f"{r['efficiency']:.3f}", (r["devices"], r["efficiency"]), fontsize=7,
                    textcoords="offset points", xytext=(0, 6), ha="center")
    a2.set_ylabel("weak-scaling efficiency")
    a2.set_ylim(0, max(1.1, max(r["efficiency"] for r in rows) * 1.1))
    for ax in (a1, a2):
        if devices[-1] / devices[0] >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(devices, [str(d) for d in devices])
        ax.set_xlabel("devices")
    fig.tight_layout()
    return _svg(fig, "weak scaling: score and efficiency against the devices")
