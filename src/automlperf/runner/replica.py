"""A replica: generate a candidate on the CPU, train it on this node's accelerators, record
it, repeat until the run's deadline. One replica runs per node (or per local process).

The next candidate is generated in a thread while the current one trains, so accelerators
do not wait for the search. The replica stops on SIGTERM, at the deadline, or when the
primary stops heart-beating; a trial cut short keeps the epochs it completed.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.graph import seeds
from automlperf.runner.rundir import RUN_FILE, RunDir, write_atomic
from automlperf.search import Candidate, Model, NoCandidate, Searcher
from automlperf.search.curve import predict_final
from automlperf.search.hpo import HyperSearch, batch_range
from automlperf.store import COMPLETED, FAILED, STOPPED, EpochRecord, open_store
from automlperf.store.urls import STORE_ENV
from automlperf.train.pool import (DataArgs, DevicePool, PoolError, accelerator_memory_gib,
                                   choose_devices, cores_available, run_trial)
from automlperf.events import EpochEvent, JsonlSink
from automlperf.train.trainer import TrialSpec

log = logging.getLogger("automlperf.replica")

# What to do about a failure that repeats, by the trainer's failure kind.
FIXES = {
    "oom": "lower train.batch_size (or data.image_size) in the configuration",
    "nan": "lower train.lr_per_256 or raise train.warmup_epochs in the configuration",
    "data": "check the dataset: `automlperf train --dataset ... --data-dir ...` shows the "
            "problem on its own",
    "crash": "a training process died: look for the system killing it (host memory, "
             "the job's limits) in {log}",
}


class CannotTrain(RuntimeError):
    """Trials keep failing for the same reason: the replica cannot do its job."""


def _reason_key(reason: str) -> str:
    # Sizes, counts and ids differ between occurrences of the same failure.
    return re.sub(r"\d+(\.\d+)?", "#", reason)


def repeated_failure(reasons: list[str], limit: int) -> str | None:
    """The reason, when the last ``limit`` trials all failed alike (numbers aside)."""
    if len(reasons) < limit:
        return None
    last = reasons[-limit:]
    return last[-1] if len({_reason_key(r) for r in last}) == 1 else None


@dataclass
class Job:
    candidate: Candidate
    round: int
    batch_size: int
    kernel_size: int
    hpo_number: int | None
    waited_s: float = 0.0  # how long training waited for this candidate


class Replica:
    def __init__(self, run_dir: Path, store_url: str | None, index: int,
                 devices: int | None = None, threads: int | None = None,
                 monitor: bool = True) -> None:
        self.dir = RunDir(Path(run_dir))
        meta = self.dir.meta()
        self.run_id = int(meta["run_id"])
        self.url = self.dir.store_url(store_url)
        self.store = open_store(self.url, run_dir=self.dir.path)
        self.config = Config.load(self.dir.config)
        self.index = index
        self.monitor = monitor
        self.segment = self.store.segments(self.run_id)[-1]
        self.stop = threading.Event()
        self.devices = choose_devices(devices or self.config.run.devices_per_replica)
        self.threads = max(1, (threads or cores_available()) // len(self.devices))
        self.rng = random.Random(self.config.run.seed * 7919 + index)
        self.searcher = Searcher(self.config.search)
        self.models: dict[int, Model] = {}
        self.last_trial_id = 0
        self.failures: list[str] = []  # reasons of the trials failed in a row

    # --- lifecycle ----------------------------------------------------------------------
    def run(self) -> int:
        if self.segment.ended_at is not None:
            log.info("the run's current session has ended; nothing to do")
            return 0
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        data = DataArgs.from_config(self.config.data, self.threads)
        self.replica_id = self.store.register_replica(
            self.run_id, self.index, self.segment.index, socket.gethostname(), os.getpid(),
            self.devices, time.time())
        beat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        beat.start()
        status, reason = FAILED, ""
        try:
            self._record_node()
            try:
                self.pool = DevicePool(self.devices, data, threads_per_rank=self.threads)
            except PoolError as exc:
                raise CannotTrain(str(exc)) from None
            log.info("replica %d: %d x %s, %d threads each, %s", self.index, len(self.devices),
                     self.pool.description["devices"][0], self.threads,
                     self.pool.description["dataset"])
            sampler = self._start_sampler() if self.monitor else None
            try:
                self._loop()
                status = STOPPED
            finally:
                self.pool.close()
                if sampler is not None:
                    sampler.terminate()
                    sampler.wait(timeout=30)
        except CannotTrain as exc:
            # Recorded for the primary, which ends the run and says why.
            reason = str(exc)
            log.error("replica %d gives up: %s", self.index, reason)
            return 1
        except Exception as exc:
            reason = f"replica error: {type(exc).__name__}: {exc}; see {self._log_name()}"
            log.exception("replica %d failed", self.index)
            raise
        finally:
            self.stop.set()
            self.store.end_replica(self.replica_id, status, time.time(), reason)
            beat.join(timeout=5)
        return 0

    def _record_node(self) -> None:
        """Describe this node and measure its devices' matmul rate before training starts,
        so the measurement has the devices to itself."""
        from automlperf.measure.ceiling import run_measurement

        found = run_measurement(self.devices, self.config.train.precision,
                                self.threads * len(self.devices), self.config.monitor.ceiling_s)
        ceiling = found.get("ceiling_ops")
        log.info("replica %d: measured ceiling %s", self.index,
                 f"{ceiling:.4e} ops/s" if ceiling else found.get("error"))
        self.store.record_node(self.run_id, self.index, self.segment.index,
                               socket.gethostname(), found, time.time())

    def _log_name(self) -> str:
        return str(self.dir.logs / f"replica-{self.index}.log")

    def _start_sampler(self) -> subprocess.Popen[bytes]:
        """This node's resource monitor, in a process of its own."""
        env = dict(os.environ)
        if self.url:
            env[STORE_ENV] = self.url
        uuids = ",".join(self.pool.description.get("uuids", []))
        self.dir.logs.mkdir(exist_ok=True)
        with open(self.dir.logs / f"monitor-{socket.gethostname()}.log", "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", "automlperf.measure.monitor", "--run-dir",
                 str(self.dir.path), "--interval", str(self.config.monitor.interval_s),
                 "--uuids", uuids], env=env, stdout=log_file, stderr=subprocess.STDOUT)

    def _heartbeat(self) -> None:
        period = self.config.run.heartbeat_s
        while not self.stop.wait(period):
            now = time.time()
            try:
                self.store.heartbeat(self.replica_id, now, self.config.run.lease_timeout_s)
                seg = next(s for s in self.store.segments(self.run_id)
                           if s.index == self.segment.index)
            except Exception:  # noqa: BLE001 - a store hiccup is retried next beat
                log.warning("heartbeat failed; retrying", exc_info=True)
                continue
            if seg.ended_at is not None:
                log.info("the primary ended the session; stopping")
                self.stop.set()
            elif now - seg.last_seen > self.config.run.lease_timeout_s:
                log.warning("the primary has been silent for %.0f s; stopping",
                            now - seg.last_seen)
                self.stop.set()

    def _should_stop(self) -> bool:
        return self.stop.is_set() or time.time() >= self.segment.deadline_at

    def _rounds_left(self, round_index: int) -> bool:
        limit = self.config.run.max_rounds
        return limit is None or round_index < limit

    # --- the loop -----------------------------------------------------------------------
    def _loop(self) -> None:
        desc = self.pool.description["dataset"]
        self.seed_graph = seeds.seed(self.config.model.seed_model, desc["classes"],
                                     desc["image_size"], desc["channels"])
        self.world = self.pool.world
        self.default_batch = self.config.train.per_device_batch(accelerator_memory_gib()) * self.world
        self.hpo = HyperSearch(
            self.store.url,
            f"run-{self.run_id}-replica-{self.index}",
            batch_range(self.default_batch, self.config.search.batch_size_factors, self.world),
            self.config.search.kernel_sizes, multiple=self.world,
            seed=self.config.run.seed + self.index,
            startup_trials=self.config.search.tpe_startup_trials)
        done = sum(1 for t in self.store.summaries(self.run_id) if t.replica_index == self.index)
        round_index = done  # a resumed replica goes on counting its rounds
        if not self._rounds_left(round_index):
            log.info("replica %d has trained its %d rounds", self.index, round_index)
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="search") as search:
            upcoming: Future[Job] = search.submit(self._prepare, round_index)
            try:
                while not self._should_stop() and self._rounds_left(round_index):
                    asked = time.time()
                    try:
                        job = upcoming.result()
                        job.waited_s = time.time() - asked
                    except NoCandidate as exc:
                        log.warning("no candidate: %s; waiting for other replicas", exc)
                        if self.stop.wait(10):
                            break
                        upcoming = search.submit(self._prepare, round_index)
                        continue
                    trial_id = self._claim(job)
                    if trial_id is None:  # another replica took this architecture meanwhile
                        upcoming = search.submit(self._prepare, round_index)
                        continue
                    # Generate the next candidate while this one trains, once anything has
                    # been trained: before that, the search could only morph the seed into a
                    # child trained from fresh weights, a trial wasted on a short run.
                    overlap = any(t.status == COMPLETED for t in self.store.summaries(self.run_id))
                    if overlap:
                        upcoming = search.submit(self._prepare, round_index + 1)
                    self._train(trial_id, job, upcoming)
                    if not overlap:
                        upcoming = search.submit(self._prepare, round_index + 1)
                    round_index += 1
            finally:
                upcoming.cancel()
        # A suggestion prepared but never trained must not stay pending in the TPE study.
        if upcoming.done() and not upcoming.cancelled() and upcoming.exception() is None:
            unused = upcoming.result()
            if unused.hpo_number is not None:
                self.hpo.tell(unused.hpo_number, None)

    def _refresh_history(self) -> list[Model]:
        """The run's history, read incrementally: new trials in full, then every status."""
        for rec in self.store.trials(self.run_id, after_id=self.last_trial_id):
            self.models[rec.id] = Model(rec.id, graph_json=rec.graph_json,
                                        content_hash=rec.graph_hash, status=rec.status)
            self.last_trial_id = max(self.last_trial_id, rec.id)
        history = []
        for summary in self.store.summaries(self.run_id):
            model = self.models.get(summary.id)
            if model is None:
                continue  # arrived after the read above
            model.status = summary.status
            model.accuracy = summary.search_accuracy if summary.status == COMPLETED else None
            history.append(model)
        return history

    def _prepare(self, round_index: int) -> Job:
        search = self.config.search
        if round_index >= search.hpo_start_round:
            s = self.hpo.ask()
            batch, kernel, number = s.batch_size, s.kernel_size, s.number
        else:
            batch, kernel, number = self.default_batch, min(search.kernel_sizes), None
        try:
            cand = self.searcher.next_candidate(self._refresh_history(), self.seed_graph,
                                                self.rng, kernel)
        except NoCandidate:
            if number is not None:
                self.hpo.tell(number, None)
            raise
        log.info("round %d: candidate from %s (%d morphs) in %.2f s, batch %d, kernel %d",
                 round_index, cand.parent_id, len(cand.morphs), cand.stats.get("seconds", 0.0),
                 batch, kernel)
        return Job(cand, round_index, batch, kernel, number)

    def _claim(self, job: Job) -> int | None:
        graph = job.candidate.graph
        hparams = {"batch_size": job.batch_size, "kernel_size": job.kernel_size,
                   "epochs": self.config.train.round_epochs(job.round),
                   "patience": self.config.train.patience(job.round),
                   "tpe_trial": job.hpo_number, "world_size": self.world,
                   "acquisition": job.candidate.acquisition,
                   "generation_s": job.candidate.stats.get("seconds"),
                   "candidate_wait_s": round(job.waited_s, 6)}
        trial_id = self.store.claim_trial(
            self.run_id, self.replica_id, self.index, graph.content_hash(), graph.to_json(None),
            job.candidate.parent_id, job.candidate.morphs, job.round, hparams, time.time(),
            self.config.run.lease_timeout_s)
        if trial_id is None and job.hpo_number is not None:
            self.hpo.tell(job.hpo_number, None)
        return trial_id

    def _train(self, trial_id: int, job: Job, upcoming: Future[Job]) -> None:
        folder = self.dir.trial(trial_id)
        folder.mkdir(parents=True, exist_ok=True)
        graph = job.candidate.graph
        write_atomic(folder / "graph.json", graph.to_json() + "\n")
        parent_graph = parent_weights = None
        if job.candidate.parent_id is not None:
            parent = self.store.trial(job.candidate.parent_id)
            parent_graph = json.loads(parent.graph_json)
            parent_weights = parent.weights_path
        cfg = self.config
        epochs = cfg.train.round_epochs(job.round)
        spec = TrialSpec.from_config(
            cfg.train, cfg.model.initial_weights, trial_id=trial_id, graph=graph.to_dict(),
            epochs=epochs, batch_size=job.batch_size, patience=cfg.train.patience(job.round),
            seed=cfg.run.seed * 1_000_003 + trial_id, parent_graph=parent_graph,
            parent_weights=parent_weights, weights_out=str(folder / "weights.safetensors"),
            round=job.round, horizon_epochs=cfg.train.max_epochs)
        sink = JsonlSink(folder / "log.jsonl")
        accuracies: list[float] = []

        def on_message(kind: str, msg: dict[str, Any]) -> None:
            if kind != "epoch":
                return
            event = EpochEvent(**msg)
            sink.epoch(event)
            self.store.record_epoch(EpochRecord(**{**msg, "trial_id": trial_id},
                                                run_id=self.run_id))
            accuracies.append(event.val_accuracy)
            log.info("trial %d epoch %d: val acc %.4f, %.3e ops, %.0f img/s", trial_id,
                     event.epoch, event.val_accuracy, event.ops, event.images_per_s)

        log.info("trial %d: training %d epochs at batch %d (round %d)", trial_id, epochs,
                 job.batch_size, job.round)
        outcome = run_trial(self.pool, spec, on_message, should_stop=self._should_stop)
        sink.trial(outcome)
        sink.close()
        predicted = None
        if job.round < cfg.search.hpo_start_round and accuracies:
            predicted = predict_final(accuracies, cfg.train.max_epochs)
        status = {"completed": COMPLETED, "stopped": STOPPED}.get(outcome.status, FAILED)
        # A trial cut short (deadline, crash) still has the epochs it reported, and the
        # weights saved at the best of them.
        best = max(accuracies) if accuracies else None
        saved = spec.weights_out
        weights = saved if accuracies and saved and Path(saved).exists() else None
        extra = {"early_stopped": outcome.early_stopped, "precision": outcome.precision,
                 "batch_size": outcome.batch_size,
                 "best_epoch": accuracies.index(max(accuracies)) if accuracies else None,
                 **outcome.extra}
        self.store.finish_trial(trial_id, status, time.time(), reason=outcome.reason,
                                best_accuracy=best, predicted_accuracy=predicted,
                                weights_path=weights, extra=extra)
        log.info("trial %d %s: best %s%s", trial_id, status,
                 "-" if best is None else f"{best:.4f}",
                 f" ({outcome.reason})" if outcome.reason else "")
        if job.hpo_number is not None:
            # The TPE objective is the measured accuracy; wait for an overlapping ask first.
            if not upcoming.done():
                upcoming.exception()
            self.hpo.tell(job.hpo_number, best if status == COMPLETED else None)
        self._note_failure(status, outcome.reason, outcome.extra.get("failure"))

    def _note_failure(self, status: str, reason: str, kind: str | None) -> None:
        """One failing architecture is the search's business; the same failure again and
        again means this replica cannot train at all, and it says so."""
        if status == COMPLETED:
            self.failures.clear()
        if status != FAILED:
            return
        self.failures.append(reason or "failed")
        limit = self.config.run.max_repeated_failures
        repeated = repeated_failure(self.failures, limit)
        if repeated is not None:
            fix = FIXES.get(kind or "", "see {log} for the traceback").format(log=self._log_name())
            raise CannotTrain(f"{limit} trials in a row failed with \"{repeated}\"; {fix}")


