"""The lock that keeps every request on one revision: requests share it, a transition holds
it alone.

A request holds the shared side for its whole generation, so the revision that began it
also finishes it. A transition takes the exclusive side for the part that changes live
weights: it waits for the requests in flight, and requests that arrive meanwhile wait
behind it (writer preference, so a steady stream of requests cannot starve an apply), at
most ``timeout`` seconds (:class:`WaitExpired`). The reload of a model's only replica
holds the exclusive side *closed*: its clients keep coming for as long as it loads, so
requests that arrive or are waiting are turned away at once (:class:`LockClosed`, 503 +
Retry-After) rather than queued behind the load.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class WaitExpired(Exception):
    """A request waited its limit behind an exclusive holder."""


class LockClosed(Exception):
    """The exclusive holder is replacing the revision: nothing to wait for."""


class RevisionLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writers_waiting = 0
        self._writer = False
        self._closed = False

    @contextmanager
    def shared(self, timeout: float) -> Iterator[None]:
        """Hold the revision for one request; wait at most ``timeout`` s behind a transition."""
        with self._cond:
            free = self._cond.wait_for(
                lambda: self._closed or not (self._writer or self._writers_waiting), timeout)
            if self._closed:
                raise LockClosed("the revision is being replaced")
            if not free:
                raise WaitExpired(f"waited {timeout:g} s for a transition to finish")
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self, closed: bool = False) -> Iterator[None]:
        """Hold the revision alone, after the requests in flight finish. ``closed``: turn
        away every request until released instead of letting them wait."""
        with self._cond:
            self._writers_waiting += 1
            self._closed = self._closed or closed
            if closed:
                self._cond.notify_all()  # waiting requests learn at once that they wait in vain
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                if closed:
                    self._closed = False
                self._cond.notify_all()
