"""The private PostgreSQL server's command line at the path that batch scripts written by
earlier versions call (``python -m automlperf.runner.pgserver start|stop``): resubmitting
such a script resumes its run. The server lives in :mod:`automlperf.store.pgserver`."""

from automlperf.store.pgserver import main

if __name__ == "__main__":
    main()
