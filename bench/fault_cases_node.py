"""Node and resource faults injected into real runs, for the fault campaign.

``cases()`` lists (fault, expected behaviour, function). Each function takes a fresh scratch
directory, runs the fault through the real command line (``automlperf slurm`` on a local
SLURM cluster of slurmd daemons for the node faults, ``automlperf run`` for the resource
faults) and returns what happened: ``happened``, ``exit`` (the run's exit status), the run's
records accounted for on both sides at the end (fault_common.account: ``records_before`` /
``records_after`` in the store, epochs in the trial logs and in the store, ``lost`` and
``duplicated`` counted from both sides), ``check`` (``automlperf check RUN_DIR``: pass, fail
or n/a) and ``detect_s`` (fault to detection).

Two faults come from the kernel and the primary itself: the kernel's OOM killer, in a
memory cgroup of the run's own (cgroup v2 where the unified hierarchy holds the memory
controller, else v1's memory controller), and a primary frozen with SIGSTOP, killed once its
replicas have stopped by themselves, then resumed to its deadline.

Faults are injected once the store shows the condition they need (a replica holding a trial
with an epoch done), never after some wall time. The resource faults that change mounts run
in a private mount namespace (``unshare -m``, as root), so nothing outside the run sees them.

Run through the campaign: python bench/bench_faults.py [--only NAME]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # imagefolder, helpers
sys.path.insert(0, str(HERE))

from fault_common import account, held, identities  # noqa: E402
from helpers import KERNEL_OOM_CONFIG, OOM_CONFIG, MemoryCgroup, sim_config  # noqa: E402

LEASE_S = 10


def _cli(*args: Any) -> list[str]:
    return [sys.executable, "-m", "automlperf.cli", *map(str, args)]


def node_fault_config(lease_s: float = LEASE_S) -> str:
    """Simulated devices slow enough that a trial lasts several seconds of a small seed on
    the digits; the run ends at its deadline."""
    return sim_config(max_epochs=4, lease_timeout_s=lease_s, stop_grace_s=10)



def wait_for(probe: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """The first true value of ``probe``; the limit only guards against a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = probe()
        except Exception:  # noqa: BLE001 - the run has not created its store yet
            found = None
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


records = identities


def check(run_dir: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(_cli("check", run_dir), capture_output=True, text=True, env=env,
                          timeout=600)
    return "pass" if done.returncode == 0 else "fail"


# --- node faults: a simulated run on a local SLURM cluster ---------------------------------

@contextmanager
def slurm_cluster(base: Path, nodes: int) -> Iterator[dict[str, str]]:
    from automlperf.testing.slurm import start_slurm, stop_slurm

    env = start_slurm(base, nodes, f"fault{os.getpid() % 10000}")
    try:
        yield env
    finally:
        stop_slurm(env)


def submit(scratch: Path, env: dict[str, str], nodes: int, duration: str) -> tuple[str, Path]:
    (scratch / "sim.toml").write_text(node_fault_config())
    run_dir = scratch / "run"
    done = subprocess.run(_cli("slurm", "--nodes", nodes, "--duration", duration, "--run-dir",
                               run_dir, "--config", scratch / "sim.toml", "--submit"),
                          capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    job = re.search(r"submitted job (\d+)", done.stdout)
    assert job is not None, done.stdout
    return job.group(1), run_dir


def wait_job(job: str, env: dict[str, str], timeout: float = 1200) -> str:
    def gone() -> bool:
        queue = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                               text=True)
        return queue.returncode == 0 and not queue.stdout.strip()

    wait_for(gone, timeout, f"job {job} to end", every=1)
    state = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=env,
                           capture_output=True, text=True).stdout
    found = re.search(r"JobState=(\S+)", state)
    return found.group(1) if found else "unknown"


def job_status(run_dir: Path) -> int:
    """The primary's exit status, from the job's output."""
    out = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    found = re.search(r"automlperf primary finished with status (\d+)", out)
    return int(found.group(1)) if found else -1


