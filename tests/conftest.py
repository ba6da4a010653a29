"""Shared fixtures: real servers started by the tests themselves."""

import functools
import getpass
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_db_names = itertools.count()


# Modules whose tests share one costly module fixture (a finished run, a pool of rank
# processes): under pytest-xdist they stay on one worker, which sets it up once.
SHARED_MODULE_FIXTURE = ("test_results", "test_trainer")
# Modules that share a session fixture: one worker for all of them, which runs it once.
SHARED_SESSION_FIXTURE = {"test_official_shape": "official_shape", "test_bundle": "official_shape",
                          "test_listing": "official_shape", "test_record_edits": "official_shape",
                          "test_identity": "imagenet_1k"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Tests that start a real server carry its lane's mark, so `make test-fast` (no root, no
    services) leaves them out without a list to keep up to date.

    On a pytest-xdist worker (`make test`, `--dist loadgroup`): a module's SLURM tests run on
    one worker, so the cluster it starts for them starts once (clusters of several modules
    run side by side: each has its own ports, folders and job ids, and they share the host's
    munge daemon), and the slow tests come first, so that the quick ones fill the workers'
    ends and all finish together."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("store_url") == "postgresql"
        if "pg_server" in names or on_postgres:
            item.add_marker(pytest.mark.postgres)
        if "slurm_cluster" in names or "slurm_cluster_8" in names:
            item.add_marker(pytest.mark.slurm)
        if item.get_closest_marker("dali") and not _dali_installed():
            item.add_marker(pytest.mark.skip(reason="NVIDIA DALI is not installed (make setup-dali)"))
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        if item.get_closest_marker("slurm") and item.module is not None:
            item.add_marker(pytest.mark.xdist_group(f"slurm-{item.module.__name__}"))
        elif item.module is not None and item.module.__name__ in SHARED_MODULE_FIXTURE:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        elif item.module is not None and item.module.__name__ in SHARED_SESSION_FIXTURE:
            item.add_marker(pytest.mark.xdist_group(SHARED_SESSION_FIXTURE[item.module.__name__]))
    items.sort(key=_start_order)
    items[:] = _alternated(items)


