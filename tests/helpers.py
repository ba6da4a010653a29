"""Helpers shared by the end-to-end tests."""

import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from automlperf.graph import INPUT, Graph, seeds
from automlperf.graph.graph import conv, dense, simple
from automlperf.store import Claim, EpochRecord
from automlperf.train.spec import TrialSpec

# The suite lives in package folders; these name its root and the repository's.
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

MARK = "AUTOMLPERF_TEST_MARK"


# Commands whose verdict or table many tests want, run in the test's own interpreter: the same
# command's parser and code, without a new interpreter's imports (about 0.6 CPU-s each, 71
# times a suite). tests/cli runs the console script itself, and `cli(..., env=...)` always
# starts a new interpreter.
IN_PROCESS = {"check", "compare", "list"}


def cli(*args, env=None, timeout=600):
    """Run the automlperf command line as a user would, in a fresh interpreter (a command of
    ``IN_PROCESS`` in this one, its exit status and output kept apart as a process's)."""
    argv = [str(a) for a in args]
    if env is None and argv and argv[0] in IN_PROCESS:
        return cli_here(argv)
    return subprocess.run([sys.executable, "-m", "automlperf.cli", *argv],
                          capture_output=True, text=True, timeout=timeout, env=env)


def cli_here(argv):
    """The command line in this interpreter, as a finished process: an exception the command
    did not turn into its exit status is raised here, where a process would print it."""
    from typer.testing import CliRunner

    from automlperf.cli import app

    done = CliRunner().invoke(app, argv, catch_exceptions=False)
    return subprocess.CompletedProcess([sys.executable, "-m", "automlperf.cli", *argv],
                                       done.exit_code, done.stdout, done.stderr)


def cli_args(*args):
    return [sys.executable, "-m", "automlperf.cli", *map(str, args)]


def data_section(dataset, **settings):
    """The data section of a dataset's preset (its image size, ...), ``settings`` on top: what
    a run's ranks load."""
    from automlperf.config import Config

    return Config.for_dataset(dataset, {"data": settings}).data


def sim_config(sustained_ops=2e10, max_epochs=2, candidates=16, monitor_interval=5,
               ceiling_s=0.3, time_compression=1.0, image_folders=False, data_dir=None,
               **run) -> str:
    """A run of simulated devices on the small digits, with ``run`` settings: at the default
    rate an epoch of the small seed lasts a few seconds (its operations counted, as always).
    With ``image_folders``, on an ImageNet-layout tree at 32x32 instead (``data_dir``, or
    the one the command line gives)."""
    settings = {"accelerator": "simulated", "heartbeat_s": 1, **run}
    lines = ["[run]"] + [f"{k} = {v!r}" for k, v in settings.items()]
    monitor = f"interval_s = {monitor_interval}\n"
    if ceiling_s is not None:
        monitor += f"ceiling_s = {ceiling_s}\n"
    data = 'dataset = "digits"'
    if image_folders:
        data = 'dataset = "imagenet"\nimage_size = 32'
        if data_dir is not None:
            data += f'\ndata_dir = "{data_dir}"'
    return "\n".join(lines) + f"""
[data]
{data}
[train]
max_epochs = {max_epochs}
batch_size = 64
[search]
tpe_startup_trials = 1
candidates_per_generation = {candidates}
[monitor]
{monitor}[simulation]
sustained_ops = {sustained_ops!r}
time_compression = {time_compression!r}
"""


# Every trial needs more host memory than a 6 GiB address-space limit allows.
OOM_CONFIG = """
[run]
duration_s = 900
heartbeat_s = 1
lease_timeout_s = 6
[data]
dataset = "synthetic"
image_size = 128
synthetic_images = 4096
synthetic_classes = 10
[model]
seed_model = "resnet_small"
[train]
max_epochs = 2
batch_size = 4096
[monitor]
ceiling_s = 0.3
"""


# For a memory cgroup of 1.5 GiB (MemoryCgroup): a trial far larger than it, resnet_small at
# batch 4,096 of 64 px images.
KERNEL_OOM_CONFIG = """
[run]
duration_s = 900
heartbeat_s = 1
lease_timeout_s = 6
[data]
dataset = "synthetic"
image_size = 64
synthetic_images = 512
synthetic_classes = 10
[model]
seed_model = "resnet_small"
[train]
max_epochs = 2
batch_size = 4096
[monitor]
ceiling_s = 0.3
"""