def running_trial(store: Any, replica: int) -> Any:
    """Replica ``replica``'s trial, once it is running and has an epoch recorded."""
    return next((t for t in store.trials(1) if t.replica_index == replica
                 and t.status == "running" and t.epochs_done >= 1), None)


def held_mid_trial(store: Any, pid: int) -> Any:
    """Replica ``pid`` held (SIGSTOP) while it runs a trial with an epoch done, so that the
    trial cannot finish between the look and the fault; released when it is between trials."""
    os.kill(pid, signal.SIGSTOP)
    trial = running_trial(store, 0)
    if trial is None:
        os.kill(pid, signal.SIGCONT)
    return trial


def node_fault(scratch: Path, nodes: int, duration: str,
               inject: Callable[[str, dict[str, str], Any, Any, int], dict[str, Any]]
               ) -> dict[str, Any]:
    """Submit a simulated run, wait until replica 0 holds a trial with an epoch done, call
    ``inject(job, env, store, trial)``, wait for the job, and measure."""
    from automlperf.store.opening import run_store

    with slurm_cluster(scratch / "slurm", nodes) as env:
        job, run_dir = submit(scratch, env, nodes, duration)
        wait_for(lambda: (run_dir / "postgres" / "pgdata" / "postmaster.pid").exists()
                 and (run_dir / "run.json").exists(), 600, "the run to start")
        with run_store(run_dir) as store:
            wait_for(lambda: running_trial(store, 0), 600, "replica 0 mid-trial")
            pid = next(r.pid for r in store.replicas(1) if r.index == 0)
            trial = wait_for(lambda: held_mid_trial(store, pid), 600, "replica 0 held mid-trial")
            before = records(store)
            seen = inject(job, env, store, trial, pid)
            state = wait_job(job, env)
        with run_store(run_dir) as store:
            counted = account(run_dir, store, before)
            final = store.trial(trial.id)
            seen["failed_trials"] = sum(t.status == "failed" for t in store.trials(1))
        seen["happened"] += f"; job {state}, trial {trial.id} {final.status}"
        return {**seen, "exit": job_status(run_dir), **counted, "check": check(run_dir)}


def _failed_at(store: Any, trial_id: int, since: float) -> float:
    wait_for(lambda: store.trial(trial_id).status != "running", 600,
             f"trial {trial_id} to end")
    return round(time.time() - since, 1)


def killed_replica(scratch: Path) -> dict[str, Any]:
    def inject(job: str, env: dict[str, str], store: Any, trial: Any, pid: int) -> dict[str, Any]:
        from automlperf.testing.slurm import kill_replica

        at = time.time()
        killed = kill_replica(scratch / "run", 0)  # where submit() puts it
        return {"happened": f"replica 0 killed ({len(killed)} processes)",
                "detect_s": _failed_at(store, trial.id, at)}

    return node_fault(scratch, 3, "100s", inject)


def sigstop_forever(scratch: Path) -> dict[str, Any]:
    def inject(job: str, env: dict[str, str], store: Any, trial: Any, pid: int) -> dict[str, Any]:
        at = time.time()  # held since just now, and never continued
        return {"happened": f"replica 0 (pid {pid}) stopped",
                "detect_s": _failed_at(store, trial.id, at), "frozen": pid}

    got = node_fault(scratch, 3, "100s", inject)
    frozen = got.pop("frozen")
    got["happened"] += "; frozen process " + ("gone" if not _alive(frozen) else "LEFT")
    return got


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def heartbeats_lost_briefly(scratch: Path) -> dict[str, Any]:
    pause = LEASE_S / 2

    def inject(job: str, env: dict[str, str], store: Any, trial: Any, pid: int) -> dict[str, Any]:
        time.sleep(pause)  # the fault itself: silent for less than the lease
        os.kill(pid, signal.SIGCONT)
        return {"happened": f"replica 0 silent {pause:.0f} s (lease {LEASE_S} s)",
                "detect_s": None}

    got = node_fault(scratch, 2, "60s", inject)
    got["happened"] += f"; {got.pop('failed_trials')} trials failed"
    return got


