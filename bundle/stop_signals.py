"""How a long-running component (the bridge, an owner) learns it is to stop: SIGTERM or
SIGINT sets a flag, and its main thread waits for the flag in slices.

Slices, not one untimed wait: the kernel delivers a process's signal to any of its
threads, CPython runs the Python handler only in the main thread, and only when that
thread next runs; a main thread asleep in an untimed ``Event.wait()`` never did (an owner
still said ready 1.5 s after SIGTERM, and with the signal sent to a server thread neither
an owner nor the bridge ever stopped: tests/component/test_owner_cli.py,
test_csi_process.py).
"""

from __future__ import annotations

import signal
import threading

POLL_SECONDS = 0.1


class StopSignals:
    """Installs the handlers at once (call it first: a signal before them is lost, and in a
    container PID 1 ignores a signal it has no handler for)."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._stop = threading.Event()
        for sig in signals:
            signal.signal(sig, lambda *_: self._stop.set())

    def is_set(self) -> bool:
        return self._stop.is_set()

    def wait(self) -> None:
        """Until a signal came."""
        while not self._stop.wait(POLL_SECONDS):
            pass
