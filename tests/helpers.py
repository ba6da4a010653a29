"""Helpers shared by the end-to-end tests."""

import subprocess
import sys


def cli(*args, env=None, timeout=180):
    """Run the automlperf command line as a user would, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "automlperf.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def fast_config(**run) -> str:
    """A configuration that searches fast on the built-in digits at their native 8x8:
    1-, 1-, 2-epoch warm-up rounds, then 2-epoch TPE rounds."""
    settings = {"heartbeat_s": 1, "lease_timeout_s": 6, **run}
    lines = ["[run]"] + [f"{k} = {v!r}" for k, v in settings.items()]
    return "\n".join(lines) + """
[data]
dataset = "builtin"
image_size = 8
[train]
max_epochs = 2
batch_size = 128
[search]
tpe_startup_trials = 1
[monitor]
interval_s = 1
"""