# --- resource faults: real training on an image folder ---------------------------------------

def photos(scratch: Path) -> Path:
    from imagefolder import make_image_folder

    root = scratch / "photos"
    make_image_folder(root, classes=4, train_per_class=12, val_per_class=4, corrupt=2)
    return root


def folder_run_config(scratch: Path, **run: Any) -> Path:
    from helpers import folder_config

    path = scratch / "run.toml"
    path.write_text(folder_config(photos(scratch), workers=1, image_size=32, **run))
    return path


def namespaced(mounts: list[tuple[str, str]], *command: Any) -> subprocess.CompletedProcess[str]:
    """``command`` run in a private mount namespace with a small tmpfs at each (size, path),
    so that nothing outside it sees them."""
    setup = " && ".join(f"mount -t tmpfs -o size={size} tmpfs {path}" for size, path in mounts)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f'{setup} && exec "$@"', "sh", *map(str, command)],
                          capture_output=True, text=True, timeout=900)


def small_shm(scratch: Path, size: str = "256k") -> dict[str, Any]:
    """/dev/shm far smaller than the loader's budget, from the start."""
    config = folder_run_config(scratch, duration_s=300, max_rounds=3)
    run_dir = scratch / "run"
    done = namespaced([(size, "/dev/shm")], *_cli("run", "--config", config, "--run-dir", run_dir))
    code, err = done.returncode, done.stderr
    log = (run_dir / "logs" / "replica-0.log").read_text()
    warned = [line for line in (err + log).splitlines() if "/dev/shm has" in line]
    clean = "Traceback" not in err and "Traceback" not in log
    said = err.strip().splitlines()[-1] if code and err.strip() else \
        (warned[0].split(" WARNING ")[-1] if warned else "no warning")
    return {"happened": f"/dev/shm {size}: {said[:220]}" + ("" if clean else "; TRACEBACK"),
            "exit": code, **account(run_dir),
            "check": check(run_dir) if (run_dir / "result.json").exists() else "n/a",
            "detect_s": None}


def tiny_shm(scratch: Path) -> dict[str, Any]:
    """/dev/shm that cannot hold one batch: the run stops in one line."""
    return small_shm(scratch, "32k")


def host_oom(scratch: Path) -> dict[str, Any]:
    """Every trial needs more host memory than a 6 GiB address-space limit allows."""
    import resource

    (scratch / "oom.toml").write_text(OOM_CONFIG)
    run_dir = scratch / "run"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))

    done = subprocess.run(_cli("run", "--config", scratch / "oom.toml", "--run-dir", run_dir),
                          capture_output=True, text=True, timeout=900, preexec_fn=limit)
    trials, counted, line, detect_s = _oom_outcome(run_dir, done)
    return {"happened": f"{len(trials)} trials {sorted({t.status for t in trials})}, kinds "
                        f"{sorted({t.reason.split(':')[0] for t in trials})}; last line: {line[:160]}"
                        + ("; TRACEBACK" if "Traceback" in done.stderr else ""),
            "exit": done.returncode, **counted, "check": check(run_dir),
            "detect_s": detect_s}


def _oom_outcome(run_dir: Path, done: subprocess.CompletedProcess[str]
                 ) -> tuple[list[Any], dict[str, Any], str, float | None]:
    """What a run whose trials ran out of memory left: its trials, its records counted from
    both sides, the last line it printed, and seconds from its first trial to that trial's
    end."""
    from automlperf.store import open_store

    store = open_store(run_dir=run_dir)
    trials = store.trials(1)
    counted = account(run_dir, store)
    store.close()
    line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    first = trials[0] if trials else None
    return (trials, counted, line,
            round(first.finished_at - first.created_at, 1) if first else None)


