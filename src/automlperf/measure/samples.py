"""One pass over a run's monitor samples for everything read from them: the energy the
counters measured, the mean utilisation inside the sessions, and the resource chart's columns.

A long run stores a million samples holding eight million GPU readings. Only the numbers the
figures use are read (the store keeps them beside each sample), in chunks (never all held at
once), and passed over once for all three figures; the chart keeps its columns in arrays
rather than a tuple per reading. The figures equal
:func:`automlperf.measure.energy.energy_summary` and
:func:`automlperf.measure.breakdown.utilisation` on the same samples (their definitions;
the order floats are added in may differ in the last bits).

Pure: plain data in, plain data and NumPy arrays out."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from automlperf.measure.energy import counter_delta
from automlperf.measure.score import segment_bounds
from automlperf.store.base import SampleFigures


@dataclass
class ResourceColumns:
    """What the resource chart draws: one entry per GPU reading (``gpu``) or per host reading
    (otherwise) of the samples with a time and a CPU figure, in sample order."""

    gpu: bool = False
    nodes: int = 0  # nodes with such samples
    per_node: int = 1  # devices per node (the most in the first 100 samples of each share)
    t: Any = field(default_factory=lambda: np.zeros(0))
    util: Any = field(default_factory=lambda: np.zeros(0))
    mem: Any = field(default_factory=lambda: np.zeros(0))
    key: Any = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # into ``keys``
    keys: list[tuple[str, int]] = field(default_factory=list)  # (node, GPU index or -1)


class SampleDigest:
    """Feed it the readings in the store's order (by time); then read :meth:`energy`,
    :meth:`utilisation` and, when made with ``chart``, :meth:`columns`."""

    def __init__(self, segments: Sequence[Any], chart: bool = False) -> None:
        self._spans = [(s.started_at, s.end, int(s.index)) for s in segments]
        self._bounds = [(a, b) for a, b, _ in segment_bounds(segments)]
        self._chart = chart
        self.count = 0  # samples fed
        # energy, per node in order of first appearance: the last reading's (t, session,
        # {uuid: energy_mj}, cpu counters), and joules and seconds covered so far
        self._last: dict[str, tuple[float, int | None, dict[Any, Any], Any]] = {}
        self._gpu_j: dict[str, float] = {}
        self._cpu_j: dict[str, float] = {}
        self._seconds: dict[str, float] = {}
        # utilisation: sums in sample order
        self._inside = 0
        self._cpu_sum, self._cpu_n = 0.0, 0
        self._gpu_sum, self._gpu_n = 0.0, 0
        # interference inside the sessions: the host's steal, GPU readings held down
        self._steal_sum, self._steal_n = 0.0, 0
        self._throttled, self._clocked = 0.0, 0
        # chart
        self._any_gpu = False
        self._nodes: set[str] = set()
        self._first: list[int] = []  # GPU counts of the first 100 charted readings (of each
        # share, when merged)
        self._keys: dict[tuple[str, int], int] = {}
        self._g = (array("d"), array("d"), array("d"), array("q"))
        self._h = (array("d"), array("d"), array("d"), array("q"))

    def _session(self, t: float) -> int | None:
        for start, end, index in self._spans:
            if start <= t <= end:
                return index
        return None

    def feed(self, samples: Iterable[SampleFigures]) -> None:
        """Samples as the store's :meth:`~automlperf.store.base.Store.sample_figure_chunks`
        gives them: node, time, numbers, GPU uuids, CPU counters (a NaN number is a reading
        the sample lacks)."""
        chart = self._chart
        last, seconds, gpu_j, cpu_j = self._last, self._seconds, self._gpu_j, self._cpu_j
        for node, t, numbers, uuids, cpu_e in samples:
            self.count += 1
            gpus = range(2, 2 + 4 * len(uuids), 4)  # where each GPU's numbers start
            if uuids:
                self._any_gpu = True
            # energy: consecutive samples of a node within one session
            seg = self._session(t)
            energies = {uuid: numbers[k + 2] for uuid, k in zip(uuids, gpus)
                        if numbers[k + 2] == numbers[k + 2]}
            prev = last.get(node)
            if prev is None:
                seconds[node] = gpu_j[node] = cpu_j[node] = 0.0
            elif prev[1] is not None and prev[1] == seg:
                used = False
                before = prev[2]
                joules = 0.0
                for uuid, k in zip(uuids, gpus):
                    after = numbers[k + 2]
                    was = before.get(uuid)
                    if was is not None and after == after:
                        joules += counter_delta(was, after, None) / 1e3
                        used = True
                if used:
                    gpu_j[node] += joules
                if cpu_e:
                    before_cpu = prev[3] or {}
                    for domain, (after, wrap) in cpu_e.items():
                        if domain in before_cpu:
                            cpu_j[node] += counter_delta(before_cpu[domain][0], after, wrap) / 1e6
                            used = True
                if used:
                    seconds[node] += t - prev[0]
            last[node] = (t, seg, energies, cpu_e)
            # utilisation: samples inside a session
            cpu = numbers[0]
            if any(a <= t <= b for a, b in self._bounds):
                self._inside += 1
                if cpu == cpu:
                    self._cpu_sum += cpu / 100.0
                    self._cpu_n += 1
                for k in gpus:
                    util = numbers[k + 1]
                    if util == util:
                        self._gpu_sum += util / 100.0
                        self._gpu_n += 1
                after = 2 + 4 * len(uuids)  # samples stored before steal end here
                if len(numbers) > after:
                    steal = numbers[after]
                    if steal == steal:
                        self._steal_sum += steal
                        self._steal_n += 1
                    for held in numbers[after + 1:after + 1 + len(uuids)]:
                        if held == held:
                            self._throttled += held
                            self._clocked += 1
            if chart and cpu == cpu:
                self._charted(node, t, numbers, gpus)

    def _charted(self, node: str, t: float, numbers: list[float], gpus: range) -> None:
        self._nodes.add(node)
        if len(self._first) < 100:
            self._first.append(len(gpus))
        keys = self._keys
        ts, us, ms, ks = self._g
        for k in gpus:
            util = numbers[k + 1]
            if util == util:
                index = numbers[k]  # if the sample lacks it: the GPU's place in its list
                key = keys.setdefault((node, int(index) if index == index else (k - 2) // 4),
                                      len(keys))
                ts.append(t)
                us.append(util)
                ms.append(numbers[k + 3])
                ks.append(key)
        ts, us, ms, ks = self._h
        ts.append(t)
        us.append(numbers[0])
        ms.append(numbers[1])
        ks.append(keys.setdefault((node, -1), len(keys)))

    def merge(self, other: SampleDigest) -> None:
        """Add the digest of other nodes' readings (each node's readings in one digest)."""
        if self._last.keys() & other._last.keys():
            raise ValueError("digests of the same node's readings cannot be merged")
        self.count += other.count
        self._last.update(other._last)
        self._gpu_j.update(other._gpu_j)
        self._cpu_j.update(other._cpu_j)
        self._seconds.update(other._seconds)
        self._inside += other._inside
        self._cpu_sum += other._cpu_sum
        self._cpu_n += other._cpu_n
        self._gpu_sum += other._gpu_sum
        self._gpu_n += other._gpu_n
        self._steal_sum += other._steal_sum
        self._steal_n += other._steal_n
        self._throttled += other._throttled
        self._clocked += other._clocked
        self._any_gpu |= other._any_gpu
        self._nodes |= other._nodes
        self._first += other._first
        order = sorted(other._keys, key=other._keys.__getitem__)
        new_key = np.array([self._keys.setdefault(k, len(self._keys)) for k in order] or [0],
                           dtype=np.int64)
        for mine, theirs in ((self._g, other._g), (self._h, other._h)):
            mine[0].extend(theirs[0])
            mine[1].extend(theirs[1])
            mine[2].extend(theirs[2])
            mine[3].frombytes(new_key[np.frombuffer(theirs[3], dtype=np.int64)].tobytes())

    def energy(self) -> dict[str, Any] | None:
        """As :func:`~automlperf.measure.energy.energy_summary`."""
        covered = [s for s in self._seconds.values() if s]
        if not covered:
            return None
        gpu_j, cpu_j = sum(self._gpu_j.values()), sum(self._cpu_j.values())
        total = gpu_j + cpu_j
        seconds = sum(covered) / len(covered)
        return {"energy_j": total, "gpu_energy_j": gpu_j, "cpu_energy_j": cpu_j,
                "energy_window_s": seconds, "mean_power_w": total / seconds if seconds else None}

    def utilisation(self) -> dict[str, Any]:
        """As :func:`~automlperf.measure.breakdown.utilisation`."""
        return {"accelerator": self._gpu_sum / self._gpu_n if self._gpu_n else None,
                "cpu": self._cpu_sum / self._cpu_n if self._cpu_n else None,
                "samples": self._inside}

    def interference(self) -> dict[str, Any]:
        """Inside the sessions: the mean share of CPU time the host stole from the nodes,
        and the share of GPU readings whose clock NVML said was held down by interference
        (thermal, hardware slowdown, power brake); None where no sample had the reading."""
        return {"cpu_steal": self._steal_sum / self._steal_n if self._steal_n else None,
                "gpu_throttled": self._throttled / self._clocked if self._clocked else None,
                "steal_samples": self._steal_n, "gpu_readings": self._clocked}

    def columns(self) -> ResourceColumns:
        if not self._chart:
            raise ValueError("this digest was made without chart=True")
        gpu = self._any_gpu
        ts, us, ms, ks = self._g if gpu else self._h
        keys = sorted(self._keys, key=self._keys.__getitem__)
        return ResourceColumns(
            gpu=gpu, nodes=len(self._nodes), per_node=max(self._first, default=0) if gpu else 1,
            t=np.frombuffer(ts, dtype=float), util=np.frombuffer(us, dtype=float),
            mem=np.frombuffer(ms, dtype=float), key=np.frombuffer(ks, dtype=np.int64),
            keys=keys)


def sample_digest(chunks: Iterable[Iterable[SampleFigures]], segments: Sequence[Any],
                  chart: bool = False) -> SampleDigest:
    """The digest of samples given in chunks (as a store streams them)."""
    out = SampleDigest(segments, chart)
    for chunk in chunks:
        out.feed(chunk)
    return out


def energy_preserving(chunks: Iterable[Iterable[SampleFigures]], segments: Sequence[Any],
                      total: int, limit: int) -> bytearray:
    """Which of ``total`` samples (given as the store streams them) to keep so that about
    ``limit`` remain while the energy :class:`SampleDigest` computes from them equals, to the
    last bits of its sums, the energy it computes from all: ``keep[i]`` is 1 for the i-th.

    Energy is a sum of counter differences between consecutive samples of a node in one
    session, so it telescopes: dropping a sample whose neighbours are in its session, read
    the same counters and never saw one go down (a reset or a wrap) changes no joule and no
    second covered. Every such boundary is kept on both sides, with each node's last sample
    and every k-th (k = ``total`` / ``limit``, rounded up); the mean utilisation of the kept
    samples is not that of all."""
    keep = bytearray(total)
    if total <= limit:
        return bytearray(b"\x01" * total)
    every = -(-total // max(1, limit))
    spans = [(s.started_at, s.end, int(s.index)) for s in segments]

    def session(t: float) -> int | None:
        for start, end, index in spans:
            if start <= t <= end:
                return index
        return None

    # per node: (index of its last sample, its position, its signature, its counters)
    last: dict[str, tuple[int, int, Any, dict[Any, float]]] = {}
    i = 0
    for chunk in chunks:
        for node, t, numbers, uuids, cpu_e in chunk:
            energies = {("gpu", uuid): numbers[k] for uuid, k in
                        zip(uuids, range(4, 4 + 4 * len(uuids), 4)) if numbers[k] == numbers[k]}
            counters = {**energies, **{("cpu", d): v[0] for d, v in (cpu_e or {}).items()}}
            signature = (session(t), frozenset(counters))
            prev = last.get(node)
            position = 0 if prev is None else prev[1] + 1
            if prev is None or position % every == 0:
                keep[i] = 1
            if prev is not None and (prev[2] != signature or any(
                    counters[c] < v for c, v in prev[3].items())):
                keep[prev[0]] = keep[i] = 1
            last[node] = (i, position, signature, counters)
            i += 1
    for index, *_ in last.values():
        keep[index] = 1
    return keep