def fast_config(**run) -> str:
    """A configuration that searches fast on the small digits at their native 8x8:
    1-, 1-, 2-epoch warm-up rounds, then 2-epoch TPE rounds."""
    settings = {"heartbeat_s": 1, "lease_timeout_s": 6, **run}
    lines = ["[run]"] + [f"{k} = {v!r}" for k, v in settings.items()]
    return "\n".join(lines) + """
[data]
dataset = "digits"
image_size = 8
[train]
max_epochs = 2
batch_size = 128
[search]
tpe_startup_trials = 1
[monitor]
interval_s = 1
ceiling_s = 0.3
"""


# The test folders' few corrupt files are a large share of their few images.
TEST_MAX_UNREADABLE = 0.25


def folder_config(data_dir, workers=1, image_size=32, max_epochs=4,
                  max_unreadable=TEST_MAX_UNREADABLE, **run) -> str:
    """A configuration for an ImageNet-layout folder of JPEGs, decoded by ``workers``
    data-loading processes per rank, trained small: 1-, 2-, 3-epoch warm-up rounds of the
    small seed (with the default ``max_epochs``)."""
    settings = {"heartbeat_s": 1, "lease_timeout_s": 6, **run}
    lines = ["[run]"] + [f"{k} = {v!r}" for k, v in settings.items()]
    return "\n".join(lines) + f"""
[data]
dataset = "imagenet"
data_dir = "{data_dir}"
image_size = {image_size}
workers = {workers}
max_unreadable = {max_unreadable}
[model]
seed_model = "resnet_small"
[train]
max_epochs = {max_epochs}
batch_size = 16
[search]
tpe_startup_trials = 1
[monitor]
interval_s = 1
"""


def write_config(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def default_sigint():
    """For a child that a test stops with Ctrl-C: a shell that runs the suite in the
    background starts it with SIGINT ignored, which every process would inherit (and
    Python then installs no KeyboardInterrupt handler), unlike a terminal's foreground job."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def marked_env(**extra):
    """An environment whose mark every process started from it inherits (replicas, training
    ranks, data-loading workers, samplers), so a test can find any that outlive a run."""
    mark = uuid.uuid4().hex
    return dict(os.environ, **{MARK: mark}, **extra), mark


def marked_processes(mark):
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_for(predicate, timeout, what, every=0.5):
    """Wait for a condition; the limit is generous and only guards against a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stopped(pid):
    """Whether no thread of process ``pid`` runs any more (stopped, or gone): SIGSTOP takes
    effect after ``kill`` returns, and a thread still running may write in between."""
    import psutil

    halted = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE,
              psutil.STATUS_DEAD)
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return True  # the process ended
    states = []
    for thread in threads:
        try:
            states.append(psutil.Process(thread.id).status())
        except psutil.NoSuchProcess:
            continue  # a thread that ended meanwhile
    return all(state in halted for state in states)


def outcome_logged(run_dir, trial_id):
    """Whether trial ``trial_id``'s log holds its outcome. A replica logs it before it ends
    the trial in the store, and the primary ends a trial the store still holds running with
    its logged outcome (runner/recovery.py): a replica stopped between the two has, in
    effect, finished that trial."""
    from automlperf.events import read_jsonl
    from automlperf.store.ledger import LOG

    path = Path(run_dir) / "trials" / str(trial_id) / LOG
    try:
        return any(record.get("type") == "trial" for record in read_jsonl(path))
    except FileNotFoundError:
        return False



def opened(run_dir):
    """The running job's store (its private PostgreSQL server in RUN_DIR/postgres), once the
    server is up and the run created."""
    from automlperf.store import open_store
    from automlperf.store.urls import resolve_store_url

    def probe():
        private = Path(run_dir) / "postgres"
        if not ((private / "pgdata" / "postmaster.pid").exists()
                and (Path(run_dir) / "run.json").exists() and (private / "url").exists()):
            return None
        url = resolve_store_url((private / "url").read_text().strip(),
                                password_file=private / "pg.password")
        store = open_store(url, run_dir=run_dir)
        store.trials(1)
        return store

    def attempt():
        try:
            return probe()
        except Exception:  # the server or the schema is not ready yet
            return None

    found = []
    wait_for(lambda: found.append(attempt()) or found[-1] is not None, 600, "the run to start")
    return found[-1]


