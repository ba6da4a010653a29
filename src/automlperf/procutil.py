"""Small process helpers shared by the training ranks and the monitor."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (even by SIGKILL), so that no
    helper outlives the process it serves, e.g. a rank blocked in an all-reduce."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: ranks still exit when their pipe to the parent closes
