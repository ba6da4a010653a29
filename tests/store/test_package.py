"""The store package's names load on first use, so that the resource sampler (one process
per node of every run) does not import SQLAlchemy to find its run directory."""

import subprocess
import sys

import automlperf.store as store


def test_every_exported_name_resolves_to_its_module():
    assert sorted(store.__all__) == sorted(store._WHERE)
    for name in store.__all__:
        value = getattr(store, name)
        assert getattr(value, "__name__", name) == name or name == "SCHEMA_VERSION"
    assert store.SCHEMA_VERSION == store.base.SCHEMA_VERSION


def test_the_samplers_imports_leave_sqlalchemy_out():
    code = ("import sys\n"
            "import automlperf.measure.monitor, automlperf.store.rundir\n"
            "print('sqlalchemy' in sys.modules)\n"
            "from automlperf.store import open_store\n"
            "print('sqlalchemy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