def hold_mid_trial(store, run_dir, replica, epochs=1):
    """Replica ``replica`` (its latest registration: a resumed run's is this session's) held
    with SIGSTOP in a running trial with ``epochs`` done: (pid, trial). The trial picked is one
    whose outcome the replica has not logged: it logs an outcome before it ends the trial in
    the store, so a trial logged as ended may still end as it logged (a write already sent to
    the store service, or the primary's recovery)."""
    import signal

    found = {}

    def held():
        mine = [r for r in store.replicas(1) if r.index == replica]
        if not mine:
            return False
        rep = max(mine, key=lambda r: r.id)
        if rep.status != "running":
            return False  # an earlier session's, until this one's registers
        try:
            os.kill(rep.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        wait_for(lambda: stopped(rep.pid), 60, f"replica {replica} to stop")
        trial = next((t for t in store.trials(1) if t.replica_id == rep.id
                      and t.status == "running" and t.epochs_done >= epochs
                      and not outcome_logged(run_dir, t.id)), None)
        if trial is None:
            os.kill(rep.pid, signal.SIGCONT)  # between trials: wait for the next one's epoch
            return False
        found.update(pid=rep.pid, trial=trial)
        return True

    wait_for(held, 600, f"replica {replica} held mid-trial")
    return found["pid"], found["trial"]


def kill_outright(pid):
    """Kill a replica as its node's death or an out-of-memory kill would, without a word:
    SIGKILL to its whole process group (the replica, its training processes and its
    sampler), held or not. The time it was killed."""
    import signal

    os.killpg(os.getpgid(pid), signal.SIGKILL)
    return time.time()

def wait_no_strays(mark, timeout=120):
    """Every process of a run ends with it (the limit covers replicas that notice a dead
    primary by its silence, after their lease)."""
    deadline = time.monotonic() + timeout
    while True:
        left = marked_processes(mark)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError("processes outlived the run: " + "; ".join(
                f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in left))
        time.sleep(0.5)


# The small seed on the 8x8 digits: the fastest real training the pool and trainer tests use.
SMALL8 = seeds.resnet_small(num_classes=10, image_size=8, in_channels=1)


def measured_by_this_process() -> dict:
    """A stand-in for a CPU pool's measurement of its node: which process made it (a
    function of a module, so that a rank can unpickle it)."""
    return {"devices": ["cpu"], "ceiling_ops": 1.0, "pid": os.getpid()}


def trial_spec(trial_id="t", graph=SMALL8, epochs=1, **kw) -> TrialSpec:
    base = dict(epochs=epochs, batch_size=64, patience=10, lr_per_256=0.4, warmup_epochs=1.0)
    base.update(kw)
    return TrialSpec(trial_id, graph.to_dict(), **base)


class Recorder:
    """A pool's message callback that keeps epoch and progress messages apart."""

    def __init__(self):
        self.epochs, self.progress = [], []

    def __call__(self, kind, msg):
        (self.epochs if kind == "epoch" else self.progress).append(msg)



# A 4,096-channel convolution at 16x16: at batch 2,048 its activations outgrow the address
# space of pool_under_memory_limit's ranks, a real allocation failure.
WIDE = Graph.build((3, 16, 16), [
    conv("c", INPUT, 4096, 3, 1), simple("b", "batchnorm", "c"), simple("r", "relu", "b"),
    simple("p", "global_avgpool", "r"), dense("fc", "p", 10), simple("s", "softmax", "fc")])


def pool_under_memory_limit(devices, gib=4):
    """A pool on synthetic 16x16 images whose rank processes inherit a ``gib`` address-space
    limit; this process gets its own limit back."""
    from automlperf.train.pool import DevicePool

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (gib * 2**30, hard))
    try:
        return DevicePool(devices, data_section("synthetic", image_size=16, synthetic_images=2048,
                                                synthetic_classes=10))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class MemoryCgroup:
    """A memory cgroup of its own, limited to ``limit`` bytes with no swap, as a batch
    system's job or a container is: cgroup v2's unified hierarchy where it holds the memory
    controller, else cgroup v1's memory hierarchy (as root). ``enter`` moves the calling
    process in (a ``preexec_fn`` for the command to limit); ``kind`` and ``path`` say what
    was used. None from :meth:`make` with why, where the machine offers neither."""

    def __init__(self, kind, path, procs):
        self.kind, self.path, self.procs = kind, path, procs

    def enter(self):
        with open(self.procs, "w") as f:
            f.write(str(os.getpid()))

    @classmethod
    def make(cls, limit):
        from pathlib import Path

        from automlperf.train.oomkill import _mounts

        if os.geteuid() != 0:
            return None, "creating a cgroup needs root"
        mounts = _mounts(Path("/proc/self/mountinfo"))
        name = f"automlperf-oom-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for kind, point, _ in mounts:
            root = Path(point)
            if kind == "cgroup2" and "memory" in (root / "cgroup.controllers").read_text().split():
                if "memory" not in (root / "cgroup.subtree_control").read_text().split():
                    (root / "cgroup.subtree_control").write_text("+memory")
                group = root / name
                group.mkdir()
                (group / "memory.max").write_text(str(limit))
                if (group / "memory.swap.max").exists():
                    (group / "memory.swap.max").write_text("0")
                return cls("cgroup v2", group, group / "cgroup.procs"), None
        for kind, point, options in mounts:
            if kind == "cgroup" and "memory" in options:
                own = next(line.split(":", 2)[2] for line in
                           Path("/proc/self/cgroup").read_text().splitlines()
                           if "memory" in line.split(":", 2)[1].split(","))
                group = Path(point) / own.lstrip("/") / name
                group.mkdir()
                (group / "memory.limit_in_bytes").write_text(str(limit))
                if (group / "memory.memsw.limit_in_bytes").exists():
                    (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
                return cls("cgroup v1 (memory controller)", group, group / "cgroup.procs"), None
        return None, "no cgroup hierarchy with the memory controller is mounted"

    def kills(self):
        for name in ("memory.events", "memory.oom_control"):
            path = self.path / name
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        return None

    def remove(self):
        """Kill what is left in it, then remove it."""
        import signal

        for _ in range(50):
            pids = [int(p) for p in self.procs.read_text().split()]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.path} could not be removed")


