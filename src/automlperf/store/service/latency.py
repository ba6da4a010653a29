"""The service's own time per call, by kind: from a decoded request to its encoded answer,
the loopback or network and the client's side left out. Kept as counts in logarithmic bins
(about 4.4 % wide), so a run of any length costs a few kilobytes and a dictionary update per
call; percentiles are read from the bins. Written beside the service's log
(``logs/store-service-calls.json``) every minute and as the service stops, and summed up in
its log: where a site sizes the service, and what bench/bench_control.py reads."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

# Bins per doubling: a percentile is exact to 2 ** (1/16) - 1 = 4.4 %.
PER_OCTAVE = 16
PERCENTILES = (0.5, 0.9, 0.99)


class CallTimes:
    """Per kind of call: how many, their total, their maximum and their binned spread."""

    def __init__(self) -> None:
        self.bins: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.count: dict[str, int] = defaultdict(int)
        self.total: dict[str, float] = defaultdict(float)
        self.most: dict[str, float] = defaultdict(float)

    def add(self, kind: str, seconds: float) -> None:
        """One call of ``kind`` took ``seconds``; ``kind`` must come from a closed set (the
        service's calls), never from what a client sent."""
        micro = seconds * 1e6
        self.bins[kind][int(math.log2(micro) * PER_OCTAVE) if micro > 1.0 else 0] += 1
        self.count[kind] += 1
        self.total[kind] += seconds
        if seconds > self.most[kind]:
            self.most[kind] = seconds

    def percentile(self, kind: str, q: float) -> float:
        """The upper edge of the bin holding the ``q`` quantile, in seconds, at most the
        maximum seen."""
        rank = q * self.count[kind]
        seen = 0
        for index in sorted(self.bins[kind]):
            seen += self.bins[kind][index]
            if seen >= rank:
                return min(self.most[kind], 2 ** ((index + 1) / PER_OCTAVE) / 1e6)
        return self.most[kind]

    def state(self) -> dict[str, Any]:
        """What it holds, as JSON: :meth:`between` two of these gives the calls in between."""
        return {"bins": {kind: {str(i): c for i, c in bins.items()}
                         for kind, bins in self.bins.items()},
                "count": dict(self.count), "total": dict(self.total), "most": dict(self.most)}

    @classmethod
    def between(cls, earlier: dict[str, Any], later: dict[str, Any]) -> CallTimes:
        """The calls counted in ``later`` and not in ``earlier`` (two :meth:`state` of one
        service); a maximum is the upper edge of the highest bin that grew, at most the
        later maximum."""
        out = cls()
        for kind, bins in later["bins"].items():
            before = earlier["bins"].get(kind, {})
            grown = {int(i): c - before.get(i, 0) for i, c in bins.items()
                     if c > before.get(i, 0)}
            if not grown:
                continue
            out.bins[kind].update(grown)
            out.count[kind] = sum(grown.values())
            out.total[kind] = later["total"][kind] - earlier["total"].get(kind, 0.0)
            out.most[kind] = min(later["most"][kind], 2 ** ((max(grown) + 1) / PER_OCTAVE) / 1e6)
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per kind: ``n``, ``mean_ms``, ``p50_ms``, ``p90_ms``, ``p99_ms``, ``max_ms``."""
        out: dict[str, dict[str, Any]] = {}
        for kind in sorted(self.count):
            n = self.count[kind]
            row: dict[str, Any] = {"n": n, "mean_ms": round(1e3 * self.total[kind] / n, 4)}
            for q in PERCENTILES:
                row[f"p{round(q * 100)}_ms"] = round(1e3 * self.percentile(kind, q), 4)
            row["max_ms"] = round(1e3 * self.most[kind], 4)
            out[kind] = row
        return out

    def line(self) -> str:
        """One line for the log: each kind's count, p50 / p99 / max in milliseconds."""
        return "; ".join(f"{kind} {row['n']} calls, p50 {row['p50_ms']:.2f} / p99 "
                         f"{row['p99_ms']:.2f} / max {row['max_ms']:.1f} ms"
                         for kind, row in self.summary().items()) or "no calls"
