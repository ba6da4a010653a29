"""A shim kept only for batch scripts written by earlier versions, which call the private
PostgreSQL server's command line here (``python -m automlperf.runner.pgserver start|stop``):
resubmitting such a script resumes its run (tests/cli/test_old_scripts.py). Nothing imports
this module; the server, and the command line that scripts written now call, live in
:mod:`automlperf.store.pgserver`."""

from automlperf.store.pgserver import main

if __name__ == "__main__":
    main()
