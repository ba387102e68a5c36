"""Store garbage collection on a schedule, never racing a publish.

The store's GC (``Store.gc(high, low)``) removes unleased revisions and blobs,
least-recently-used first, once usage is above the high watermark. The bridge runs it
every ``--gc-interval`` seconds and after each unpublish, when ``--gc-high-water-bytes``
is set. Between a fetch finishing and the publish taking its lease, a revision is
unleased; the publisher and the collector share :attr:`Collector.guard`, so GC never
runs inside that window.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("resident.bridge.gc")


class Collector:
    def __init__(self, store, high_water_bytes: int | None, low_water_bytes: int | None,
                 interval_seconds: float = 300.0):
        if high_water_bytes is not None:
            low = high_water_bytes * 8 // 10 if low_water_bytes is None else low_water_bytes
            if not 0 <= low <= high_water_bytes:
                raise ValueError("GC watermarks need 0 <= low <= high")
            low_water_bytes = low
        self.store, self.high, self.low = store, high_water_bytes, low_water_bytes
        self.interval = interval_seconds
        self.guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.high is not None

    def collect(self) -> list[str]:
        """One GC pass (no-op when disabled); returns the removed revision digests."""
        if not self.enabled:
            return []
        with self.guard:
            try:
                removed = self.store.gc(self.high, self.low)
            except Exception as e:  # GC failing must not take the bridge down
                log.error("store GC failed", extra={"error": f"{type(e).__name__}: {e}"})
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
