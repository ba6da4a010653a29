"""TPE over the global batch size and the kernel size of deepen blocks (Optuna).

Each replica keeps one study, so it persists across trials and across a resumed run: a fresh
sampler per trial would degenerate into random search. The study is an Optuna journal, a file
of its own in the run directory (``tpe/replica-<index>.journal``): asking and telling append
to it, and no database connection is opened for it, however many replicas run. A URL keeps
the study in that database instead (Optuna's RDBStorage), as runs before the journals did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Suggestion:
    number: int  # the Optuna trial number, to report the result against
    batch_size: int
    kernel_size: int


def batch_range(default: int, factors: tuple[float, float], multiple: int) -> tuple[int, int]:
    """TPE's batch size range around ``default``, in multiples of the rank count."""
    lo = max(multiple, int(default * factors[0]) // multiple * multiple)
    hi = max(lo, int(default * factors[1]) // multiple * multiple)
    return lo, hi


def _engine_kwargs(storage_url: str) -> dict[str, object]:
    """SQLite waits for its lock. On a server, the study connects only while it asks or
    tells (once per trial), and holds no connection between: a run of many replicas then
    needs one connection each for its studies at most, not one each all the time."""
    if storage_url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}
    from sqlalchemy.pool import NullPool

    return {"poolclass": NullPool}


def _storage(where: str | Path) -> Any:
    import optuna

    if isinstance(where, Path) or "://" not in where:
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = Path(where)
        path.parent.mkdir(parents=True, exist_ok=True)
        # One writer per file (its replica): the lock is never contended. An open()-based
        # lock works on the parallel file systems whose symlinks are not atomic.
        return optuna.storages.JournalStorage(
            JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
    return optuna.storages.RDBStorage(where, engine_kwargs=_engine_kwargs(where))


def prepare_storage(storage_url: str) -> None:
    """Create Optuna's tables once, before replicas race to (PostgreSQL refuses two
    concurrent CREATE TYPE of the same name)."""
    import optuna

    storage = optuna.storages.RDBStorage(storage_url, engine_kwargs=_engine_kwargs(storage_url))
    storage.engine.dispose()


def journal_path(run_dir: Path, replica_index: int) -> Path:
    """Where a replica's study is kept in its run directory."""
    return run_dir / "tpe" / f"replica-{replica_index}.journal"


class HyperSearch:
    """A replica's TPE study in ``storage``: a journal file's path, or a database URL. The
    study is opened when first asked (a run without HPO never opens it)."""

    def __init__(self, storage: str | Path, study_name: str, batch_bounds: tuple[int, int],
                 kernel_sizes: Sequence[int], multiple: int = 1, seed: int = 0,
                 startup_trials: int = 4) -> None:
        self.storage = storage
        self.study_name = study_name
        self.seed = seed
        self.startup_trials = startup_trials
        self.lo, self.hi = batch_bounds
        self.kernel_sizes = list(kernel_sizes)
        self.multiple = multiple
        self._study: Any = None

    @property
    def study(self) -> Any:
        if self._study is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            # Optuna 5 turned multivariate and constant-liar on by default; state what we
            # rely on: joint modelling of the two parameters, and pending trials counted as
            # likely poor so that a replica's overlapping asks do not repeat themselves.
            sampler = optuna.samplers.TPESampler(seed=self.seed,
                                                 n_startup_trials=self.startup_trials,
                                                 multivariate=True, constant_liar=True)
            self._study = optuna.create_study(study_name=self.study_name,
                                              storage=_storage(self.storage), sampler=sampler,
                                              direction="maximize", load_if_exists=True)
        return self._study

    def ask(self, kernel: int | None = None) -> Suggestion:
        """A suggestion; with ``kernel``, the batch size alone is searched (an architecture
        already generated has its kernel sizes)."""
        trial = self.study.ask()
        raw = trial.suggest_int("batch_size", self.lo, self.hi, log=True)
        batch = max(self.multiple, round(raw / self.multiple) * self.multiple)
        if kernel is None:
            kernel = int(trial.suggest_categorical("kernel_size", self.kernel_sizes))
        return Suggestion(trial.number, batch, kernel)

    def observe(self, batch_size: int, accuracy: float) -> None:
        """Tell the study of a training it did not suggest (a child trained at its parent's
        batch size), so that its model of the batch size learns from it too."""
        import optuna

        if not math.isfinite(accuracy):
            return
        batch = min(self.hi, max(self.lo, batch_size))
        self.study.add_trial(optuna.trial.create_trial(
            params={"batch_size": batch},
            distributions={"batch_size": optuna.distributions.IntDistribution(
                self.lo, self.hi, log=True)},
            value=accuracy))

    def tell(self, number: int, accuracy: float | None) -> None:
        """Report the measured accuracy (None: the trial failed)."""
        import optuna

        if accuracy is None or not math.isfinite(accuracy):
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(number, accuracy)
