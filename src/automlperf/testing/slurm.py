"""A real SLURM cluster of many slurmd daemons on this host, for tests and benchmarks.

Debian's slurm-wlm and munge (scripts/setup-system.sh) run one slurmctld and any number of
slurmd "nodes" on localhost, each on its own port with one CPU, all configured in a folder
of its own: enough to submit the job script `automlperf slurm` writes to dozens of nodes
whose job steps are light (simulated replicas, for instance)."""

from __future__ import annotations

import getpass
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from automlperf.runner.slurm import SlurmError

SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost={host}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
SlurmctldPort={ctld_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
FirstJobId={first_job}
"""
SLURM_NODE = ("NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 "
              "RealMemory={memory} State=UNKNOWN\n")
SBIN = "/usr/sbin/"


def start_slurm(base: Path, nodes: int, cluster: str, memory_mb: int = 8000,
                timeout_s: float = 300.0, slurmd_timeout_s: int | None = None,
                hidden: dict[str, list[Path]] | None = None,
                node_local: Path | None = None) -> dict[str, str]:
    """Start a cluster of ``nodes`` slurmd daemons (n1..nN) configured in ``base`` (an empty
    folder) and wait until every node is idle; the environment that points SLURM's commands
    at it. Stop it with :func:`stop_slurm`.

    ``slurmd_timeout_s`` is how soon the controller declares a silent node down (SLURM's
    default is 5 minutes). ``hidden`` gives nodes a view of the file system of their own:
    each listed folder appears empty to that node's slurmd and its job steps (a mount
    namespace with an empty folder bound over it; needs root), as a node that lacks a
    shared file system's data would see it. ``node_local`` (an existing folder) is each
    node's own disk: every node and its job steps see a folder of their own there
    (``base/local/<node>`` bound over it; needs root), as nodes with local scratch do."""
    for tool in ("slurmctld", "slurmd", "sbatch", "munge"):
        if shutil.which(tool) is None and not os.path.exists(SBIN + tool):
            raise SlurmError(f"{tool} is not installed (run scripts/setup-system.sh)")
    base = Path(base)
    (base / "state").mkdir(parents=True)
    host = socket.gethostname()
    names = [f"n{i}" for i in range(1, nodes + 1)]
    conf = base / "slurm.conf"
    extra = f"SlurmdTimeout={slurmd_timeout_s}\n" if slurmd_timeout_s else ""
    ports = daemon_ports(nodes + 1)
    ctld_port = ports.pop()
    # Job ids of their own: clusters side by side on this host (pytest-xdist workers) never
    # name the same job, which fail_node finds among all of the host's job steps.
    conf.write_text(SLURM_CONF.format(cluster=cluster, host=host, user=getpass.getuser(),
                                      dir=base, ctld_port=ctld_port,
                                      first_job=ctld_port * 1000) + extra
                    + "".join(SLURM_NODE.format(name=n, host=host, port=port,
                                                memory=memory_mb)
                              for n, port in zip(names, ports))
                    + f"PartitionName=debug Nodes={','.join(names)} Default=YES "
                      "MaxTime=INFINITE State=UP\n"
                    # A partition whose jobs last 5 minutes at most, as a site's short queue.
                    + f"PartitionName=short Nodes={','.join(names)} MaxTime=5 State=UP\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    _start_munge()
    subprocess.run([SBIN + "slurmctld", "-f", str(conf)], env=env, check=True)
    empty = base / "hidden"
    for node in names:
        cmd = [SBIN + "slurmd", "-f", str(conf), "-N", node]
        pairs = [(empty, f) for f in (hidden or {}).get(node, [])]
        if node_local is not None:
            own = base / "local" / node
            own.mkdir(parents=True)
            pairs.append((own, node_local))
        if pairs:
            empty.mkdir(exist_ok=True)
            binds = " && ".join(f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}"
                                for src, dst in pairs)
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f"{binds} && exec {shlex.join(cmd)}"]
        subprocess.run(cmd, env=env, check=True)
    deadline = time.monotonic() + timeout_s  # a guard: slurmd starts in seconds when idle
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                               text=True)
        if state.stdout.split() == ["idle"]:
            dead = [n for n in names if not _running(base / f"slurmd-{n}.pid")]
            if not dead:
                return env
            stop_slurm(env)
            raise SlurmError(f"slurmd of {', '.join(dead[:5])} ({len(dead)} of {nodes}) "
                             f"exited after it started: see {base}/slurmd-{dead[0]}.log")
        time.sleep(0.5)
    stop_slurm(env)
    raise SlurmError(f"the local SLURM cluster did not come up: {state.stdout} {state.stderr}; "
                     f"see {base}/slurmctld.log")


# Below Linux's ephemeral range (32768-60999): a port found free there can be taken by any
# outgoing connection before its daemon binds it, which 512 slurmd starting at once do.
PORTS = (10000, 32000)


def daemon_ports(count: int) -> list[int]:
    """``count`` ports free now, outside the range outgoing connections draw from; a random
    start, so that clusters started side by side (pytest-xdist workers) rarely meet."""
    found: list[int] = []
    port = random.randrange(PORTS[0], PORTS[1] - 2 * count)
    while len(found) < count:
        if port >= PORTS[1]:
            raise SlurmError(f"fewer than {count} free ports between {PORTS[0]} and {PORTS[1]}")
        with socket.socket() as s:
            try:
                s.bind(("", port))
                found.append(port)
            except OSError:
                pass
        port += 1
    return found


def _running(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _start_munge(timeout_s: float = 60.0) -> None:
    """This host's munge daemon, which every local cluster shares: started if it is not
    running (two clusters starting at once may both try; the second start is refused and
    changes nothing), then waited for until it answers."""
    def alive() -> bool:
        return subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0

    if alive():
        return
    subprocess.run(["/etc/init.d/munge", "start"], capture_output=True)
    deadline = time.monotonic() + timeout_s  # a guard: munged answers within a second
    while not alive():
        if time.monotonic() > deadline:
            raise SlurmError("munge does not answer (run scripts/setup-system.sh)")
        time.sleep(0.2)


def fail_node(env: dict[str, str], node: str) -> list[int]:
    """Fail ``node`` as a machine fails: its slurmd and every job step on it die at once
    (SIGKILL), the other nodes and the controller carry on; the controller finds it silent
    and marks it down after SlurmdTimeout. The process ids killed."""
    import psutil

    conf = Path(env["SLURM_CONF"])
    text = conf.read_text()
    found = re.search(r"^SlurmdPidFile=(.*)/slurmd-%n\.pid$", text, re.M)
    if found is None:
        raise SlurmError(f"{conf} is not a local cluster's configuration")
    base = Path(found.group(1))
    victims = [int((base / f"slurmd-{node}.pid").read_text().split()[0])]
    # A step's slurmstepd runs on every node of the step under one name ([job.step]): the one
    # on this node is the parent of the step's tasks that SLURM told they run on it, in a job
    # of this cluster (clusters side by side, pytest-xdist workers, name their nodes alike).
    jobs = set(subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,
                              text=True).stdout.split())
    for proc in psutil.process_iter(["cmdline"]):
        if not " ".join(proc.info["cmdline"] or []).startswith("slurmstepd:"):
            continue
        try:
            here = any(child.environ().get("SLURMD_NODENAME") == node
                       and child.environ().get("SLURM_JOB_ID") in jobs
                       for child in proc.children())
            if here:
                victims += [proc.pid] + [c.pid for c in proc.children(recursive=True)]
        except psutil.Error:  # ended meanwhile
            continue
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def kill_replica(run_dir: Path, index: int) -> list[int]:
    """Kill replica ``index`` of a run's job step as a crash on its node would (SIGKILL, it
    and everything it started), the step's other tasks left running. The process ids
    killed."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "worker" in cmd and str(run_dir) in cmd and cmd[-2:] == ["--replica-index", str(index)]:
            try:
                victims = [proc, *proc.children(recursive=True)]
            except psutil.Error:
                continue
            for victim in victims:
                try:
                    victim.kill()
                except psutil.Error:
                    pass
            return [v.pid for v in victims]
    raise SlurmError(f"no replica {index} of {run_dir} is running on this host")


def node_state(env: dict[str, str], node: str) -> str:
    """The controller's word for a node: idle, allocated, mixed, down*, ..."""
    done = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True,
                          text=True)
    return done.stdout.strip()


def stop_slurm(env: dict[str, str]) -> None:
    """Shut the cluster down (slurmctld and every slurmd)."""
    subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