def kernel_oom(scratch: Path) -> dict[str, Any]:
    """The run in a memory cgroup of 1.5 GiB, as a batch job's limit, whose trials need far
    more: the kernel's OOM killer ends the training process (signal 9), the trial is an oom
    failure retried at half the batch, and three alike stop the run in one line."""
    group, why = MemoryCgroup.make(1536 << 20)
    if group is None:
        return {"happened": f"not run: {why}", "exit": "-", "check": "n/a", "detect_s": None}
    (scratch / "oom.toml").write_text(KERNEL_OOM_CONFIG)
    run_dir = scratch / "run"
    try:
        done = subprocess.run(_cli("run", "--config", scratch / "oom.toml", "--run-dir", run_dir),
                              capture_output=True, text=True, timeout=1800,
                              preexec_fn=group.enter)
        kills = group.kills()
    finally:
        group.remove()
    trials, counted, line, detect_s = _oom_outcome(run_dir, done)
    killed = sum(bool(t.extra.get("oom_kill")) for t in trials)
    return {"happened": f"{group.kind}, 1.5 GiB: {kills} OOM kill(s) counted; {len(trials)} "
                        f"trials {sorted({t.status for t in trials})}, kinds "
                        f"{sorted({t.reason.split(':')[0] for t in trials})}, {killed} told an "
                        f"OOM kill; last line: {line[:40]} … {line[-150:]}"
                        + ("; TRACEBACK" if "Traceback" in done.stderr else ""),
            "exit": done.returncode, **counted, "check": check(run_dir),
            "detect_s": detect_s}


def frozen_primary(scratch: Path, duration_s: float = 120) -> dict[str, Any]:
    """The primary frozen (SIGSTOP) once both replicas are up and an epoch is recorded (the
    replicas held meanwhile, so that both have rounds left): they stop by themselves after
    a lease without its heartbeat; the primary is killed, and --resume continues the run to
    its deadline."""

    (scratch / "sim.toml").write_text(sim_config(replicas=2, lease_timeout_s=LEASE_S,
                                                 duration_s=duration_s, max_epochs=4))
    run_dir = scratch / "run"
    log = open(scratch / "primary.log", "wb")
    primary = subprocess.Popen(_cli("run", "--config", scratch / "sim.toml", "--run-dir", run_dir),
                               stdout=log, stderr=subprocess.STDOUT)
    store = wait_for(lambda: _up_with_an_epoch(run_dir), 600, "both replicas and an epoch")
    try:
        replicas = store.replicas(1)
        for r in replicas:
            os.killpg(r.pid, signal.SIGSTOP)
        before = records(store)
        primary.send_signal(signal.SIGSTOP)
        at = time.time()
        for r in replicas:
            os.killpg(r.pid, signal.SIGCONT)
        wait_for(lambda: all(_gone(r.pid) for r in replicas), 600, "the replicas to stop")
        detect = round(time.time() - at, 1)
        said = sum("the primary has been silent" in (run_dir / "logs" / f"replica-{r.index}.log")
                   .read_text() for r in replicas)
        primary.send_signal(signal.SIGKILL)
        primary.wait()
        resumed = subprocess.run(_cli("run", "--resume", "--run-dir", run_dir),
                                 capture_output=True, text=True, timeout=1800)
        segments = store.segments(1)
        counted = account(run_dir, store, before)
    finally:
        store.close()
        log.close()
    deadline = segments[-1].ended_at is not None and \
        segments[-1].ended_at >= segments[-1].deadline_at - 1
    return {"happened": f"primary frozen; {said} of {len(replicas)} replicas stopped for its "
                        f"silence; killed; resume exit {resumed.returncode}, "
                        f"{len(segments)} sessions, "
                        + ("ran to its deadline" if deadline else "ended BEFORE its deadline")
                        + ("; TRACEBACK" if "Traceback" in resumed.stderr else ""),
            "exit": resumed.returncode, **counted, "check": check(run_dir), "detect_s": detect}


