"""The one base of the errors a user can fix: bad input, a missing file or server, a machine
that cannot do what was asked. The command line prints their message as one line and exits
with status 2; anything else is a bug and keeps its traceback.

A run's exit statuses, which a batch script (and a chain of jobs) acts on, are here too:
0 the run ended (or was stopped cleanly, where a batch script ends), 1 it failed, 2 it was
refused, 3 no clock started, 75 resumable, 130 interrupted (docs/cluster.md has the table).
"""

# Exit statuses of `automlperf run` beyond 0, 1 (failed: it cannot train) and 2 (refused).
NO_CLOCK = 3  # the job's time limit cannot hold the run: no clock started, nothing lost
RESUMABLE = 75  # the store or the run directory failed mid-run: resume once it is back
INTERRUPTED = 130  # Ctrl-C or SIGTERM: the result of the time run so far is written


class UserError(Exception):
    """A problem with the user's input or setup; the message names it and the fix."""


class RunFailure(Exception):
    """A run that started and cannot finish its job: the command line prints the message as
    one line and exits with ``exit_status``; everything the run wrote is kept."""

    exit_status = 1


class NoClock(RunFailure):
    """The batch job cannot hold the run: its clock was not started, and nothing was lost
    (the message names the time limit to ask for)."""

    exit_status = NO_CLOCK


class Resumable(RunFailure):
    """The run stopped for a cause outside it (its store lost, its run directory taking no
    more writes): everything recorded so far is kept, and it resumes once that is fixed."""

    exit_status = RESUMABLE
