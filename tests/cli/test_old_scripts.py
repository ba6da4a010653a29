"""Batch scripts written by earlier versions keep working when resubmitted to resume their
run: the commands they call still exist."""

import os
import subprocess
import sys

import pytest

from automlperf.runner.sbatch import ScriptOptions, write_script

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_an_earlier_scripts_private_server_commands_still_work(tmp_path):
    script = write_script(ScriptOptions(tmp_path / "run", nodes=1, duration_s=600)).read_text()
    # Earlier versions called the server's module under runner/.
    old = script.replace("automlperf.store.pgserver", "automlperf.runner.pgserver")
    start = old[old.index('"$PYTHON" -m automlperf.runner.pgserver start'):]
    start = start[:start.index("|| {")]
    stop = old[old.index('"$PYTHON" -m automlperf.runner.pgserver stop'):].split(";")[0]
    env = dict(os.environ, PYTHON=sys.executable, RUN_DIR=str(tmp_path / "run"))
    setup = 'export PATH="$(dirname "$PYTHON"):$PATH"\n'
    done = subprocess.run(["bash", "-c", setup + start], env=env, capture_output=True, text=True,
                          timeout=300)
    try:
        assert done.returncode == 0, done.stderr
        url = (tmp_path / "run" / "postgres" / "url").read_text()
        assert url.startswith("postgresql") and (tmp_path / "run/postgres/pgdata/postmaster.pid").exists()
    finally:
        done = subprocess.run(["bash", "-c", setup + stop], env=env, capture_output=True,
                              text=True, timeout=700)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "run/postgres/pgdata/postmaster.pid").exists()