def _start_order(item) -> int:
    """SLURM's tests first (the largest unit of work), then the other slow ones."""
    if item.get_closest_marker("slurm"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def _alternated(items: list) -> list:
    """The units of work in start order, each SLURM module's alternating with another slow
    one. pytest-xdist hands the first unit to the first worker, the second to the second, and
    so on; a SLURM module's tests mostly wait (daemons, jobs, leases), and the workers should
    not all begin by waiting together."""
    units: dict[str, list] = {}
    for item in items:
        group = item.get_closest_marker("xdist_group")
        units.setdefault(group.args[0] if group else item.nodeid, []).append(item)
    slurm = [u for u in units.values() if u[0].get_closest_marker("slurm")]
    others = [u for u in units.values() if not u[0].get_closest_marker("slurm")]
    order = [unit for pair in itertools.zip_longest(slurm, others) for unit in pair if unit]
    return [item for unit in order for item in unit]


# A test that takes longer than this and carries no lane's mark is named at the end of the
# session: the quick lane stays quick only if slow tests say so. It names, never fails: how
# long a test takes depends on the machine.
QUICK_LIMIT_S = 5.0
LANE_MARKS = ("slow", "postgres", "slurm", "browser", "dali")
_unmarked_slow: list[tuple[float, str]] = []


def pytest_runtest_logreport(report):
    """Note every unmarked test whose set-up, call or tear-down passed the quick limit (on the
    pytest-xdist controller too: the report carries the test's marks as keywords)."""
    if report.duration > QUICK_LIMIT_S and not any(m in report.keywords for m in LANE_MARKS):
        _unmarked_slow.append((report.duration, f"{report.nodeid} ({report.when})"))


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput") or not _unmarked_slow:
        return
    terminalreporter.section(f"unmarked tests over {QUICK_LIMIT_S:.0f} s (mark them slow, or "
                             "make them quick)")
    for seconds, name in sorted(_unmarked_slow, reverse=True):
        terminalreporter.write_line(f"{seconds:7.1f} s  {name}")


@functools.cache
def _dali_installed() -> bool:
    from automlperf.train.data import dali_available

    return dali_available()


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """The session's own XDG cache, before any session fixture starts a run: compilation
    figures a doctor kept on this machine decide no test's trials."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        # matplotlib keeps its list of the system's fonts in the XDG cache, which each test
        # makes anew (own_cache): every report a test's run draws would list them again.
        patch.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("matplotlib")))
        # Ranks keep compiled graphs in the user's cache (train/rankenv.py), here one a test
        # makes anew: they share Inductor's default instead, as the suite's compiled tests
        # always have (a graph compiled once serves them all).
        if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
            patch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.join(
                tempfile.gettempdir(), "torchinductor_" + getpass.getuser()))
        yield


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Each test its own XDG cache, so figures one test keeps decide no other's trials."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def pg_server():
    """A private PostgreSQL server for the whole session (installed by
    scripts/setup-system.sh; its absence is a failure, not a skip)."""
    from automlperf.store.pgserver import PostgresError, PostgresServer

    # Outside pytest's own temporary folder: a second pytest session on the machine resets
    # that folder's parent to mode 700, which would lock the server's user out of its data.
    directory = Path(tempfile.mkdtemp(prefix="amp-pg-test-"))
    try:
        server = PostgresServer(directory)
        server.start()
    except PostgresError as exc:
        pytest.fail(f"{exc} (run scripts/setup-system.sh)")
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server):
    """An empty database of its own for one test."""
    return pg_server.create_database(f"t{os.getpid()}_{next(_db_names)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """One URL per store backend: every test using it runs against both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url")


def start_slurm(base, nodes, cluster, memory_mb=8000):
    """A real SLURM cluster of ``nodes`` slurmd daemons on this host (automlperf/testing/slurm.py);
    its absence is a failure, not a skip."""
    from automlperf.testing.slurm import SlurmError
    from automlperf.testing.slurm import start_slurm as start

    try:
        return start(base, nodes, cluster, memory_mb)
    except SlurmError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node SLURM cluster on this host. Yields the environment that points
    SLURM's commands at it."""
    from automlperf.testing.slurm import stop_slurm

    env = start_slurm(tmp_path_factory.mktemp("slurm"), 2, "amptest")
    yield env
    stop_slurm(env)


@pytest.fixture(scope="module")
def slurm_cluster_8(tmp_path_factory):
    """A real SLURM cluster of eight slurmd nodes on this host, for the tests of one module
    (light job steps only: the nodes share this machine's cores)."""
    from automlperf.testing.slurm import stop_slurm

    env = start_slurm(tmp_path_factory.mktemp("slurm8"), 8, "amptest8")
    yield env
    stop_slurm(env)


@pytest.fixture(scope="session")
def imagenet_1k_tree(tmp_path_factory):
    """ImageNet-1k's file list, once per session: the 1,000 ILSVRC-2012 class folders and
    1,281,167 + 50,000 hard links to one small JPEG (trees.make_tree). Read it, never write.
    Made in memory where the host has it (/dev/shm: a link there costs a third of one on
    ext4's journal, and none of it stays on the disk for a later session to delete), and
    removed at the session's end: as root, in a memory file system of its own, which is
    unmounted at once (1.5 s, where removing the links one by one took 13)."""
    import psutil

    from automlperf import rules
    from trees import make_tree

    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        for stale in shm.glob("automlperf-imagenet_1k-*"):
            # A session killed before its teardown left its tree in memory.
            pid = stale.name.split("-")[2]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                _remove_tree(stale)
        where = Path(tempfile.mkdtemp(prefix=f"automlperf-imagenet_1k-{os.getpid()}-", dir=shm))
    else:
        where = tmp_path_factory.mktemp("imagenet_1k")
    if os.geteuid() == 0:
        # Its own file system or none: the tree is made the same way on either.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "nr_inodes=0,size=1g",
                        "automlperf-tree", str(where)], capture_output=True)
    try:
        yield make_tree(where / "imagenet", counts=(
            rules.IMAGENET_1K.train_images, rules.IMAGENET_1K.val_images))
    finally:
        _remove_tree(where)