def new_claim(**fields) -> Claim:
    """A claim by name: ``fields`` give its run, replica and architecture (run_id,
    replica_id, replica_index, graph_hash) and whatever else differs from a seed's claim with
    no hyperparameters, at time 1.0 with a lease of 60 s."""
    seed = {"graph_json": "{}", "parent_id": None, "morphs": [], "round": 0, "hparams": {},
            "now": 1.0, "lease_s": 60.0}
    return Claim(**{**seed, **fields})


def epoch_of(run_id, trial_id, n, ended=None, ops=10**15) -> EpochRecord:
    """Epoch ``n`` of a trial, made up: it ends at ``ended`` (101 + n by default) with an
    accuracy of 0.5 + n / 100."""
    return EpochRecord(trial_id=trial_id, epoch=n, started_at=100.0 + n, ended_at=ended or 101.0 + n,
                       train_images=1000, val_images=200, steps=8, ops=ops, train_loss=1.5,
                       val_accuracy=0.5 + n / 100, precision="bf16", batch_size=128, world_size=2,
                       data_share=0.01, images_per_s=900.0, run_id=run_id)


def one_trial(store, name="r", graph_hash="h"):
    """A run in ``store`` with one replica holding one running trial: (run id, trial id)."""
    run_id = store.create_run(name, {}, {}, 60.0, 1.0)
    seg = store.start_segment(run_id, 1.0, 100.0)
    rep = store.register_replica(run_id, 0, seg, "n", 1, [], 1.0)
    return run_id, store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                               graph_hash=graph_hash))


def make_replica(session, trainer, clock=None):
    """A replica of a prepared run, in this process, with ``trainer`` for its accelerators."""
    from automlperf.runner.replica import Placement, Replica
    from automlperf.search import searcher_for
    from automlperf.search.hpo import HyperSearch
    from automlperf.store import open_store

    store = open_store(None, run_dir=session.dir.path)
    segment = store.segments(session.run_id)[-1]
    place = Placement(dir=session.dir, run_id=session.run_id, config=session.config, index=0,
                      segment=segment, devices=["fake"], threads=1)
    cfg = session.config.search
    hpo = HyperSearch(store.url, "run-1-replica-0", (32, 128), cfg.kernel_sizes,
                      startup_trials=cfg.tpe_startup_trials)
    extra = {"clock": clock} if clock else {}
    return Replica(place, store, trainer, searcher_for(cfg), hpo, 64, **extra), store


def copy_of(folder, tmp_path):
    """A copy of ``folder`` (a run or a bundle) to change, as ``tmp_path / "bundle"``."""
    copy = tmp_path / "bundle"
    shutil.copytree(folder, copy)
    return copy


def handshake(sock, token, primary=None):
    """The store service's greeting on ``sock``, proving ``token`` as the run's (and
    ``primary`` as the primary's own): the service's last answer (``{"v": ...}``), or its
    refusal."""
    from automlperf.store.base import SCHEMA_VERSION
    from automlperf.store.service import wire

    ours = wire.nonce()
    sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION, "nonce": ours}))
    answer = wire.read_frame(sock)[0]
    if "e" in answer:
        return answer
    proofs = {"proof": wire.proof(token, "client", answer["nonce"], ours)}
    if primary is not None:
        proofs["primary"] = wire.proof(primary, "primary", answer["nonce"], ours)
    sock.sendall(wire.encode(proofs))
    return wire.read_frame(sock)[0]


def call(sock, message):
    """One call of the store service's protocol on ``sock``: its answer."""
    from automlperf.store.service import wire

    sock.sendall(wire.encode(message))
    return wire.read_frame(sock)[0]
