"""Small process helpers shared by the training ranks and the monitor."""

from __future__ import annotations

import os
import signal


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to kill this process when its parent dies (even by SIGKILL), so that no
    helper outlives the process it serves, e.g. a rank blocked in an all-reduce or a
    data-loading worker of a rank that was killed.

    ``parent_pid`` closes the race in which the parent died before the request was made
    (the process then already belongs to another parent and no signal would ever come)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return  # not Linux: ranks still exit when their pipe to the parent closes
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