def _remove_tree(where: Path) -> None:
    if os.path.ismount(where):
        subprocess.run(["umount", str(where)], capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


# Installed through PYTHONPATH in every process of the official-shape run (primary, replica,
# ranks, and by inheritance their forked workers): each file any of them opens, or tries to,
# by its path, appended to a log of its own process, so that a test can tell which files the
# run opened and how often (an audit hook sees an open before it happens, failed ones too).
OPEN_AUDIT = """
import os
import sys

_where = os.environ.get("AUTOMLPERF_TEST_OPENS")
if _where:
    _fd = os.open(os.path.join(_where, "opens.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def _opened(event, args):
        if event == "open" and isinstance(args[0], (str, bytes)):
            os.write(_fd, f"{os.getpid()}\\t{os.fsdecode(args[0])}\\n".encode())

    sys.addaudithook(_opened)
"""


@pytest.fixture(scope="session")
def official_shape_run(tmp_path_factory):
    """The official shape end to end, once per session: the ResNet-50 seed at 224x224 on
    ImageNet's official archives as generated here (the 1,000 ILSVRC-2012 classes, the
    training archive a tar of their tars, the devkit labelling validation), through
    `automlperf run`, proven against a test-only table of their MD5s. The data is tiny (one
    small JPEG in every twentieth class), so the run takes a minute or two on a CPU; it keeps
    every fixed setting official but the maximum epochs (4: a first round of one epoch), and
    is not official for that and for its test table (and not valid for its duration and
    accuracy). The folder the archives were written from is gone before the run starts;
    every file its processes opened is in ``opens/opens.log`` beside the run directory.
    Read it, never write."""
    from automlperf import rules
    from automlperf.dataset.proof import TEST_TABLE_ENV
    from automlperf.testing.archives import write_archives, write_table
    from helpers import cli, marked_env, wait_no_strays
    from imagefolder import photo

    tmp_path = tmp_path_factory.mktemp("official_shape")
    src = photo().resize((64, 64))
    wnids = rules.IMAGENET_1K.classes
    # Training on every class would multiply the minutes by ten for nothing it checks: the
    # empty class tars still define the 1,000 outputs.
    for split, per_class in (("train", {c: 1 for c in range(0, 1000, 20)}),
                             ("val", {c: 1 for c in range(0, 1000, 40)})):
        for c in range(1000):
            folder = tmp_path / "folder" / split / wnids[c]
            folder.mkdir(parents=True)
            for i in range(per_class.get(c, 0)):
                # Each class its own rotation of the photo: distinct files, same cost to decode.
                src.rotate(c * 0.36).save(folder / f"{split}_{c}_{i}.JPEG", quality=85)
    table = write_archives(tmp_path / "folder", tmp_path / "archives")
    shutil.rmtree(tmp_path / "folder")
    config = tmp_path / "official.toml"
    # Official settings; only what a CPU needs to finish one round of one epoch changes:
    # customisable settings, the maximum epochs (fixed since aiperf-2021.3), and a round
    # limit that ends the run long before its hour.
    config.write_text(f"""
[run]
duration_s = 3600
max_rounds = 1
[data]
dataset = "imagenet"
data_dir = "{tmp_path / 'archives'}"
workers = 1
[train]
max_epochs = 4
batch_size = 50
""")
    run_dir = tmp_path / "run"
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(OPEN_AUDIT)
    (tmp_path / "opens").mkdir()
    env, mark = marked_env(**{TEST_TABLE_ENV: str(write_table(tmp_path / "md5s.json", table)),
                              "AUTOMLPERF_TEST_OPENS": str(tmp_path / "opens"),
                              "PYTHONPATH": os.pathsep.join(
                                  [str(audit), *filter(None, [os.environ.get("PYTHONPATH")])])})
    # Minutes on an idle 2-core machine; the limit guards against a hang only.
    # Declared unofficial: official settings alone would refuse the maximum epochs.
    done = cli("run", "--config", config, "--run-dir", run_dir, "--unofficial", env=env,
               timeout=3000)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_no_strays(mark)
    return run_dir
