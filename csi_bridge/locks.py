"""Per-volume serialization: one operation per volume (and per target path) at a time.

CSI lets a plugin answer ABORTED to a call that arrives while another operation on the
same volume is running; kubelet treats ABORTED as "retry later". The bridge does that
rather than queueing, so a slow publish cannot pile up blocked threads.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import grpc

from .status import CsiError


class VolumeLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._busy: set[str] = set()

    @contextmanager
    def hold(self, *keys: str):
        """Hold every key or raise ABORTED naming the busy one; keys are released on exit."""
        keys = tuple(sorted(set(k for k in keys if k)))
        with self._guard:
            busy = [k for k in keys if k in self._busy]
            if busy:
                raise CsiError(grpc.StatusCode.ABORTED,
                               f"an operation on {busy[0]} is already in progress; retry later")
            self._busy.update(keys)
        try:
            yield
        finally:
            with self._guard:
                self._busy.difference_update(keys)

    def busy(self, key: str) -> bool:
        with self._guard:
            return key in self._busy
