"""A private PostgreSQL server's folder has one owner at a time: a second start on another
host refuses in one line and leaves the store intact, and a server killed with its job
leaves a store that starts again at once. Real servers; "another host" is a UTS namespace
with a host name of its own, as a second node sharing the file system would be."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pghost import pgserver_on, rows, with_password, write_rows

from automlperf.store import pgowner
from automlperf.store import open_store
from automlperf.store.pgserver import PostgresServer
from automlperf.store.opening import run_store
from automlperf.store.rundir import RunDir

pytestmark = pytest.mark.postgres


@pytest.fixture
def folder():
    # Outside pytest's temporary folder, which a second session would lock the server out of.
    path = Path(tempfile.mkdtemp(prefix="amp-pgowner-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _kill_hard(server: PostgresServer) -> None:
    """As a node's death or SLURM's SIGKILL would: postmaster.pid stays behind."""
    pid = pgowner.postmaster_pid(server.data)
    os.kill(pid, signal.SIGKILL)
    for _ in range(6000):  # a condition, not a time: the kernel reaps it
        if not pgowner._is_postgres(pid):
            break
        time.sleep(0.05)
    assert not pgowner._is_postgres(pid)
    assert (server.data / "postmaster.pid").exists()


def test_a_second_start_on_another_host_refuses_and_the_store_is_intact(folder):
    server = PostgresServer(folder)
    url = server.start()
    write_rows(url, 1, 2)
    before = (folder / pgowner.OWNER_FILE).read_text()
    other, same = pgserver_on("other-node", folder), pgserver_on(None, folder)
    for done in (other, same):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith("error: ") and "Traceback" not in done.stderr
    # Another host cannot see this one's processes: only the operator can say it is gone,
    # and the refusal says how.
    assert "nothing here can tell whether it still runs" in other.stderr
    assert "automlperf.store.pgserver release --force --dir" in other.stderr
    assert "already served" in same.stderr and "runs on this host" in same.stderr
    refused = pgserver_on("other-node", folder, None, "release")
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert (folder / pgowner.OWNER_FILE).read_text() == before
    assert rows(url) == [(1,), (2,)]
    # The host dies with its server. Released by the operator's word, the store starts on
    # another host, with its data, and the record of whose it was is kept.
    _kill_hard(server)
    assert pgserver_on("other-node", folder).returncode == 1
    released = pgserver_on("other-node", folder, None, "release", "--force")
    assert released.returncode == 0 and "released the store started from host" in released.stdout
    elsewhere = pgserver_on("other-node", folder)
    assert elsewhere.returncode == 0, elsewhere.stderr
    try:
        assert rows(with_password(folder, elsewhere.stdout)) == [(1,), (2,)]
        assert pgowner.read_owner(folder).host == "other-node"
    finally:
        assert pgserver_on("other-node", folder, None, "stop").returncode == 0
    assert not (folder / pgowner.OWNER_FILE).exists()
    assert len(list(folder.glob(pgowner.OWNER_FILE + ".gone-*"))) == 1


def test_a_server_whose_folder_lost_its_traverse_permission_still_stops(folder):
    """As root the server runs as another account, which the start lets through the folders
    above its own; one reset to 0700 meanwhile (as a second pytest session does to its base
    folder) must not leave the server running when the job stops it."""
    server = PostgresServer(folder / "run" / "postgres")
    server.start()
    pid = pgowner.postmaster_pid(server.data)
    folder.chmod(0o700)
    try:
        server.stop()
        assert not (server.data / "postmaster.pid").exists()
        for _ in range(6000):  # a condition, not a time: the kernel reaps it
            if not pgowner._is_postgres(pid):
                break
            time.sleep(0.05)
        assert not pgowner._is_postgres(pid)
    finally:
        if pgowner._is_postgres(pid):
            os.kill(pid, signal.SIGINT)  # no server left behind by a failure


def test_a_server_killed_with_its_job_reopens_at_once_for_check_and_report(folder):
    """A stale postmaster.pid (the server SIGKILLed with its job, or its node rebooted) no
    longer sends `check`, `report` and `slurm --resume` to wait for a server that is gone:
    the store starts again here and replays its log."""
    run_dir = folder / "run"
    server = PostgresServer(run_dir / "postgres")
    url = server.start()
    store = open_store(url, create=True)
    run_id = store.create_run("killed", {}, {}, 60.0, 1.0)
    store.close()
    RunDir(run_dir).write_meta(run_id, url, "killed")
    _kill_hard(server)
    with run_store(run_dir) as reopened:
        assert reopened.run(run_id)["name"] == "killed"
    # What it started for the read, it stopped again, and gave the folder up.
    assert not (run_dir / "postgres" / "pgdata" / "postmaster.pid").exists()
    assert not (run_dir / "postgres" / pgowner.OWNER_FILE).exists()
    assert list((run_dir / "postgres").glob(pgowner.OWNER_FILE + ".gone-*"))


def test_a_pid_reused_by_another_program_is_not_a_server(folder, tmp_path):
    """After a hard kill the old postmaster's pid may belong to anything: only a live
    PostgreSQL process holds the folder."""
    (folder / "pgdata").mkdir()
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        (folder / "pgdata" / "postmaster.pid").write_text(f"{sleeper.pid}\n{folder}\n")
        verdict = pgowner.assess(folder)
        assert verdict.live is False and f"pid {sleeper.pid}) is gone" in verdict.why
        pgowner.claim(folder)
        assert not (folder / "pgdata" / "postmaster.pid").exists()
        assert pgowner.read_owner(folder).pid == os.getpid()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_damaged_owner_record_is_named(folder):
    (folder / pgowner.OWNER_FILE).write_text('{"host": "a"')
    with pytest.raises(pgowner.StoreInUse, match="owner.json is damaged.*delete that file"):
        pgowner.claim(folder)


CLAIM = """
import sys
from automlperf.store import pgowner
try:
    pgowner.claim(sys.argv[1])
    print("owner", flush=True)
except pgowner.StoreInUse as exc:
    print("refused", exc, flush=True)
sys.stdin.read()  # hold the claim until the test has both answers
"""


def test_two_starts_at_once_leave_one_owner(folder):
    """The claim is one exclusive create, and a claimant still starting its server holds
    it: of two that race, whichever order they come in, one owns the folder."""
    racers = [subprocess.Popen([sys.executable, "-c", CLAIM, str(folder)], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(2)]
    answers = [racer.stdout.readline() for racer in racers]
    owner = pgowner.read_owner(folder)
    for racer in racers:
        racer.communicate("")
    assert sorted(a.split()[0] for a in answers) == ["owner", "refused"]
    winner = racers[[a.startswith("owner") for a in answers].index(True)]
    assert owner.pid == winner.pid
    assert "is starting it" in next(a for a in answers if a.startswith("refused"))
