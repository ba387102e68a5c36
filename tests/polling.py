"""Waiting in tests: poll a probe until it holds, and fail with what it last returned.

Every layer waits for something the system does on its own time (a watch event, a
kubelet sync, a Pod's deletion); one helper does it everywhere, so a timeout always
says what was awaited and what was seen instead.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(probe: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
             every: float = 0.2) -> Any:
    """``probe()``'s first truthy value; AssertionError with its last value after ``timeout`` s."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
