"""Architecture descriptors and the edit distance between them (the Auto-Keras kernel's input).

A descriptor is the graph's *main chain* (its longest path, counted in convolutions, as a
sequence of (layer type, width)) plus its *skip connections* (branches that leave the chain
and rejoin it at an add, as (from position, length, type)). The distance is

    d(x, y) = layer edit distance of the chains + matched skip-connection distance

where substituting a layer costs |w1 - w2| / max(w1, w2) (1 across types) and an insertion or
deletion costs 1; skips are matched by the Hungarian method, each pair costing
(|f1 - f2| + |l1 - l2|) / (max(f1, f2) + max(l1, l2)) (1 across types), each unmatched skip 1.
All parts are metrics, so d is a metric.

Distances from one descriptor to many are vectorised row by row: a row of the edit-distance
table is a running minimum (``D[i][j] - j = cummin(E[k] - k)``), so one NumPy pass per row
serves every other descriptor at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from automlperf.graph.graph import INPUT, Graph

DENSE_TYPE = 100
POOL_TYPE = 200


@dataclass(frozen=True)
class Descriptor:
    types: np.ndarray    # int, layer type codes along the main chain (conv: kernel size)
    widths: np.ndarray   # float, output channels along the main chain
    skips: tuple[tuple[int, int, int], ...]  # (from position, length, 0 identity / 1 conv)

    def __len__(self) -> int:
        return len(self.types)


def describe(graph: Graph) -> Descriptor:
    """The main chain and skip connections of ``graph``."""
    weight = {INPUT: 0}
    back: dict[str, str] = {}
    for layer in graph.layers:
        # Longest path by convolutions; ties keep the first input (an add's main operand).
        src = max(layer.inputs, key=lambda s: (weight[s], -layer.inputs.index(s)))
        back[layer.name] = src
        weight[layer.name] = weight[src] + (layer.kind == "conv2d")
    chain = [graph.output.name]
    while back.get(chain[-1], INPUT) != INPUT:
        chain.append(back[chain[-1]])
    chain.reverse()
    position: dict[str, int] = {INPUT: 0}
    types, widths = [], []
    for name in chain:
        layer = graph[name]
        code = {"conv2d": layer.kernel, "dense": DENSE_TYPE, "maxpool": POOL_TYPE}.get(layer.kind)
        if code is not None:
            types.append(code)
            widths.append(graph.shapes[name][0])
        position[name] = len(types)
    skips = []
    on_chain = set(chain)
    for name in chain:
        layer = graph[name]
        if layer.kind != "add":
            continue
        for src in layer.inputs:
            if src == back[name]:
                continue
            convs = 0
            while src not in on_chain and src != INPUT:
                convs += graph[src].kind == "conv2d"
                src = graph[src].inputs[0]
            start = position[src]
            skips.append((start, position[name] - start, int(convs > 0)))
    return Descriptor(np.asarray(types, dtype=np.int64), np.asarray(widths, dtype=np.float64),
                      tuple(sorted(skips)))


def _prefix_min(x: np.ndarray, spare: np.ndarray) -> np.ndarray:
    """Running minimum down axis 0 in log2(n) vectorised steps (Hillis-Steele); NumPy's
    ``minimum.accumulate`` runs element by element and is several times slower here."""
    step, n = 1, x.shape[0]
    while step < n:
        np.minimum(x[step:], x[:-step], out=spare[step:])
        spare[:step] = x[:step]
        x, spare = spare, x
        step *= 2
    return x


def _edit_rows(types: np.ndarray, widths: np.ndarray, t_many: np.ndarray, w_many: np.ndarray,
               lengths: np.ndarray) -> np.ndarray:
    """Edit distances from one chain to many, laid out (position, model) so that every
    operation is a whole-array one. Row ``i`` of the table satisfies
    ``D[i][j] - j = min_{k<=j} (E[k] - k)`` with ``E`` the deletion/substitution minimum."""
    width, m = t_many.shape
    cols = np.arange(width + 1, dtype=np.float64)[:, None]
    prev = np.broadcast_to(cols, (width + 1, m)).copy()
    e, spare = np.empty_like(prev), np.empty_like(prev)
    subs: dict[tuple[int, float], np.ndarray] = {}
    for i in range(len(types)):
        key = (int(types[i]), float(widths[i]))
        sub = subs.get(key)
        if sub is None:  # a chain repeats few (type, width) pairs
            ratio = w_many / key[1]
            sub = subs[key] = np.where(t_many == key[0], 1.0 - np.minimum(ratio, 1.0 / ratio), 1.0)
        e[0] = i + 1
        np.minimum(prev[1:] + 1.0, prev[:-1] + sub, out=e[1:])
        e -= cols
        low = _prefix_min(e, spare)
        if low is spare:
            e, spare = spare, e
        np.add(e, cols, out=prev)
    return prev[lengths, np.arange(m)]


@dataclass(frozen=True)
class Packed:
    """Many descriptors padded into arrays, for :func:`distances`."""

    types_t: np.ndarray  # (L, M) int, -1 past each chain's end
    widths_t: np.ndarray  # (L, M) float
    lengths: np.ndarray  # (M,) int
    skips: tuple[tuple[tuple[int, int, int], ...], ...]
    skip_array: np.ndarray  # (M, Q, 3) float, padded
    skip_counts: np.ndarray  # (M,) int


def pack(descriptors: list[Descriptor]) -> Packed:
    m = len(descriptors)
    width = max((len(d) for d in descriptors), default=0)
    types = np.full((width, m), -1, dtype=np.int64)
    widths = np.ones((width, m), dtype=np.float64)
    for i, d in enumerate(descriptors):
        types[: len(d), i] = d.types
        widths[: len(d), i] = d.widths
    lengths = np.array([len(d) for d in descriptors], dtype=np.int64)
    q = max((len(d.skips) for d in descriptors), default=0)
    skip_array = np.zeros((m, max(q, 1), 3), dtype=np.float64)
    for i, d in enumerate(descriptors):
        if d.skips:
            skip_array[i, : len(d.skips)] = d.skips
    counts = np.array([len(d.skips) for d in descriptors], dtype=np.int64)
    return Packed(types, widths, lengths, tuple(d.skips for d in descriptors), skip_array, counts)


def layer_distances(a: Descriptor, many: Packed) -> np.ndarray:
    """Edit distances between ``a``'s chain and each packed chain."""
    return _edit_rows(a.types, a.widths, many.types_t, many.widths_t, many.lengths)


