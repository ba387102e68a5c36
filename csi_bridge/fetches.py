"""Background materialization: a fetch outlives the CSI call that started it.

kubelet gives NodePublishVolume two minutes. Fetching a large bundle may take longer, so
a publish starts (or joins) one *fetch* per revision digest in a thread, waits up to its
own deadline, and if the fetch is still running answers ABORTED with the progress in the
message. kubelet retries; the retry joins the same fetch and, once it is done, finishes
the publish. A fetch that moved no byte for a while is *stalled*: the publish says so
instead of reporting progress. A failed fetch is reported to the next caller and
forgotten, so the retry after that starts afresh (the publisher keeps the failure, to
answer with it while that retry runs).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from bundle.sources import SourceCredentials


@dataclass
class Fetch:
    digest: str
    source: str
    credentials: SourceCredentials | None = field(default=None, repr=False)   # of the first caller
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    bytes_done: int = 0
    bytes_total: int = 0
    result: object = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def progress(self, n: int) -> None:
        self.bytes_done += n
        self.last_progress = time.monotonic()

    def idle_seconds(self) -> float:
        """Seconds since the last byte arrived (or since the start)."""
        return time.monotonic() - self.last_progress

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def describe(self) -> str:
        pct = f" ({100 * self.bytes_done / self.bytes_total:.0f}%)" if self.bytes_total else ""
        return (f"fetching {self.digest} from {self.source}: {self.bytes_done} of "
                f"{self.bytes_total or '?'} bytes{pct} after {time.monotonic() - self.started:.0f}s")


class Fetches:
    """One running fetch per digest; ``run(fetch)`` does the work (open source, materialize)."""

    def __init__(self, run: Callable[[Fetch], object]):
        self._run = run
        self._lock = threading.Lock()
        self._jobs: dict[str, Fetch] = {}

    def start(self, digest: str, source: str, credentials: SourceCredentials | None = None) -> Fetch:
        with self._lock:
            job = self._jobs.get(digest)
            if job is None:
                job = self._jobs[digest] = Fetch(digest, source, credentials)
                threading.Thread(target=self._work, args=(job,), daemon=True,
                                 name=f"fetch-{digest[7:19]}").start()
            return job

    def _work(self, job: Fetch) -> None:
        try:
            job.result = self._run(job)
        except BaseException as e:  # reported to the caller that collects the fetch
            job.error = e
        finally:
            job.done.set()

    def wait(self, job: Fetch, timeout: float) -> bool:
        """Wait up to ``timeout``; True when done. A done job is forgotten (retry starts anew)."""
        if not job.done.wait(max(0.0, timeout)):
            return False
        with self._lock:
            if self._jobs.get(job.digest) is job:
                del self._jobs[job.digest]
        return True

    def running(self) -> list[Fetch]:
        with self._lock:
            return [j for j in self._jobs.values() if not j.done.is_set()]