def _up_with_an_epoch(run_dir: Path) -> Any:
    """The run's store, once both replicas are registered and one recorded an epoch."""
    from automlperf.store import open_store

    if not (run_dir / "history.db").exists():
        return None
    store = open_store(run_dir=run_dir)
    if len(store.replicas(1)) == 2 and store.epochs(1):
        return store
    store.close()
    return None


def _gone(pid: int) -> bool:
    """Exited (a zombie, while its frozen parent cannot reap it, counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@contextmanager
def ext4(scratch: Path, size: str = "256M") -> Iterator[Path]:
    """A small ext4 file system of this case's own, on a loop device (as root), mounted with
    errors=remount-ro: :func:`turn_read_only` makes the kernel turn it read-only under the
    open files, as after a disk error. Unmounted afterwards."""
    image, mount = scratch / "fs.img", scratch / "mnt"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    mount.mkdir()
    remount(image, mount)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def remount(image: Path, mount: Path) -> None:
    subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mount)], check=True)


def turn_read_only(mount: Path) -> None:
    """An ext4 error on the file system at ``mount``, which errors=remount-ro answers by
    making it read-only at once (writes then fail with EROFS). ``mount -o remount,ro`` would
    refuse while the run holds files open for writing."""
    device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(mount)], capture_output=True,
                            text=True, check=True).stdout.strip()
    Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text("fault campaign\n")


def read_only_run_dir(scratch: Path) -> dict[str, Any]:
    """The file system holding the run directory turns read-only once an epoch is recorded;
    mounted again, writable, the run is resumed and verified."""
    config = folder_run_config(scratch, duration_s=60)
    with ext4(scratch) as mount:
        run_dir = mount / "run"
        with open(scratch / "run.err", "w") as log:
            proc = subprocess.Popen(_cli("run", "--config", config, "--run-dir", run_dir),
                                    stdout=subprocess.DEVNULL, stderr=log)
        wait_for(lambda: any(kind == "epoch" for kind, *_ in held(run_dir)), 600, "an epoch")
        before = held(run_dir)
        at = time.time()
        turn_read_only(mount)
        code = proc.wait(timeout=900)
        detect = round(time.time() - at, 1)  # the run's own end, which is its detection
        subprocess.run(["umount", str(mount)], check=True)
        remount(scratch / "fs.img", mount)
        resumed = subprocess.run(_cli("run", "--resume", "--run-dir", run_dir),
                                 capture_output=True, text=True, timeout=900)
        verified = check(run_dir)
        counted = account(run_dir, before=before)
    err = (scratch / "run.err").read_text()
    lines = err.strip().splitlines()
    return {"happened": f"last line: {lines[-1][:200] if lines else ''}"
                        + ("; TRACEBACK" if "Traceback" in err else "")
                        + f"; mounted again and resumed: exit {resumed.returncode}"
                        + (f" ({resumed.stderr.strip().splitlines()[-1][:200]})"
                           if resumed.returncode and resumed.stderr.strip() else ""),
            "exit": code, **counted, "check": verified, "detect_s": detect}


def cases() -> list[tuple[str, str, Callable[[Path], dict[str, Any]]]]:
    return [
        ("replica killed", "trial failed, others go on, run verifies", killed_replica),
        ("SIGSTOP forever", "lease expires, trial failed, run ends and verifies", sigstop_forever),
        ("heartbeats lost < lease", "nothing failed", heartbeats_lost_briefly),
        ("small /dev/shm", "carries on, one-line warning", small_shm),
        ("tiny /dev/shm", "stops, one-line error", tiny_shm),
        ("host OOM (address-space limit)", "trials fail as oom, run ends in one line",
         host_oom),
        ("kernel OOM killer (memory cgroup)",
         "killed ranks are oom failures, retried smaller; run ends in one line with the advice",
         kernel_oom),
        ("read-only run dir", "one-line error, exit 1, nothing lost", read_only_run_dir),
        ("primary frozen (SIGSTOP), killed, --resume",
         "replicas stop by themselves; resume runs to the deadline and verifies",
         frozen_primary),
    ]

