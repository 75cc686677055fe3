"""A child process that ends with its parent: the kernel's parent-death signal (standard library only).

The provider's local launcher starts the trainer's launcher with it, and that launcher starts its one
rank with it (``elastic``): a ``kill -9`` anywhere above still reaches the rank as a SIGTERM, on which
it commits its step and exits instead of running orphaned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child ``sig`` when this process dies.

    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere None. The signal comes when the thread that started
    the child ends: callers wait for the child in that thread, so only their death sends it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # Resolved here, not after the fork: the child only makes the call.
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    signal_number = int(sig)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal_number, 0, 0, 0)
        # The parent died between the fork and the prctl: no signal would come.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal_number)

    return preexec
