"""The owner runtime: one backend, its state, and the lock that keeps inference and
transitions apart.

State machine: ``loading`` until the start revision is loaded (and, with warmup, every
compiled variant has run once), then ``ready``. A transition moves to ``transitioning``
and back to ``ready``, or to ``unloaded`` (the model is gone: a reload failed after the
old runtime was closed, or an in-place restore failed) or ``quarantined`` (staged memory
could not be released: inference continues, transitions are refused). Readiness
(``/readyz``) is ``ready``, or ``transitioning`` in place: only a reload takes the owner
out of its Service's endpoints (``reloading``), from its drain until the new revision
answered.

Locks: ``revision_lock`` (:mod:`owner.revision_lock`) is shared by every request for its
whole generation and held alone by the part of a transition that touches live weights,
so a request is served wholly by the old or the new revision, never a mix; ``engine``
serializes the requests' backend calls (a backend is not thread-safe);
``transition_guard`` is taken without waiting, so a second transition while one runs is
refused instead of queued; ``finished`` wakes whoever waits for a transition's result
(``GET /v1/transitions/{id}?waitSeconds=N``), so the operator steps on at once.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import api
from .backends.base import Backend, BackendError, first_token
from .metrics import OwnerMetrics
from .preload import Preloads
from .revision_lock import LockClosed, RevisionLock, WaitExpired
from .revisions import Revision, RevisionError, RevisionNotFound, open_revision
from .transitions import new_status, run_transition

log = logging.getLogger("resident.owner")

MAX_REMEMBERED = 100
RETRY_AFTER_SECONDS = 1
DRAIN_QUIET_SECONDS = 1.0    # a drain ends when no request came for this long at least,
QUIET_GAPS = 8               # and for this many of the usual gaps between requests,
QUIET_CEILING_SECONDS = 6.0  # but never needs more quiet than this
DRAIN_LIMIT_SECONDS = 60.0   # and ends at the latest this long after it began


class Arrivals:
    """When the inference port last got a request, and the usual gap between two requests
    (a moving average). A drain waits until clients stop coming; with sparse traffic a
    quiet second means nothing (a proxy that still sends here may simply not have picked
    this Pod for a while), so the quiet it waits for grows with the usual gap: ``QUIET_GAPS``
    of them, at least ``floor``, at most ``QUIET_CEILING_SECONDS`` (or ``floor`` if larger)."""

    WEIGHT = 0.1   # of the newest gap in the average

    def __init__(self) -> None:
        self.last = 0.0       # monotonic time of the last request; 0: none yet
        self.mean_gap = 0.0   # seconds; 0: fewer than two requests yet
        self._lock = threading.Lock()

    def note(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            if self.last:
                gap = now - self.last
                self.mean_gap = gap if not self.mean_gap else self.mean_gap + self.WEIGHT * (gap - self.mean_gap)
            self.last = now

    def quiet_seconds(self, floor: float) -> float:
        return max(floor, min(QUIET_GAPS * self.mean_gap, QUIET_CEILING_SECONDS))


def wait_quiet(arrivals: Arrivals, floor: float, limit_seconds: float, at_least: float = 0.0,
               stop: threading.Event | None = None) -> float:
    """Wait until ``at_least`` seconds passed and the last request is
    ``arrivals.quiet_seconds(floor)`` old, at most ``limit_seconds``, or until ``stop`` is
    set; returns the seconds waited. Proxies send clients to a Pod for a moment after it
    left the endpoints: ending at once would reset their connections, or turn them away."""
    start = time.monotonic()
    while stop is None or not stop.is_set():
        now = time.monotonic()
        if now - start >= limit_seconds or (
                now - start >= at_least and now - max(arrivals.last, start) >= arrivals.quiet_seconds(floor)):
            break
        time.sleep(min(0.05, floor))
    return time.monotonic() - start


class StartupError(RuntimeError):
    """The owner could not load or warm up its start revision."""


class Refused(Exception):
    """A request the owner will not serve now or at all; ``status`` is the HTTP code,
    ``retry_after`` (seconds) is set when trying again soon may succeed."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass
