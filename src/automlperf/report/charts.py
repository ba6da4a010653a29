"""The report's charts, drawn with matplotlib as inline SVG (no network needed to view)."""

from __future__ import annotations

import io
from typing import Any

import matplotlib
import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from automlperf.measure.samples import ResourceColumns
from automlperf.measure.units import ops_unit

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22"]
matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                            "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
                            "font.family": "sans-serif"})


def _figure(*grid: int, figsize: tuple[float, float]) -> tuple[Figure, Any]:
    """A figure of its own and its axes: pyplot's registry of open figures (and its import,
    a sixth of the charts' start-up) is for interactive sessions, not a report."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid)


def _svg(fig: Any, title: str) -> str:
    buf = io.StringIO()
    # No metadata block: it only carries a date and RDF namespaces.
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return svg.replace("<svg ", f'<svg role="img" aria-label="{title}" class="chart" ', 1)


def _time_label(hours: bool) -> str:
    return "run time (h)" if hours else "run time (min)"


def score_chart(curve: list[dict[str, float]], marks: list[dict[str, Any]]) -> str:
    """Cumulative OPS and regulated score at every epoch end; the official 0.1 h marks."""
    fig, ax = _figure(figsize=(6.4, 3.0))
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
    fig, ax = _figure(figsize=(6.4, 2.6))
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


# Beyond this many epochs the chart draws the trials as one raster layer (a picture inside
# the SVG): as vectors, each point costs ~200 bytes, and a long run has half a million.
MANY_POINTS = 2000


def trials_chart(series: list[dict[str, Any]], best_lineage: list[Any] | None = None) -> str:
    """Every trial's validation accuracy at each epoch end, coloured by replica. A thin grey
    link joins each child's first epoch to its parent's last (lineage); the path from the
    seed to the best model is drawn bold."""
    fig, ax = _figure(figsize=(6.4, 3.2))
    long_run = any(p[0] > 2 * 3600 for s in series for p in s["points"])
    tx = 3600.0 if long_run else 60.0
    by_id = {s["id"]: s for s in series if "id" in s and s["points"]}
    on_path = set(best_lineage or [])
    many = sum(len(s["points"]) for s in series) > MANY_POINTS
    links = []
    for s in series:
        parent = by_id.get(s.get("parent"))
        if parent is None or not s["points"]:
            continue
        (x0, y0), (x1, y1) = parent["points"][-1], s["points"][0]
        if s["id"] in on_path and parent["id"] in on_path:
            ax.plot([x0 / tx, x1 / tx], [100 * y0, 100 * y1], "-", color="#222", lw=1.6, zorder=1)
        else:
            links.append([(x0 / tx, 100 * y0), (x1 / tx, 100 * y1)])
    if links:
        ax.add_collection(LineCollection(links, colors="#999", linewidths=0.8, linestyles=":",
                                         zorder=1, rasterized=many))
    replicas = {s["replica"] for s in series}
    labelled = len(replicas) <= len(PALETTE)
    seen: set[int] = set()
    faint: dict[str, list[list[tuple[float, float]]]] = {}
    for s in series:
        colour = PALETTE[s["replica"] % len(PALETTE)]
        xs = [p[0] / tx for p in s["points"]]
        ys = [100 * p[1] for p in s["points"]]
        bold = s.get("id") in on_path
        if many and not bold:
            faint.setdefault(colour, []).append(list(zip(xs, ys)))
            continue
        label = f"replica {s['replica']}" if labelled and s["replica"] not in seen else None
        seen.add(s["replica"])
        ax.plot(xs, ys, "-o", color=colour, ms=3.5 if bold else 2.5, lw=2 if bold else 1,
                alpha=1.0 if bold else 0.7, label=label, zorder=3 if bold else 2,
                markeredgecolor="#222" if bold else colour, markeredgewidth=0.6)
    for colour, lines in faint.items():
        ax.add_collection(LineCollection(lines, colors=colour, linewidths=0.6, alpha=0.5,
                                         zorder=2, rasterized=True))
    if many and labelled:
        for replica in sorted(replicas - seen):
            ax.plot([], [], "-", color=PALETTE[replica % len(PALETTE)], label=f"replica {replica}")
            seen.add(replica)
    if on_path:
        ax.plot([], [], "-", color="#222", lw=1.6, label="lineage of the best model")
        ax.plot([], [], ":", color="#999", lw=0.8, label="parent → child")
    xs_all = [p[0] / tx for s in series for p in s["points"]]
    if xs_all:
        ax.set_xlim(min(xs_all), max(xs_all) * 1.01 or 1.0)
    ax.set_xlabel(_time_label(long_run))
    ax.set_ylabel("validation accuracy (%)")
    accs = [100 * p[1] for s in series for p in s["points"]]
    # From just below the lowest point: a run that climbs from 90 % to 99 % shows its climb.
    ax.set_ylim(max(0.0, min(accs) - 2) if accs else 0.0, 100)
    if seen or on_path:
        ax.legend(loc="lower right", frameon=False, ncol=min(3, len(seen) + 2), fontsize=7)
    return _svg(fig, "trial accuracy over time, with lineage")


# Beyond this many devices (or hosts) the resource chart shows their mean and range.
MANY_SERIES = 8
BINS = 300


def _binned(t: Any, values: Any) -> tuple[Any, Any, Any, Any]:
    """(time, mean, lowest, highest) of the values in each of ``BINS`` equal time bins
    (NumPy arrays: a long run has millions of device readings)."""
    t, values = np.asarray(t, dtype=float), np.asarray(values, dtype=float)
    t0 = t.min()
    width = (t.max() - t0) / BINS or 1.0
    k = np.clip(((t - t0) / width).astype(int), 0, BINS - 1)
    n = np.bincount(k, minlength=BINS)
    total = np.bincount(k, weights=values, minlength=BINS)
    low, high = np.full(BINS, np.inf), np.full(BINS, -np.inf)
    np.minimum.at(low, k, values)
    np.maximum.at(high, k, values)
    keep = n > 0
    return (t0 + (np.arange(BINS) + 0.5) * width)[keep], total[keep] / n[keep], low[keep], \
        high[keep]


def resource_chart(cols: ResourceColumns, start: float) -> tuple[str, str]:
    """GPU utilisation and memory over time; CPU and host memory when there are no GPUs.
    Returns (svg, what it shows)."""
    gpu = cols.gpu
    fig, (a1, a2) = _figure(1, 2, figsize=(6.8, 2.6))
    t = (cols.t - start) / 60.0
    drawn = False
    if cols.nodes * cols.per_node > MANY_SERIES:
        # Thousands of devices: their mean, and the range they span, over time.
        for ax, values in zip((a1, a2), (cols.util, cols.mem) if len(t) else ()):
            mid, mean, low, high = _binned(t, values)
            ax.fill_between(mid, low, high, color=PALETTE[0], alpha=0.2, lw=0,
                            label=f"range of {cols.nodes * cols.per_node}")
            ax.plot(mid, mean, color=PALETTE[0], lw=1, label="mean")
    else:
        order = sorted(range(len(cols.keys)), key=cols.keys.__getitem__)
        for i, k in enumerate(k for k in order if np.any(cols.key == k)):
            node, index = cols.keys[k]
            mine = cols.key == k
            colour = PALETTE[i % len(PALETTE)]
            label = f"{node} gpu{index}" if index >= 0 else node
            a1.plot(t[mine], cols.util[mine], color=colour, lw=1, label=label)
            a2.plot(t[mine], cols.mem[mine], color=colour, lw=1, label=label)
            drawn = True
    if not drawn and not cols.nodes:
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
    if a2.get_legend_handles_labels()[0]:
        a2.legend(loc="lower right", frameon=False, fontsize=7)
    fig.tight_layout()
    shows = ("utilisation and memory of every GPU (NVML)" if gpu else
             "no GPU was sampled: CPU utilisation and host memory (psutil)")
    return _svg(fig, f"{what} utilisation and memory over time"), shows


def scaling_chart(rows: list[dict[str, Any]]) -> str:
    """Weak scaling (the AIPerf paper's Fig. 6): the score against the devices, beside the
    ideal of the smallest run's OPS per device on every device, and the efficiency."""
    fig, (a1, a2) = _figure(1, 2, figsize=(8.0, 3.0))
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


# The search's charts show error on a log scale, better upwards: the climb from 70 % to 5 %
# error and the gains from 5 % to 4 % are both visible.
ERROR_FLOOR = 0.01  # per cent: a perfect accuracy still has a place on the axis
ERROR_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)


