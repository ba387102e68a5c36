"""Store garbage collection on a schedule, never racing a publish.

The store's GC (``Store.gc(high, low)``) removes unleased revisions and blobs,
least-recently-used first, once the store's content is above a high watermark, down to a
low one. The watermarks are given either

- in bytes of store content (``--gc-high-water-bytes``, ``--gc-low-water-bytes``), a
  fixed budget; or
- as shares of the store filesystem (``--gc-high-water-percent``, what the chart sets
  by default): GC runs when the *filesystem* is fuller than that share (``df``'s Use%:
  used / (used + available)), whatever else fills it, and frees store content until it
  is at the low share. Each pass turns the shares into store bytes from the
  filesystem's numbers then.

Bytes win when both are given; the low watermark defaults to 80% of the high one. The
bridge collects every ``--gc-interval`` seconds, after each unpublish, after each new
revision it publishes or stages, and after a delivery that ran out of space. Between a
fetch finishing and the publish taking its lease, a revision is unleased; the publisher
and the collector share :attr:`Collector.guard`, so GC never runs inside that window.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("resident.bridge.gc")


class Collector:
    def __init__(self, store, high_water_bytes: int | None, low_water_bytes: int | None,
                 interval_seconds: float = 300.0, high_water_percent: float | None = None,
                 low_water_percent: float | None = None,
                 on_failure: Callable[[], None] = lambda: None):
        if high_water_bytes is not None:
            low_water_bytes = high_water_bytes * 8 // 10 if low_water_bytes is None else low_water_bytes
            if not 0 <= low_water_bytes <= high_water_bytes:
                raise ValueError(f"GC watermarks need 0 <= low ({low_water_bytes}) <= high "
                                 f"({high_water_bytes}) bytes")
            high_water_percent = low_water_percent = None
        elif high_water_percent is not None:
            low_water_percent = high_water_percent * 0.8 if low_water_percent is None else low_water_percent
            if not 0 < low_water_percent <= high_water_percent <= 100:
                raise ValueError(f"GC watermarks need 0 < low ({low_water_percent}) <= high "
                                 f"({high_water_percent}) <= 100 percent")
        self.store = store
        self.high_bytes, self.low_bytes = high_water_bytes, low_water_bytes
        self.high_percent, self.low_percent = high_water_percent, low_water_percent
        self.interval = interval_seconds
        self.on_failure = on_failure   # counts failed passes (resident_store_gc_failures_total)
        self.guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.high_bytes is not None or self.high_percent is not None

    def watermarks(self) -> tuple[int, int] | None:
        """(high, low) in bytes of store content, now; None when GC is off."""
        if self.high_bytes is not None:
            return self.high_bytes, self.low_bytes
        if self.high_percent is None:
            return None
        fs = self.store.filesystem_bytes()
        usable = fs.used + fs.available                    # df's Use% is used / usable
        others = max(0, fs.used - self.store.usage_bytes())  # what is not the store's
        high = max(0, int(usable * self.high_percent / 100) - others)
        return high, min(high, max(0, int(usable * self.low_percent / 100) - others))

    def collect(self) -> list[str]:
        """One GC pass (no-op when disabled); returns the removed revision digests."""
        if not self.enabled:
            return []
        with self.guard:
            try:
                high, low = self.watermarks()
                removed = self.store.gc(high, low)
            except Exception as e:  # GC failing must not take the bridge down
                log.error("store GC failed", extra={"error": f"{type(e).__name__}: {e}"})
                self.on_failure()
                return []
        if removed:
            log.info("store GC removed revisions", extra={"digest": removed})
        return removed

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="store-gc", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.collect()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