class PendingCommit:
    """A Deferred transition's decision: ("commit" | "abort", why), once one was made."""
    hold_seconds: float
    decision: tuple[str, str] | None = None
    decided: threading.Event = field(default_factory=threading.Event)


class Owner:
    def __init__(self, bundle_dir: Path | str, backend: Backend, warmup: bool = False,
                 metrics: OwnerMetrics | None = None, apply_wait_seconds: float = 30.0):
        self.bundle_dir = Path(bundle_dir)
        self.backend = backend
        self.warmup = warmup
        self.metrics = metrics or OwnerMetrics()
        self.apply_wait_seconds = apply_wait_seconds
        self.revision_lock = RevisionLock()
        self.preloads = Preloads(self)    # a revision loaded beside the live one ahead of a switch
        self.engine = threading.Lock()
        self.reloading = False
        self.closing = threading.Event()  # cuts a reload's drain short at shutdown
        self.arrivals = Arrivals()        # requests to the inference port: what the drains wait out
        self.terminating = False          # SIGTERM came: not ready while the last requests drain
        self.transition_guard = threading.Lock()
        self.finished = threading.Condition()   # notified when a transition's result is set
        self.transitions: dict[str, api.TransitionStatus] = {}
        self.commits: dict[str, PendingCommit] = {}   # Deferred transitions' commit decisions
        self.threads: list[threading.Thread] = []
        self._state = "loading"
        self.reason = ""
        self.metrics.set_state("loading")
        self.metrics.ready.set_function(lambda: float(self.ready))

    # -- state -------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str, reason: str = "") -> None:
        if state != self._state:
            log.info("owner state changes", extra={"from_state": self._state, "to_state": state,
                                                    "reason": reason})
        self._state, self.reason = state, reason
        self.metrics.set_state(state)

    @property
    def ready(self) -> bool:
        if self.terminating:   # SIGTERM: answering what still comes, but take no new clients
            return False
        return self._state == "ready" or (self._state == "transitioning" and not self.reloading)

    def live_digest(self) -> str | None:
        ident = self.backend.describe().identity
        return ident["bundle"] if ident else None

    def identity(self) -> api.IdentityResponse:
        d = self.backend.describe()
        ident = api.Identity(**d.identity) if d.identity else None
        where = d.residency and api.Residency(device=d.residency.device, dtype=d.residency.dtype,
                                              bytesResident=d.residency.bytes)
        return api.IdentityResponse(state=self.state, identity=ident, backend=d.backend,
                                    capabilities=api.Capabilities(inPlace=d.in_place), residency=where,
                                    preload=self.preloads.current())

    def current(self) -> Revision | None:
        return getattr(self.backend, "revision", None)

    # -- start -------------------------------------------------------------------
    def start(self) -> None:
        """Load ``current`` and warm up; on any failure close the engine and raise."""
        try:
            rev = open_revision(self.bundle_dir)
            report = self.backend.load(rev)
            self.metrics.load.labels(phase="read").observe(report.read_seconds)
            self.metrics.load.labels(phase="compile").observe(report.compile_seconds)
            if self.warmup:
                self.warm_up()
        except Exception as e:
            self.backend.close()
            self.set_state("unloaded", f"startup failed: {e}")
            raise StartupError(f"{type(e).__name__}: {e}") from e
        log.info("owner loaded", extra={"bundle": rev.digest, "warmup": self.warmup,
                                        "read_seconds": report.read_seconds,
                                        "compile_seconds": report.compile_seconds})
        self.set_state("ready")

    def warm_up(self) -> None:
        """One token on every compiled variant (at start, and after a reload compiled anew)."""
        for variant in self.backend.variants():
            first_token(self.backend, variant)

    def drain(self, at_least: float) -> float:
        """A reload's drain: not ready and still serving the old revision, for ``at_least``
        seconds (the operator's readiness period and a margin), then until no request came
        for ``DRAIN_QUIET_SECONDS`` and several of the usual gaps between requests
        (:class:`Arrivals`), at most ``DRAIN_LIMIT_SECONDS`` in all; returns the seconds it
        took. Taking the owner out of the Service goes kubelet -> API server ->
        EndpointSlice -> every node's kube-proxy: while that path is slow or down (an API
        server restarting, a kubelet killed), clients are still sent here, and the old
        revision answers them instead of a 503. Shutdown cuts it short."""
        return wait_quiet(self.arrivals, DRAIN_QUIET_SECONDS, max(at_least, DRAIN_LIMIT_SECONDS),
                          at_least=at_least, stop=self.closing)

    def drain_for_shutdown(self, quiet_seconds: float, limit_seconds: float) -> float:
        """After SIGTERM: keep answering until no request came to the inference port for
        ``quiet_seconds`` and several of the usual gaps between requests, at most
        ``limit_seconds``; returns the seconds it waited. The Pod
        leaves its Service's endpoints when it is deleted, but each node's kube-proxy follows
        a moment later."""
        return wait_quiet(self.arrivals, quiet_seconds, limit_seconds)

    # -- inference ---------------------------------------------------------------
    @contextmanager
    def serving(self) -> Iterator[str]:
        """Hold the live revision, and the engine, for one request; yields its bundle digest.

        Waits at most ``apply_wait_seconds`` behind an in-place apply; during a reload, or
        with no model loaded, refuses at once with 503 and a Retry-After."""
        try:
            with self.revision_lock.shared(self.apply_wait_seconds):
                digest = self.live_digest()
                if self.state in ("loading", "unloaded") or digest is None:
                    raise Refused(503, f"owner is {self.state}; no model to run {self.reason}".strip(),
                                  RETRY_AFTER_SECONDS)
                with self.engine:
                    yield digest
        except LockClosed:
            raise Refused(503, "the owner is reloading its model", RETRY_AFTER_SECONDS) from None
        except WaitExpired as e:
            raise Refused(503, f"{e}; try again", RETRY_AFTER_SECONDS) from None

    def generate(self, req: api.GenerateRequest) -> api.GenerateResponse:
        t0 = time.perf_counter()
        with self.serving():
            try:
                out = self.backend.generate(req.prompt, req.max_tokens)
            except BackendError as e:
                raise Refused(400, str(e)) from None
            ident = self.backend.describe().identity
        self.metrics.generate.observe(time.perf_counter() - t0)
        self.metrics.first_token.observe(out.first_token_seconds)
        return api.GenerateResponse(text=out.text, tokens=out.tokens, identity=api.Identity(**ident),
                                    firstTokenSeconds=out.first_token_seconds)

    def probe(self) -> float:
        """Wall time of one token from the live model (the transitions' first-token check and
        figure); raises what the backend raised when the model answers no token."""
        t0 = time.perf_counter()
        first_token(self.backend)
        return time.perf_counter() - t0

    # -- transitions -------------------------------------------------------------
    def submit(self, req: api.TransitionRequest) -> api.TransitionStatus:
        """Check the request, then run the transition in a thread; refuse with 4xx."""
        if self.state in ("quarantined", "unloaded", "loading"):
            raise Refused(409, f"owner is {self.state}; transitions are refused {self.reason}".strip())
        if not self.transition_guard.acquire(blocking=False):
            running = [t.id for t in self.transitions.values() if t.result == "running"]
            raise Refused(409, f"transition {', '.join(running) or '?'} is already running")
        try:
            target = self._target(req)
            status = new_status(self, req, target)
        except BaseException:
            self.transition_guard.release()
            raise
        self._remember(status)
        if req.commit == "Deferred":
            self.commits[status.id] = PendingCommit(req.hold_seconds)
        thread = threading.Thread(target=run_transition, args=(self, status, target, req.drain_seconds,
                                                               req.leave_endpoints),
                                  name=f"transition-{status.id}", daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()
        return status

    def preload(self, req: api.PreloadRequest) -> api.PreloadStatus:
        """Load ``req.target``, staged in the volume, beside the live revision (owner/preload.py)."""
        if self.state in ("quarantined", "unloaded", "loading"):
            raise Refused(409, f"owner is {self.state}; preloads are refused {self.reason}".strip())
        if req.target == self.live_digest():
            raise Refused(409, f"{req.target} is the live revision: nothing to preload")
        return self.preloads.request(self._staged(req.target))

    def _staged(self, digest: str) -> Revision:
        """Revision ``digest`` in the volume; 404 when it is not staged, 400 when it is unusable."""
        try:
            return open_revision(self.bundle_dir, digest)
        except RevisionNotFound as e:
            raise Refused(404, str(e)) from None
        except RevisionError as e:
            raise Refused(400, str(e)) from None

    def _target(self, req: api.TransitionRequest) -> Revision:
        target = self._staged(req.target)
        cur = self.current()
        if req.path == "GraphOnly" and cur and cur.manifest.weights_digest != target.manifest.weights_digest:
            raise Refused(400, "path GraphOnly, but the target's weights differ from the live ones")
        return target

    def await_commit(self, status: api.TransitionStatus) -> bool:
        """Between a transition's prepare and its apply: True at once for a one-step
        transition; a Deferred one is published ``prepared`` and waits for its commit
        (True, result ``running`` again) or abort, hold expiry or shutdown (False)."""
        pending = self.commits.get(status.id)
        if pending is None:
            status.committed_at = time.time()
            return True
        status.prepared_at = time.time()
        self.finish(status, "prepared")
        pending.decided.wait(pending.hold_seconds)
        with self.finished:   # decided under the same lock as commit() and abort() check
            decision = pending.decision or ("abort", f"no commit within {pending.hold_seconds:g}s "
                                                     "of the prepare")
            pending.decision = decision
            if decision[0] == "commit":   # _decide set the result back to running
                status.committed_at = time.time()
                return True
            status.reason = f"aborted: {decision[1]}; nothing changed, {status.from_} serves"
            return False

    def commit(self, tid: str) -> api.TransitionStatus:
        return self._decide(tid, "commit", "")

    def abort(self, tid: str, why: str = "the operator aborted it") -> api.TransitionStatus:
        return self._decide(tid, "abort", why)

    def _decide(self, tid: str, decision: str, why: str) -> api.TransitionStatus:
        with self.finished:
            status, pending = self.transitions.get(tid), self.commits.get(tid)
            if status is None:
                raise Refused(404, f"no transition {tid}")
            if pending is not None and pending.decision and pending.decision[0] == decision:
                return status.model_copy(deep=True)   # said before: the same answer again
            if pending is None or status.result != "prepared" or pending.decision:
                raise Refused(409, f"transition {tid} is {status.result}, not prepared: "
                                   f"it cannot be told to {decision}")
            pending.decision = (decision, why)
            pending.decided.set()
            if decision == "commit":
                status.result = "running"
            return status.model_copy(deep=True)

    def finish(self, status: api.TransitionStatus, result: str) -> None:
        """Publish a transition's result (its last field) and wake every waiter."""
        with self.finished:
            status.result = result
            self.finished.notify_all()

    def wait_transition(self, tid: str, seconds: float) -> api.TransitionStatus | None:
        """A copy of the transition ``tid`` once it has a result, or as it is after ``seconds``.

        The copy is taken under the lock ``finish`` sets the result under, and the result is
        set after identity and state: an answer that says succeeded names the new identity,
        whatever order the fields are serialized in."""
        with self.finished:
            self.finished.wait_for(lambda: self.transitions.get(tid) is None
                                   or self.transitions[tid].result != "running", timeout=seconds)
            status = self.transitions.get(tid)
            return None if status is None else status.model_copy(deep=True)

    def _remember(self, status: api.TransitionStatus) -> None:
        self.transitions[status.id] = status
        while len(self.transitions) > MAX_REMEMBERED:
            oldest = next(iter(self.transitions))
            if self.transitions[oldest].result == "running":
                break
            del self.transitions[oldest]

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Join transition threads (tests and shutdown)."""
        for t in list(self.threads):
            t.join(timeout)

    def close(self) -> None:
        self.closing.set()
        with self.finished:
            for pending in self.commits.values():   # a prepared transition does not hold us up
                if pending.decision is None:
                    pending.decision = ("abort", "the owner is stopping")
                    pending.decided.set()
        self.wait_idle()
        self.preloads.drop()
        with self.revision_lock.exclusive(closed=True):
            self.backend.close()