def _error(accuracy: float) -> float:
    return max(100.0 * (1.0 - accuracy), ERROR_FLOOR)


def _error_axis(ax: Any, errors: list[float], label: str) -> None:
    if not errors:
        return
    low, high = min(errors) / 1.25, min(100.0, max(errors) * 1.25)
    ax.set_yscale("log")
    ax.set_ylim(high, low)  # inverted: better is up
    ticks = [t for t in ERROR_TICKS if low <= t <= high]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylabel(label)


def _steps_to(points: list[tuple[float, float]], end: float, tx: float) -> tuple[list[float],
                                                                                 list[float]]:
    """A best-so-far series as a step line of errors held to ``end``."""
    xs = [t / tx for t, _ in points] + [end / tx]
    ys = [_error(a) for _, a in points] + [_error(points[-1][1])]
    return xs, ys


def progress_chart(whole: list[tuple[float, float]],
                   per_replica: dict[int, list[tuple[float, float]]], end: float = 0.0) -> str:
    """The best validation accuracy reached so far (as error, log scale), by the whole run
    (bold) and by each replica on its own (thin; beyond a palette's worth of replicas, all in
    grey; with one replica, its line is the run's), held flat to ``end`` (seconds)."""
    fig, ax = _figure(figsize=(6.4, 3.0))
    end = max([t for t, _ in whole] + [1.0, end])
    long_run = end > 2 * 3600
    tx = 3600.0 if long_run else 60.0
    labelled = len(per_replica) <= len(PALETTE)
    grey = []
    for replica, points in per_replica.items() if len(per_replica) > 1 else ():
        if not points:
            continue
        xs, ys = _steps_to(points, end, tx)
        if labelled:
            ax.step(xs, ys, where="post", color=PALETTE[replica % len(PALETTE)], lw=1,
                    alpha=0.85, label=f"replica {replica}")
        else:
            # A step line as segments: two per improvement.
            grey.append([(x, y) for i in range(len(xs)) for x, y in
                         ((xs[i], ys[max(0, i - 1)]), (xs[i], ys[i]))])
    if grey:
        ax.add_collection(LineCollection(grey, colors="#999", linewidths=0.5, alpha=0.5,
                                         rasterized=len(grey) > 100))
        ax.plot([], [], color="#999", lw=0.8, label=f"each of {len(per_replica)} replicas")
    if whole:
        xs, ys = _steps_to(whole, end, tx)
        ax.step(xs, ys, where="post", color="#222", lw=2, label="whole run")
        _error_axis(ax, [_error(a) for pts in [whole, *per_replica.values()] for _, a in pts],
                    "best validation error (%, log)")
        ax.set_xlim(0, end / tx * 1.01)
        ax.legend(loc="lower right", frameon=False, fontsize=7, ncol=2 if labelled else 1)
    else:
        ax.text(0.5, 0.5, "no epoch completed", transform=ax.transAxes, ha="center",
                color="#777")
        ax.set_ylabel("best validation error (%, log)")
    ax.set_xlabel(_time_label(long_run))
    return _svg(fig, "best accuracy over time, whole run and per replica")


