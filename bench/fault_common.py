"""What every fault case of bench/bench_faults.py shares: the `automlperf` command of this
checkout, short run configurations, accounting for a run's records on both sides and
verifying it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
Case = tuple[str, str, Callable[[Path], dict[str, Any]]]


def env() -> dict[str, str]:
    """The environment of a run: this checkout's sources first."""
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def automlperf(*args: Any) -> list[str]:
    return [sys.executable, "-m", "automlperf.cli", *map(str, args)]


def run(*args: Any, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(automlperf(*args), capture_output=True, text=True, env=env(),
                          timeout=timeout)


def start(*args: Any, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(automlperf(*args), stdout=out, stderr=subprocess.STDOUT,
                                env=env(), start_new_session=True)


def identities(store: Any, run_id: int = 1) -> set[tuple[Any, ...]]:
    """Every trial and epoch the store holds, by identity."""
    return ({("epoch", e.trial_id, e.epoch) for e in store.epochs(run_id)}
            | {("trial", t.id) for t in store.trials(run_id)})


def held(run_dir: Path) -> set[tuple[Any, ...]]:
    """Trials and epochs the run's SQLite store holds (none before it exists)."""
    if not (run_dir / "history.db").exists():
        return set()
    from automlperf.store import open_store

    store = open_store(run_dir=run_dir)
    try:
        return identities(store)
    except Exception:  # noqa: BLE001 - a store not yet set up holds nothing yet
        return set()
    finally:
        store.engine.dispose()


def records(run_dir: Path) -> int:
    return len(held(run_dir))


def account(run_dir: Path, store: Any = None, before: set[tuple[Any, ...]] | None = None,
            url: str | None = None) -> dict[str, Any]:
    """A run's records counted from both sides, the trial logs (written first) and the
    store (second), at the end: ``lost`` is what one side holds and the other does not
    (epochs, a trial's logged outcome, a trial folder the store has no trial for) plus what
    the store held at the fault (``before``) and no longer holds; ``duplicated`` is what
    either side holds twice. ``store`` is the run's, open; else it is opened (``url``, or the
    run directory's own), and a run without one holds nothing on either side."""
    from automlperf.store.opening import run_store

    if store is None:
        if not (run_dir / "run.json").exists():
            return account_of([], [], set(), before or set(), run_dir)
        with run_store(run_dir, url) as opened:
            return account(run_dir, opened, before)
    epochs, trials = store.epochs(1), store.trials(1)
    return account_of(epochs, trials, identities(store), before or set(), run_dir)


def account_of(epochs: list[Any], trials: list[Any], held: set[tuple[Any, ...]],
               before: set[tuple[Any, ...]], run_dir: Path) -> dict[str, Any]:
    from automlperf.store.ledger import compare, read_logs
    from automlperf.store.rundir import RunDir

    folders = run_dir / "trials"
    on_disk = {int(d.name) for d in folders.iterdir() if d.name.isdigit()} \
        if folders.is_dir() else set()
    stored_trials = {t.id for t in trials}
    logs = read_logs(RunDir(run_dir).trial, sorted(on_disk | stored_trials))
    both = compare(epochs, trials, logs)
    keys = [(e.trial_id, e.epoch) for e in epochs]
    hashes = [t.graph_hash for t in trials]
    orphans = {t for t in on_disk - stored_trials
               if (RunDir(run_dir).trial(t) / "graph.json").exists()}
    duplicated = (len(both.repeated) + len(keys) - len(set(keys))
                  + len(hashes) - len(set(hashes)))
    return {"records_before": len(before), "records_after": len(held),
            "epochs_logged": both.logged, "epochs_stored": len(keys),
            "lost": len(before - held) + both.lost + len(orphans),
            "lost_detail": {"since_fault": len(before - held),
                            "logged_not_stored": len(both.logged_only),
                            "stored_not_logged": len(both.stored_only),
                            "outcomes": len(both.outcomes), "trials_without_record": len(orphans)},
            "duplicated": duplicated}


def verdict(run_dir: Path, *store: str) -> str:
    if not (run_dir / "result.json").exists():
        return "n/a"
    done = run("check", run_dir, *store)
    if done.returncode == 0:
        return "pass"
    text = done.stdout + done.stderr
    named = [line for line in text.splitlines() if line.startswith(("mismatch:", "error:"))]
    return "FAIL: " + (named[0] if named else text.strip()[-200:])[:200]


def error_line(text: str) -> str:
    """The run's one error line, or its last line."""
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:160]


def tracebacks(text: str) -> int:
    return text.count("Traceback (most recent call last)")


def wait_for(condition: Callable[[], Any], limit: float, what: str) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {limit:.0f} s")


def folder_config(data_dir: Path, duration_s: float = 600, max_rounds: int | None = None,
                  workers: int = 1, **data: Any) -> str:
    """An ImageNet-layout folder trained small (the small seed at 32x32)."""
    run = {"duration_s": duration_s, "heartbeat_s": 1, "lease_timeout_s": 10}
    if max_rounds is not None:
        run["max_rounds"] = max_rounds
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items())
    return ("[run]\n" + "".join(f"{k} = {v!r}\n" for k, v in run.items())
            + f'[data]\ndataset = "imagenet"\ndata_dir = "{data_dir}"\nimage_size = 32\n'
            f"workers = {workers}\n{extra}"
            "[model]\nseed_model = \"resnet_small\"\n[train]\nmax_epochs = 4\nbatch_size = 16\n"
            "[search]\ntpe_startup_trials = 1\n[monitor]\ninterval_s = 1\n")
