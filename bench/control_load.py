"""Protocol-faithful simulated replicas: each calls the store exactly as a replica does
(runner/replica.py, runner/worker.py), at a node's rates, with nothing behind the calls but
waiting. Used by bench/bench_control.py (10,000 of them) and tests/test_scale.py (200).

Per replica, as ``automlperf worker`` does: open the run's store (its store service, or a
database), read the session, register, record the node; a heartbeat thread beating every
``heartbeat_s`` (and, as the node's sample copier does, storing ``sample_batch_s`` worth of
samples taken every ``sample_s``); a loop of trials: read the history's changes since its
own last read (as one node's process does), fetch the graphs the Bayesian search parses (its
fit set: the best, the most recent and a stable sample; its roots), claim a new architecture
(a ResNet-50 graph's JSON), read the history again (the overlap check), read the parent
trial (weights to inherit), record an epoch every ``epoch_s`` and finish after
``trial_epochs``; at the deadline or when the session ends, end the replica.

The replicas of a process keep one History between them (10,000 histories of their own
would not fit this machine's memory), each reading its own changes into it (its own place
in the change log: what a node alone reads); with ``shared_reads`` they read through the
History's own place instead, as the replicas one process hosts do.

Every call's latency is kept, and what the store acknowledged (epochs, samples, claims), to
be held against what the store holds."""

from __future__ import annotations

import os
import random
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from automlperf.store import EpochRecord, Store
from automlperf.store.feed import TrialFeed
from automlperf.store.history import History

OPS = ("open", "register", "heartbeat", "history", "graphs", "claim", "parent", "epoch",
       "finish", "samples", "end")


@dataclass
class Rates:
    heartbeat_s: float = 5.0
    epoch_s: float = 32.0  # each node's own, within +-5 %
    sample_s: float = 30.0
    sample_batch_s: float = 300.0
    trial_epochs: int = 50  # each trial's own, within +-20 %
    lease_s: float = 60.0