def skip_distances(a: Descriptor, many: Packed) -> np.ndarray:
    """Matched skip distances from ``a`` to each packed descriptor: one broadcast builds every
    cost matrix, then one small Hungarian assignment per descriptor."""
    m = len(many.lengths)
    out = np.zeros(m)
    p = len(a.skips)
    counts = many.skip_counts
    if p == 0:
        return counts.astype(np.float64)
    # Here, not at the top: the primary and `check` import the search package without
    # searching, and scipy.optimize costs them half a second each.
    from scipy.optimize import linear_sum_assignment

    cost = _skip_costs_many(np.asarray(a.skips, dtype=np.float64), many.skip_array)
    for j in range(m):
        q = counts[j]
        if many.skips[j] == a.skips:
            continue
        if q == 0:
            out[j] = p
            continue
        c = cost[j, :, :q]
        rows, cols = linear_sum_assignment(c)
        out[j] = c[rows, cols].sum() + abs(p - q)
    return out


def _skip_costs_many(a: np.ndarray, many: np.ndarray) -> np.ndarray:
    """Costs between skips (p, 3) and padded skip sets (M, Q, 3): shape (M, p, Q)."""
    fa, la, ta = (a[None, :, None, k] for k in range(3))
    fb, lb, tb = (many[:, None, :, k] for k in range(3))
    denom = np.maximum(fa, fb) + np.maximum(la, lb)
    raw = (np.abs(fa - fb) + np.abs(la - lb)) / np.maximum(denom, 1)
    return np.where(ta == tb, raw, 1.0)


def distances(a: Descriptor, many: Packed) -> np.ndarray:
    """Edit distance from ``a`` to each packed descriptor."""
    if not len(many.lengths):
        return np.zeros(0)
    return layer_distances(a, many) + skip_distances(a, many)
