"""What every fault case of bench/bench_faults.py shares: the `automlperf` command of this
checkout, short run configurations, counting a run's records and verifying it."""

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


def records(run_dir: Path) -> int:
    """Trials and epochs the run's SQLite store holds (0 before it exists)."""
    if not (run_dir / "history.db").exists():
        return 0
    from automlperf.store import open_store

    store = open_store(run_dir=run_dir)
    try:
        return len(store.trials(1)) + len(store.epochs(1))
    except Exception:  # noqa: BLE001 - a store not yet set up holds nothing yet
        return 0
    finally:
        store.engine.dispose()


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