def _morph_code(morphs: list[dict[str, Any]]) -> str:
    """A child's morphs in a few letters, for a tick label."""
    code = {"deepen": lambda m: f"D{m.get('kernel', '')}", "widen": lambda m: "W",
            "skip": lambda m: "Sp" if m.get("projection") else "S"}
    return " ".join(code.get(m["op"], lambda m: "?")(m) for m in morphs) or "seed"


def lineage_chart(nodes: list[dict[str, Any]], siblings: list[list[tuple[int, float]]]) -> str:
    """The best model's line of descent: one column per generation, the accuracy each
    ancestor had at birth (inherited: its parent's best) and what it reached, linked by an
    arrow; grey branches to the other children of the ancestor before it. Error on a log
    scale, better upwards."""
    n = len(nodes)
    fig, ax = _figure(figsize=(6.4, 3.4))
    values = [_error(v) for d in nodes for v in (d["birth"], d["reached"]) if v is not None]
    branches = []
    for depth, others in enumerate(siblings, 1):
        src = nodes[depth - 1]["reached"]
        if src is None:
            continue
        for _, acc in others:
            branches.append([(depth - 1, _error(src)), (depth, _error(acc))])
            values.append(_error(acc))
    if branches:
        ax.add_collection(LineCollection(branches, colors="#bbb", linewidths=0.6, zorder=1))
        ax.plot([b[1][0] for b in branches], [b[1][1] for b in branches], "o", color="#bbb",
                ms=2.5, zorder=1, label="other children of the ancestor before")
    labels = n <= 12
    for d in nodes:
        x, reached, birth = d["depth"], d["reached"], d["birth"]
        if reached is None:
            continue
        if birth is not None:
            ax.annotate("", xy=(x, _error(reached)), xytext=(x, _error(birth)),
                        arrowprops={"arrowstyle": "-|>", "color": PALETTE[0], "lw": 1.4,
                                    "shrinkA": 0, "shrinkB": 0}, zorder=3)
            ax.plot(x, _error(birth), "_", color=PALETTE[0], ms=9, mew=1.4, zorder=3)
        ax.plot(x, _error(reached), "o", color=PALETTE[1] if x == n - 1 else PALETTE[0],
                ms=5, mfc="white" if birth is None else None, zorder=4)
    spine = [(d["depth"], _error(d["reached"])) for d in nodes if d["reached"] is not None]
    if len(spine) > 1:
        ax.plot([p[0] for p in spine], [p[1] for p in spine], "-", color=PALETTE[0], lw=0.6,
                alpha=0.5, zorder=2)
    ax.plot([], [], "-", color=PALETTE[0], marker=">", ms=4, lw=1.4,
            label="at birth (parent's best) → reached")
    _error_axis(ax, values, "validation error (%, log)")
    ax.set_xlim(-0.5, max(n, 1) - 0.5)
    step = 1 if labels else max(1, n // 16)
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [f"#{nodes[i]['id']}" + (f"\n{_morph_code(nodes[i]['morph_list'])}"
                                                  if labels else "") for i in ticks],
                  fontsize=7 if labels else 8)
    ax.set_xlabel("generation: trial and its morphs (D3: deepen k3, W: widen, S: skip, "
                  "Sp: skip with projection)" if labels else "generation (0: the first ancestor)",
                  fontsize=8)
    ax.legend(loc="lower right", frameon=False, fontsize=7)
    return _svg(fig, "lineage of the best model: accuracy at birth and reached")


