"""A signal to one thread of another process (``tgkill(2)``), as the kernel may deliver a
process's signal to any of its threads: a test of how a component stops then."""

from __future__ import annotations

import ctypes
import os
import platform

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def other_threads(pid: int) -> list[int]:
    """The thread IDs of process ``pid`` but its main thread's."""
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)


def signal_thread(pid: int, tid: int, sig: int) -> None:
    if SYS_TGKILL is None:
        raise OSError(f"no tgkill syscall number for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, int(sig)) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")
