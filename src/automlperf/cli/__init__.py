"""Command line: thin wrappers that parse options, call the library and print. Each module
holds one group of commands; importing them registers the commands on ``app``."""

from automlperf.cli import cluster, machine, ranking, results, running  # noqa: F401  (registers commands)
from automlperf.cli.common import app


def main() -> None:
    app()
