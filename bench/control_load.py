"""Protocol-faithful simulated replicas: each calls the store exactly as a replica does
(runner/replica.py, runner/worker.py), at a node's rates, with nothing behind the calls but
waiting. Used by bench/bench_control.py (10,000 of them) and tests/store/test_service.py (200).

Per replica, as ``automlperf worker`` does: open the run's store (its store service, or a
database), read the session, register, record the node; its heartbeat thread's beat every
``heartbeat_s`` (and, as the node's sample copier does, ``sample_batch_s`` worth of samples
taken every ``sample_s`` stored at once); a loop of trials: read the history's changes since
its own last read (as one node's process does), fetch the graphs the Bayesian search parses
(its fit set: the best, the most recent and a stable sample; its roots), claim a new
architecture (a ResNet-50 graph's JSON), read the history again (the overlap check), read
the parent trial (weights to inherit), record an epoch every ``epoch_s`` and finish after
``trial_epochs``; at the deadline or when the session ends, end the replica.

A process hosts thousands of them as two sequences of events each (the loop's, the
heartbeat's), kept in one schedule and carried out, when due, by a pool of threads that make
the blocking calls: a thread per replica would leave 10,000 threads fighting over two cores.
Every call's latency is kept, the lag of each event behind its schedule (what the hosting
cost), and what the store acknowledged (epochs, samples, claims), to be held against what the
store holds. The replicas of a process keep one History between them (10,000 histories would
not fit this machine's memory), each reading its own changes into it (its own place in the
change log: what a node alone reads); with ``shared_reads`` they read through the History's
own place instead, as the replicas one process hosts do.
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from automlperf.store import Claim, EpochRecord, Store
from automlperf.store.feed import TrialFeed
from automlperf.store.history import History

OPS = ("open", "register", "heartbeat", "history", "graphs", "claim", "parent", "epoch",
       "finish", "samples", "end")
# Threads per process that make the calls.
THREADS = 48


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
    """What a process's replicas saw: latencies by call, lag by event, and what the store
    acknowledged."""

    latency: dict[str, array] = field(default_factory=lambda: {op: array("d") for op in OPS})
    lag: dict[str, array] = field(default_factory=lambda: {k: array("d") for k in
                                                           ("start", "trial", "epoch", "beat",
                                                            "sample")})
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


class Schedule:
    """Events due at a time, carried out by a pool of threads in order of their time."""

    def __init__(self, threads: int) -> None:
        self.heap: list[tuple[float, int, Callable[[float], None]]] = []
        self.seq = itertools.count()
        self.ready = threading.Condition()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="replicas")
        self.busy = threading.Semaphore(threads)
        self.open = 0
        self.closed = threading.Event()

    def at(self, when: float, event: Callable[[float], None]) -> None:
        with self.ready:
            self.open += 1
            heapq.heappush(self.heap, (when, next(self.seq), event))
            self.ready.notify()

    def run(self) -> None:
        while True:
            with self.ready:
                while True:
                    if not self.heap and self.open == 0:
                        self.pool.shutdown()
                        return
                    wait = self.heap[0][0] - time.time() if self.heap else None
                    if wait is not None and wait <= 0:
                        when, _, event = heapq.heappop(self.heap)
                        break
                    self.ready.wait(wait)
            self.busy.acquire()  # a free thread, or the schedule waits for one
            self.pool.submit(self._do, when, event)

    def _do(self, when: float, event: Callable[[float], None]) -> None:
        try:
            event(when)
        finally:
            self.busy.release()
            with self.ready:
                self.open -= 1
                self.ready.notify()


class SimulatedReplica:
    def __init__(self, open_store: Callable[[], Store], run_id: int, index: int, rates: Rates,
                 graph_json: str, tally: Tally, history: History, schedule: Schedule) -> None:
        self.open_store = open_store
        self.run_id = run_id
        self.index = index
        self.rates = rates
        self.graph_json = graph_json
        self.tally = tally
        self.history = history
        self.feed: TrialFeed | None = TrialFeed(None, run_id)
        self.schedule = schedule
        self.rng = random.Random(index)
        self.node = f"node{index:05d}"
        self.stopping = False
        self.deadline = float("inf")
        self.store: Store | None = None
        self.rid = 0
        self.epoch_s = rates.epoch_s * self.rng.uniform(0.95, 1.05)
        self.k = 0
        self.trial: int | None = None
        self.epochs = 0
        self.done = 0
        self.began = 0.0
        self.pending: list[dict[str, Any]] = []
        self.beating = True

    def _lag(self, kind: str, when: float) -> None:
        with self.tally.lock:
            self.tally.lag[kind].append(time.time() - when)

    def _guard(self, what: str, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - counted, not hidden
            with self.tally.lock:
                self.tally.errors[f"{what}: {type(exc).__name__}: {str(exc)[:100]}"] += 1
            return False

    # --- the loop's events ----------------------------------------------------------------
    def start(self, when: float) -> None:
        self._lag("start", when)
        if not self._guard("start", self._start):
            self.beating = False
            return
        now = time.time()
        self.schedule.at(now + self.rates.heartbeat_s, self.beat)
        self.schedule.at(now + self.rng.uniform(0, self.rates.sample_s), self.sample)
        self.schedule.at(now, self.next_trial)

    def _start(self) -> None:
        t = self.tally
        store = self.store = t.time("open", self.open_store)
        seg = store.segments(self.run_id)[-1]
        self.deadline = seg.deadline_at
        self.rid = t.time("register", store.register_replica, self.run_id, self.index,
                          seg.index, self.node, os.getpid(), [f"cuda:{i}" for i in range(8)],
                          time.time())
        with t.lock:
            t.registered.append(time.time())
        store.record_node(self.run_id, self.index, seg.index, self.node,
                          {"devices": [f"cuda:{i}" for i in range(8)], "simulated": True,
                           "ceiling_ops": None}, time.time())

    def _refresh(self, store: Store) -> None:
        if self.feed is None:
            self.history.refresh(store)
        else:
            self.history.merge(self.feed.read(store), store)

    def next_trial(self, when: float) -> None:
        self._lag("trial", when)
        if self.stopping or time.time() >= self.deadline:
            return self.end()
        if not self._guard("trial", self._claim):
            return self.end()
        self.began = time.time()
        self.epochs = max(1, round(self.rates.trial_epochs * self.rng.uniform(0.8, 1.2)))
        self.done = 0
        self.schedule.at(self.began + self.epoch_s, self.epoch)

    def _claim(self) -> None:
        t, store = self.tally, self.store
        assert store is not None
        counted = getattr(store, "bytes_in", None)
        before = Counter(counted) if counted is not None else Counter()
        t.time("history", self._refresh, store)
        ids = fit_ids(self.history)
        if ids:
            t.time("graphs", self.history.prefetch, ids)
        parent = ids[0] if ids else None
        while True:
            self.k += 1
            claim = Claim(run_id=self.run_id, replica_id=self.rid, replica_index=self.index,
                          graph_hash=f"sim-{self.index}-{self.k}-{self.rng.getrandbits(64):016x}",
                          graph_json=self.graph_json, parent_id=parent,
                          morphs=[{"op": "deepen", "target": "relu", "kernel": 3}], round=self.k,
                          hparams={"batch_size": 1024}, now=time.time(), lease_s=self.rates.lease_s)
            trial = t.time("claim", store.claim_trial, claim)
            if trial is not None:
                break
            with t.lock:
                t.conflicts += 1
        with t.lock:
            t.claims.append(trial)
        self.trial = trial
        t.time("history", self._refresh, store)  # the overlap check
        if parent is not None:
            t.time("parent", store.trial, parent)
        if counted is not None:
            after = Counter(counted)
            with t.lock:
                t.cycles.append((time.time(), after["changes"] - before["changes"],
                                 after["graphs"] - before["graphs"],
                                 sum(after.values()) - sum(before.values())))

    def epoch(self, when: float) -> None:
        self._lag("epoch", when)
        if self.stopping or time.time() >= self.deadline:
            return self.end()
        t, store, e = self.tally, self.store, self.done
        assert store is not None and self.trial is not None
        now = time.time()
        ok = self._guard("epoch", lambda: t.time("epoch", store.record_epoch, EpochRecord(
            trial_id=self.trial, epoch=e, started_at=now - self.epoch_s, ended_at=now,
            train_images=1_281_167, val_images=50_000, steps=1252, ops=3 * 10**16,
            train_loss=1.0, val_accuracy=0.5 + 0.005 * e, precision="bf16", batch_size=1024,
            world_size=8, data_share=0.02, images_per_s=40_000.0, run_id=self.run_id)))
        if ok:
            with t.lock:
                t.epochs.append((self.trial, e))
            self.done += 1
        if self.done < self.epochs:
            self.schedule.at(self.began + (e + 2) * self.epoch_s, self.epoch)
            return None
        self._finish("completed")
        self.schedule.at(time.time(), self.next_trial)
        return None

    def _finish(self, status: str) -> None:
        t, store, trial = self.tally, self.store, self.trial
        assert store is not None
        if trial is None:
            return
        self.trial = None
        ok = t.time("finish", store.finish_trial, trial, status, time.time(), "",
                    0.5 + 0.3 * self.rng.random() if self.done else None)
        if not ok:
            with t.lock:
                t.charged.append(trial)

    def end(self) -> None:
        """The deadline, or the session ended: the trial cut short, the replica ended."""
        self.stopping = True
        self.beating = False
        store = self.store
        if store is None:
            return
        self._guard("finish", lambda: self._finish("stopped"))
        self._flush()  # the sample copier's last, as its sampler stops
        self._guard("end", lambda: self.tally.time("end", store.end_replica, self.rid,
                                                   "stopped", time.time(), ""))

    # --- the heartbeat's events -----------------------------------------------------------
    def beat(self, when: float) -> None:
        self._lag("beat", when)
        if not self.beating:
            return self._flush()
        store = self.store
        assert store is not None
        seg: Any = None

        def call() -> None:
            nonlocal seg
            seg = self.tally.time("heartbeat", store.heartbeat, self.rid, time.time(),
                                  self.rates.lease_s)

        if self._guard("heartbeat", call) and (seg is None or seg.ended_at is not None):
            self.stopping = True
        if time.time() < self.deadline:
            self.schedule.at(when + self.rates.heartbeat_s, self.beat)
        return None

    def sample(self, when: float) -> None:
        self._lag("sample", when)
        if not self.beating:
            return self._flush()
        now = time.time()
        self.pending.append({"t": now, "cpu_percent": 40.0, "mem_used_gib": 900.0,
                             "gpus": [{"index": i, "util": 95.0, "energy_mj": int(now * 1000),
                                       "mem_used_gib": 60.0} for i in range(8)]})
        if now - self.pending[0]["t"] >= self.rates.sample_batch_s:
            self._flush()
        self.schedule.at(when + self.rates.sample_s, self.sample)
        return None

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        store = self.store
        if not pending or store is None:
            return
        if self._guard("samples", lambda: self.tally.time("samples", store.add_samples,
                                                          self.run_id, self.node, pending)):
            with self.tally.lock:
                self.tally.samples += [(self.node, s["t"]) for s in pending]


def run_replicas(open_store: Callable[[], Store], run_id: int, indices: list[int], rates: Rates,
                 graph_json: str, shared_reads: bool = False, threads: int = THREADS) -> Tally:
    """Run these replicas in this process, started together, until the session ends; what
    they saw."""
    tally = Tally()
    schedule = Schedule(threads)
    shared = History(run_id)
    now = time.time()
    for i in indices:
        replica = SimulatedReplica(open_store, run_id, i, rates, graph_json, tally, shared,
                                   schedule)
        if shared_reads:
            replica.feed = None
        schedule.at(now, replica.start)
    schedule.run()
    return tally
