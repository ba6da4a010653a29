"""The :class:`~automlperf.train.spec.Trainer` of real runs: a :class:`DevicePool` of
training processes, and a trial that runs out of memory tried again at half its batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from automlperf.config import DataConfig
from automlperf.events import EpochEvent, EventSink, FailureKind, TrialOutcome
from automlperf.train.pool import DevicePool, OnMessage, PoolError
from automlperf.train.spec import TrialSpec

def train_trial(pool: DevicePool, spec: TrialSpec, on_message: OnMessage | None = None,
                should_stop: Callable[[], bool] | None = None) -> TrialOutcome:
    """Run a trial; if it runs out of memory before finishing an epoch, retry it once at half
    the batch size (recorded in the outcome)."""
    pool.ensure_running(should_stop)
    outcome = pool.run(spec, on_message, should_stop)
    if (outcome.extra.get("failure") == FailureKind.OOM and outcome.epochs == 0
            and spec.batch_size // 2 >= pool.world):
        first = outcome.reason
        spec = TrialSpec.from_dict({**spec.to_dict(), "batch_size": spec.batch_size // 2})
        pool.ensure_running(should_stop)
        outcome = pool.run(spec, on_message, should_stop)
        outcome.extra["oom_retry"] = {"first_batch_size": spec.batch_size * 2, "reason": first}
    return outcome


class PoolTrainer:
    """The :class:`~automlperf.train.spec.Trainer` of real runs: a :class:`DevicePool` on
    ``devices``, started by :meth:`start`."""

    def __init__(self, devices: list[str], data: DataConfig, threads_per_rank: int = 1,
                 index_dir: str | None = None,
                 first_start: Callable[[], dict[str, Any]] | None = None,
                 cpu_binding: str = "auto") -> None:
        self.devices = list(devices)
        self.cpu_binding = cpu_binding
        self.data = data
        self.threads_per_rank = threads_per_rank
        self.index_dir = index_dir  # see DevicePool.index_dir
        self.first_start = first_start  # see DevicePool.first_start
        self.pool: DevicePool | None = None

    @property
    def world(self) -> int:
        return len(self.devices)

    def start(self) -> dict[str, Any]:
        self.pool = DevicePool(self.devices, self.data, threads_per_rank=self.threads_per_rank,
                               index_dir=self.index_dir, first_start=self.first_start,
                               cpu_binding=self.cpu_binding)
        return self.pool.description

    def _started(self) -> DevicePool:
        if self.pool is None:
            raise PoolError("the trainer has not been started")
        return self.pool

    def train(self, spec: TrialSpec, sink: EventSink,
              should_stop: Callable[[], bool] | None = None,
              on_progress: Callable[[dict[str, Any]], None] | None = None) -> TrialOutcome:
        """Train one trial (see :func:`train_trial`); ``on_progress`` gets rank 0's progress
        messages within an epoch."""
        def on_message(kind: str, msg: dict[str, Any]) -> None:
            if kind == "epoch":
                sink.epoch(EpochEvent(**msg))
            elif kind == "progress" and on_progress is not None:
                on_progress(msg)

        return train_trial(self._started(), spec, on_message, should_stop)

    def measure_again(self) -> dict[str, Any] | None:
        """``first_start``'s measurement again, by the training process that made it (see
        :meth:`DevicePool.measure_again`)."""
        return None if self.pool is None else self.pool.measure_again()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def kill(self) -> None:
        if self.pool is not None:
            self.pool.kill()