@dataclass
class Tally:
    """What a process's replicas saw: latencies by call, and what the store acknowledged."""

    latency: dict[str, array] = field(default_factory=lambda: {op: array("d") for op in OPS})
    epochs: list[tuple[int, int]] = field(default_factory=list)
    samples: list[tuple[str, float]] = field(default_factory=list)
    claims: list[int] = field(default_factory=list)
    registered: list[float] = field(default_factory=list)  # time of each registration
    conflicts: int = 0
    charged: list[int] = field(default_factory=list)  # finished False: failed by lease
    errors: Counter[str] = field(default_factory=Counter)
    # (time, bytes of history changes, of graphs, of the whole claim cycle) per claim
    cycles: list[tuple[float, int, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def time(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            elapsed = time.perf_counter() - t
            with self.lock:
                self.latency[op].append(elapsed)


def fit_ids(history: History) -> list[int]:
    """The trials whose graphs the Bayesian search parses in a generation: its fit set (the
    32 best, the 16 most recent and 16 by smallest hash, of the trained) and its roots (the
    16 best, among the 32)."""
    trained = [m for m in history.models() if m.status == "completed" and m.accuracy is not None]
    best = sorted(trained, key=lambda m: -(m.accuracy or 0.0))[:32]
    recent = trained[-16:]
    stable = sorted(trained, key=lambda m: m.content_hash)[:16]
    return list(dict.fromkeys(m.id for m in (*best, *recent, *stable)))


class SimulatedReplica:
    def __init__(self, open_store: Callable[[], Store], run_id: int, index: int, rates: Rates,
                 graph_json: str, tally: Tally, history: History | None = None,
                 start: threading.Event | None = None) -> None:
        self.open_store = open_store
        self.run_id = run_id
        self.index = index
        self.rates = rates
        self.graph_json = graph_json
        self.tally = tally
        self.history = history if history is not None else History(run_id)
        self.feed: TrialFeed | None = TrialFeed(None, run_id)
        self.start = start
        self.rng = random.Random(index)
        self.stop = threading.Event()
        self.node = f"node{index:05d}"
        self.deadline = 0.0

    def _wait(self, until: float) -> bool:
        """Wait until ``until`` (or the deadline); whether to stop."""
        return self.stop.wait(max(0.0, min(until, self.deadline) - time.time())) or \
            time.time() >= self.deadline

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - counted, not hidden
            with self.tally.lock:
                self.tally.errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
        finally:
            self.stop.set()

    def _run(self) -> None:
        t = self.tally
        if self.start is not None:
            self.start.wait()
        store = t.time("open", self.open_store)
        seg = store.segments(self.run_id)[-1]
        self.deadline = seg.deadline_at
        rid = t.time("register", store.register_replica, self.run_id, self.index, seg.index,
                     self.node, os.getpid(), [f"cuda:{i}" for i in range(8)], time.time())
        with t.lock:
            t.registered.append(time.time())
        store.record_node(self.run_id, self.index, seg.index, self.node,
                          {"devices": [f"cuda:{i}" for i in range(8)], "simulated": True,
                           "ceiling_ops": None}, time.time())
        agent = threading.Thread(target=self._agent, args=(store, rid), daemon=True)
        agent.start()
        try:
            self._trials(store, rid)
        finally:
            self.stop.set()
            agent.join()
            t.time("end", store.end_replica, rid, "stopped", time.time(), "")
            store.close()

    def _agent(self, store: Store, rid: int) -> None:
        """The heartbeat thread, and the node's sample copier."""
        r, t = self.rates, self.tally
        now = time.time()
        beat = now + r.heartbeat_s
        sample = now + self.rng.uniform(0, r.sample_s)
        pending: list[dict[str, Any]] = []
        while not self._wait(min(beat, sample)):
            now = time.time()
            if now >= beat:
                beat += r.heartbeat_s
                try:
                    seg = t.time("heartbeat", store.heartbeat, rid, now, r.lease_s)
                except Exception as exc:  # noqa: BLE001 - the next beat tries again
                    with t.lock:
                        t.errors[f"heartbeat: {type(exc).__name__}"] += 1
                    continue
                if seg is None or seg.ended_at is not None:
                    self.stop.set()
            if now >= sample:
                sample += r.sample_s
                pending.append({"t": now, "cpu_percent": 40.0, "mem_used_gib": 900.0,
                                "gpus": [{"index": i, "util": 95.0, "energy_mj": int(now * 1000),
                                          "mem_used_gib": 60.0} for i in range(8)]})
                if now - pending[0]["t"] >= r.sample_batch_s:
                    self._samples(store, pending)
                    pending = []
        if pending:
            self._samples(store, pending)

    def _samples(self, store: Store, pending: list[dict[str, Any]]) -> None:
        self.tally.time("samples", store.add_samples, self.run_id, self.node, pending)
        with self.tally.lock:
            self.tally.samples += [(self.node, s["t"]) for s in pending]

    def _refresh(self, store: Store) -> None:
        if self.feed is None:
            self.history.refresh(store)
        else:
            self.history.merge(self.feed.read(store), store)

    def _trials(self, store: Store, rid: int) -> None:
        r, t = self.rates, self.tally
        epoch_s = r.epoch_s * self.rng.uniform(0.95, 1.05)
        k = 0
        counted = getattr(store, "bytes_in", None)
        while not self.stop.is_set() and time.time() < self.deadline:
            before = Counter(counted) if counted is not None else Counter()
            t.time("history", self._refresh, store)
            ids = fit_ids(self.history)
            if ids:
                t.time("graphs", self.history.prefetch, ids)
            parent = ids[0] if ids else None
            while True:
                k += 1
                trial = t.time("claim", store.claim_trial, self.run_id, rid, self.index,
                               f"sim-{self.index}-{k}-{self.rng.getrandbits(64):016x}",
                               self.graph_json, parent, [{"kind": "deepen"}], k, {"batch_size": 1024},
                               time.time(), r.lease_s)
                if trial is not None:
                    break
                with t.lock:
                    t.conflicts += 1
            with t.lock:
                t.claims.append(trial)
            t.time("history", self._refresh, store)  # the overlap check
            if parent is not None:
                t.time("parent", store.trial, parent)
            if counted is not None:
                after = Counter(counted)
                with t.lock:
                    t.cycles.append((time.time(), after["changes"] - before["changes"],
                                     after["graphs"] - before["graphs"],
                                     sum(after.values()) - sum(before.values())))
            epochs = max(1, round(r.trial_epochs * self.rng.uniform(0.8, 1.2)))
            began = time.time()
            done = 0
            for e in range(epochs):
                end = began + (e + 1) * epoch_s
                if self._wait(end):
                    break
                now = time.time()
                t.time("epoch", store.record_epoch, EpochRecord(
                    trial, e, now - epoch_s, now, 1_281_167, 50_000, 1252, 3 * 10**16, 1.0,
                    0.5 + 0.005 * e, "bf16", 1024, 8, 0.02, 40_000.0, run_id=self.run_id))
                with t.lock:
                    t.epochs.append((trial, e))
                done += 1
            status = "completed" if done == epochs else "stopped"
            ok = t.time("finish", store.finish_trial, trial, status, time.time(), "",
                        0.5 + 0.3 * self.rng.random() if done else None)
            if not ok:
                with t.lock:
                    t.charged.append(trial)


def run_replicas(open_store: Callable[[], Store], run_id: int, indices: list[int], rates: Rates,
                 graph_json: str, shared_reads: bool = False) -> Tally:
    """Run these replicas as threads of this process, started together, until the session
    ends; what they saw."""
    threading.stack_size(512 * 1024)
    tally = Tally()
    start = threading.Event()
    shared = History(run_id)
    replicas = [SimulatedReplica(open_store, run_id, i, rates, graph_json, tally, shared, start)
                for i in indices]
    if shared_reads:
        for r in replicas:
            r.feed = None
    threads = [threading.Thread(target=r.run, name=f"replica-{r.index}", daemon=True)
               for r in replicas]
    for th in threads:
        th.start()
    start.set()
    for th in threads:
        th.join()
    return tally