def ranking_chart(points: list[tuple[float, float, int]]) -> str:
    """Each child the Gaussian process scored: the gain over its parent it predicted against
    the gain the child reached, in points of accuracy. Right of zero: ranked above the
    parent; above zero: did beat it."""
    fig, ax = _figure(figsize=(6.4, 3.0))
    if points:
        xs = np.array([100 * p[0] for p in points])
        ys = np.array([100 * p[1] for p in points])
        won = ys > 0
        many = len(points) > MANY_POINTS
        ax.scatter(xs[won], ys[won], s=9, color=PALETTE[2], label="beat its parent",
                   rasterized=many, zorder=3)
        ax.scatter(xs[~won], ys[~won], s=9, color=PALETTE[1], label="did not",
                   rasterized=many, zorder=3)
        ax.axhline(0, color="#666", lw=0.8)
        ax.axvline(0, color="#666", lw=0.8)
        # Outliers (a child that diverged) would squeeze the rest into a line.
        lo, hi = np.percentile(ys, [2, 98])
        pad = max(0.5, 0.1 * (hi - lo))
        ax.set_ylim(min(lo, 0) - pad, max(hi, 0) + pad)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=7)
    else:
        ax.text(0.5, 0.5, "no child with a Gaussian-process prediction", ha="center",
                transform=ax.transAxes, color="#777")
    ax.set_xlabel("predicted gain over the parent (points)")
    ax.set_ylabel("reached gain (points)")
    return _svg(fig, "predicted against reached gain of each child over its parent")
