"""A process that dies with its owner: the worker started by an embedded session and the fork server."""
import os
import signal
import sys


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel send SIGTERM when the parent dies, even by SIGKILL (Linux; elsewhere the heartbeat or the
    end of stdin says so). False if the parent is already gone. Imports nothing heavy: a process calls it first."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    return os.getppid() == parent_pid
