"""Store faults for the hostile-conditions campaign: each case runs a short simulated run
through the real `automlperf run` command line, breaks its store mid-run, and reports what
happened. ``cases()`` lists them; ``python bench/fault_cases_store.py`` runs them all and
prints a table. The tests (tests/store/test_store_faults.py) run the same scenarios, smaller.

A case's function takes a fresh scratch directory and returns: happened (short text), exit
(the run's exit status), the run's records accounted for on both sides at the end
(fault_common.account: records_before and records_after in the store, epochs in the trial
logs and in the store, lost and duplicated from both sides), check (`automlperf check`:
pass, fail or n/a), detect_s (seconds from the fault to its detection or recovery)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from automlperf.store import open_store
from automlperf.store.pgserver import PostgresServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_common import account  # noqa: E402
from helpers import sim_config  # noqa: E402


def store_fault_config(rounds: int, lease_s: float, **run: Any) -> str:
    """Two simulated replicas whose epochs last a few seconds, a run ended by its rounds."""
    return sim_config(candidates=8, monitor_interval=2, ceiling_s=None, replicas=2,
                      lease_timeout_s=lease_s, stop_grace_s=10, max_rounds=rounds, **run)



def cli(*args: Any) -> list[str]:
    return [sys.executable, "-m", "automlperf.cli", *map(str, args)]


def start_run(run_dir: Path, config: Path, store: str | None, duration: str = "15m",
              env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    args = ["run", "--run-dir", run_dir, "--config", config, "--duration", duration]
    if store:
        args += ["--store", store]
    return subprocess.Popen(cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})


def resume(run_dir: Path, env: dict[str, str] | None = None,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli("run", "--resume", "--run-dir", run_dir), capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def records(url: str | None, run_dir: Path) -> tuple[set[tuple[int, int]], set[int]] | None:
    """The (trial, epoch) keys and trial ids recorded, or None while the store cannot say."""
    try:
        store = open_store(url, run_dir=run_dir)
    except Exception:  # noqa: BLE001 - not created yet, or out
        return None
    try:
        return ({(e.trial_id, e.epoch) for e in store.epochs(1)},
                {t.id for t in store.trials(1)})
    except Exception:  # noqa: BLE001 - not created yet, or out
        return None
    finally:
        store.close()


def wait_for(condition: Callable[[], Any], limit_s: float, what: str,
             proc: subprocess.Popen[str] | None = None) -> Any:
    """Poll ``condition`` until it is truthy; a generous limit only guards against a hang."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise RuntimeError(f"the run exited ({proc.returncode}) before {what}: {err[-2000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"no {what} within {limit_s:.0f} s")


def first_epoch(url: str | None, run_dir: Path,
                proc: subprocess.Popen[str]) -> tuple[set[tuple[int, int]], set[int]]:
    found: tuple[set[tuple[int, int]], set[int]] = wait_for(
        lambda: (r := records(url, run_dir)) and r[0] and r, 600, "first epoch", proc)
    return found


def check(run_dir: Path, url: str | None = None) -> str:
    done = subprocess.run(cli("check", run_dir, *(["--store", url] if url else [])),
                          capture_output=True, text=True, timeout=600)
    if done.returncode == 0 and "verified" in done.stdout:
        return "pass"
    print(f"check {run_dir}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}",
          file=sys.stderr)
    return "fail"


def count(found: tuple[set[tuple[int, int]], set[int]] | None) -> int:
    return 0 if found is None else len(found[0]) + len(found[1])


def ids(found: tuple[set[tuple[int, int]], set[int]]) -> set[tuple[Any, ...]]:
    """The records of :func:`records` by identity, as fault_common.account takes them."""
    return {("epoch", *key) for key in found[0]} | {("trial", t) for t in found[1]}


def private_server(scratch: Path) -> tuple[PostgresServer, str, str]:
    """A server of its own to break, outside pytest's folders (whose mode another session
    may reset while the server, as another account, starts); (server, url, its home)."""
    home = tempfile.mkdtemp(prefix="amp-fault-", dir=os.environ.get("AMP_FAULT_TMP"))
    server = PostgresServer(os.path.join(home, "pg"))
    server.start()
    return server, server.create_database("faults"), home


def stop_server(server: PostgresServer) -> None:
    """Stop the server now; ``server.start()`` brings it back on the same port."""
    server._run("pg_ctl", "-D", str(server.data), "-m", "fast", "-w", "stop")


def charged_and_silent(url: str, run_dir: Path) -> tuple[list[int], int]:
    """The trials a lease failed while their replica lived (the heartbeat's silence held
    against them), and the replicas that stopped because the primary fell silent."""
    store = open_store(url, run_dir=run_dir)
    try:
        charged = [t.id for t in store.trials(1) if "heart-beating" in t.reason]
    finally:
        store.close()
    silent = sum("has been silent" in p.read_text() for p in (run_dir / "logs").glob("replica-*"))
    return charged, silent


def pg_restarted(scratch: Path, outage_s: float = 30.0, lease_s: float = 20.0,
                 rounds: int = 4) -> dict[str, Any]:
    """The server stops after the first epoch for longer than a lease, and comes back on
    its port: the run rides it out, and no live replica's trial is failed for it."""
    server, url, home = private_server(scratch)
    try:
        config = scratch / "sim.toml"
        config.write_text(store_fault_config(rounds, lease_s))
        run_dir = scratch / "run"
        proc = start_run(run_dir, config, url)
        before = first_epoch(url, run_dir, proc)
        stop_server(server)
        time.sleep(outage_s)  # the fault itself: an outage this long
        server.start()
        back = time.monotonic()
        # Recovered: a record the run makes after the server is back.
        wait_for(lambda: count(records(url, run_dir)) > count(before), 600, "a new record",
                 proc)
        detect = time.monotonic() - back
        out, err = proc.communicate(timeout=900)
        charged, silent = charged_and_silent(url, run_dir)
        happened = (f"{outage_s:.0f} s outage ridden out; {len(charged)} trial(s) charged to "
                    f"live replicas, {silent} replica(s) stopped for the primary's silence")
        return {"happened": happened, "exit": proc.returncode,
                **account(run_dir, before=ids(before), url=url),
                "check": check(run_dir, url), "detect_s": round(detect, 1), "charged": len(charged),
                "silent": silent, "stderr": err}
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def pg_down(scratch: Path, retry_s: float = 10.0, rounds: int = 4) -> dict[str, Any]:
    """The server stops after the first epoch and stays down past the store's retry limit:
    one line naming the store, a non-zero exit, everything kept; once the server is back,
    --resume finishes the run."""
    server, url, home = private_server(scratch)
    env = {"AUTOMLPERF_STORE_RETRY_S": str(retry_s)}
    try:
        config = scratch / "sim.toml"
        config.write_text(store_fault_config(rounds, 600))
        run_dir = scratch / "run"
        proc = start_run(run_dir, config, url, env=env)
        before = first_epoch(url, run_dir, proc)
        stop_server(server)
        down = time.monotonic()
        out, err = proc.communicate(timeout=900)
        detect = time.monotonic() - down
        lines = [line for line in err.splitlines() if line.startswith(("error", "Traceback"))]
        server.start()
        # As a user resumes a run whose store has a password: through the environment.
        resumed = resume(run_dir, env={**env, "AUTOMLPERF_STORE_PASSWORD": server.password})
        happened = (f"exit {proc.returncode} with {len(lines)} error line(s): "
                    f"{lines[-1][:90] if lines else ''}; resume exit {resumed.returncode}"
                    + _recovered(resumed.stdout + resumed.stderr))
        return {"happened": happened, "exit": proc.returncode,
                **account(run_dir, before=ids(before), url=url),
                "check": check(run_dir, url), "detect_s": round(detect, 1), "stderr": err,
                "resume_exit": resumed.returncode, "resume_stderr": resumed.stderr}
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def service_pid(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "store-service.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def service_killed_and_stopped(scratch: Path, stop_s: float = 30.0, lease_s: float = 40.0,
                               rounds: int = 4) -> dict[str, Any]:
    """The run's store service (a PostgreSQL run's) is killed (kill -9) after the first
    epoch, and once the primary has started it again and the run has recorded more, stopped
    (SIGSTOP) for ``stop_s``: the replicas wait for it, nothing acknowledged is lost and no
    live replica's trial is failed for the silence."""
    server, url, home = private_server(scratch)
    try:
        config = scratch / "sim.toml"
        config.write_text(store_fault_config(rounds, lease_s))
        run_dir = scratch / "run"
        proc = start_run(run_dir, config, url)
        before = first_epoch(url, run_dir, proc)
        first = wait_for(lambda: service_pid(run_dir), 60, "the store service", proc)
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        again = wait_for(lambda: (p := service_pid(run_dir)) != first and p, 120,
                         "the store service started again", proc)
        middle = wait_for(lambda: (r := records(url, run_dir)) and count(r) > count(before)
                          and r, 600, "a record after the restart", proc)
        detect = time.monotonic() - killed
        os.kill(again, signal.SIGSTOP)
        time.sleep(stop_s)  # the fault itself: a stop this long
        os.kill(again, signal.SIGCONT)
        out, err = proc.communicate(timeout=900)
        charged, silent = charged_and_silent(url, run_dir)
        happened = (f"killed, started again in {detect:.0f} s; stopped {stop_s:.0f} s; "
                    f"{len(charged)} trial(s) charged to live replicas, {silent} replica(s) "
                    "stopped for the primary's silence")
        return {"happened": happened, "exit": proc.returncode,
                **account(run_dir, before=ids(before) | ids(middle), url=url),
                "check": check(run_dir, url), "detect_s": round(detect, 1),
                "charged": len(charged), "silent": silent, "stderr": err}
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def _recovered(text: str) -> str:
    """What the resumed run said it took back from the trial logs, if anything."""
    said = [line for line in text.splitlines() if "recovered from the trial logs" in line]
    return f" ({said[-1].split(': ', 1)[-1]} recovered from the logs)" if said else ""


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; the filler's path."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:  # the last partial megabyte
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def sqlite_full(scratch: Path, size_mb: int = 64, rounds: int = 4) -> dict[str, Any]:
    """The run directory (and its SQLite store) on a small file system that fills up after
    the first epoch: one line, nothing half-written, resumable once there is room."""
    if os.geteuid() != 0:
        return {"happened": "skipped: mounting a tmpfs needs root", "exit": 0,
                "records_before": 0, "records_after": 0, "lost": 0, "check": "n/a",
                "detect_s": None}
    mount = Path(tempfile.mkdtemp(prefix="amp-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)],
                   check=True)
    try:
        config = scratch / "sim.toml"
        config.write_text(store_fault_config(rounds, 600))
        run_dir = mount / "run"
        proc = start_run(run_dir, config, None)
        before = first_epoch(None, run_dir, proc)
        filler = fill(mount)
        full = time.monotonic()
        out, err = proc.communicate(timeout=900)
        detect = time.monotonic() - full
        lines = [line for line in err.splitlines() if line.startswith(("error", "Traceback"))]
        half = [str(p) for p in run_dir.rglob("*.tmp*")]
        filler.unlink()
        resumed = resume(run_dir)
        happened = (f"exit {proc.returncode} with {len(lines)} error line(s): "
                    f"{lines[-1][:90] if lines else ''}; {len(half)} half-written file(s); "
                    f"resume exit {resumed.returncode}" + _recovered(resumed.stdout + resumed.stderr))
        return {"happened": happened, "exit": proc.returncode,
                **account(run_dir, before=ids(before)),
                "check": check(run_dir), "detect_s": round(detect, 1), "stderr": err,
                "half_written": half, "resume_exit": resumed.returncode,
                "resume_stderr": resumed.stderr}
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


def cases() -> list[tuple[str, str, Callable[[Path], dict[str, Any]]]]:
    return [
        ("pg restarted after a 30 s outage",
         "replicas and primary wait; no live trial failed; check passes", pg_restarted),
        ("store service killed (kill -9), then stopped 30 s (SIGSTOP)",
         "started again by the primary; replicas wait; nothing lost, no live trial failed",
         service_killed_and_stopped),
        ("pg down past the retry limit, then --resume",
         "one line naming the store, exit 75 (resumable); resume finishes", pg_down),
        ("SQLite on a full disk, then --resume",
         "one line, exit 75 (resumable), nothing half-written; resume finishes", sqlite_full),
    ]


def main() -> None:
    rows = []
    for name, expected, run in cases():
        scratch = Path(tempfile.mkdtemp(prefix="amp-case-"))
        t0 = time.monotonic()
        try:
            found = run(scratch)
        except Exception as exc:  # noqa: BLE001 - a case that breaks is a row too
            found = {"happened": f"case error: {type(exc).__name__}: {exc}"[:200], "exit": -1,
                     "records_before": "-", "records_after": "-", "lost": "-",
                     "duplicated": "-", "check": "n/a", "detect_s": None}
        rows.append((name, expected, found, time.monotonic() - t0))
        shutil.rmtree(scratch, ignore_errors=True)
    print("| fault | expected | happened | exit | before | after | lost | duplicated | check |"
          " detect s | case s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, expected, f, took in rows:
        print(f"| {name} | {expected} | {f['happened']} | {f['exit']} | {f['records_before']} "
              f"| {f['records_after']} | {f['lost']} | {f['duplicated']} | {f['check']} "
              f"| {f['detect_s']} | {took:.0f} |")


if __name__ == "__main__":
    main()
