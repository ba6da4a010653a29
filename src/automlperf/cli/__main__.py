"""``python -m automlperf.cli``: the process entry point the launchers use."""

from automlperf.cli import main

main()