def wait_for_session(run_dir: Path, store_url: str | None, timeout_s: float,
                     poll_s: float = 1.0) -> bool:
    """Wait until the run directory is prepared and its current session is open: a site's
    launcher may start replicas before (or while) the primary sets the run up."""
    rd = RunDir(Path(run_dir))
    deadline = time.monotonic() + timeout_s
    store = None
    try:
        while True:
            if (rd.path / RUN_FILE).exists():
                if store is None:
                    store = open_store(rd.store_url(store_url), run_dir=rd.path)
                segments = store.segments(int(rd.meta()["run_id"]))
                if segments and segments[-1].ended_at is None and \
                        segments[-1].deadline_at > time.time():
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
    finally:
        if store is not None:
            store.close()


def run_worker(run_dir: Path, store_url: str | None, index: int | None, devices: int | None,
               threads: int | None, monitor: bool = True, wait_s: float = 0.0) -> int:
    """Entry point of ``automlperf worker``; identity from the launcher's environment when
    not given."""
    from automlperf.runner.identity import local_rank, replica_identity

    source = "--replica-index"
    if index is None:
        index, source = replica_identity()
        # One resource sampler per node: the first replica a launcher put there.
        monitor = monitor and local_rank() == 0
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s replica-{index} %(levelname)s %(message)s")
    log.info("replica %d (from %s) on %s%s", index, source, socket.gethostname(),
             ", sampling the node's resources" if monitor else "")
    if wait_s > 0 and not wait_for_session(run_dir, store_url, wait_s):
        log.error("no open session of a run in %s after %.0f s: start `automlperf run "
                  "--launcher external --run-dir %s` first", run_dir, wait_s, run_dir)
        return 1
    return Replica(run_dir, store_url, index, devices, threads, monitor).run()
