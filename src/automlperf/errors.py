"""The one base of the errors a user can fix: bad input, a missing file or server, a machine
that cannot do what was asked. The command line prints their message as one line and exits
with status 2; anything else is a bug and keeps its traceback."""


class UserError(Exception):
    """A problem with the user's input or setup; the message names it and the fix."""


class RunFailure(Exception):
    """A run that started and cannot finish its job (its store lost mid-run): the command
    line prints the message as one line and exits with status 1; everything the run wrote
    is kept, so it can be resumed."""
