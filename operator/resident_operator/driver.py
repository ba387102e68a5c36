"""The model's driver: one asyncio loop per ResidentModel runs every pass of that model.

A pass runs when something it depends on changed, never on a tick:
- the model's own spec (a new ``metadata.generation``) or its deletion;
- a child labelled with the model's UID: an owner Pod (scheduled, running, ready, deleted),
  the token Secret, a BundleDelivery (Staged, Failed, released);
- an owner's answer to ``GET /v1/transitions/{id}?waitSeconds=N``: the driver waits on the
  owner (asynchronously, no thread held) and wakes the model when the transition ends;
- a time the previous pass asked for (:class:`~.context.FollowUp`): a step's timeout, a
  retry of an unreachable owner or of a source the model reads alone (``file://``, a 404);
- the probe of a source that was down answering (:func:`probe_source`): one probe per
  source, whatever the number of models waiting on it (``source_probes.py``);
- the slow safety resync (``RESIDENT_RESYNC_SECONDS``, with jitter). A due resync waits
  for its turn (:class:`ResyncTurns`): all models' resyncs together pass at most
  ``RESIDENT_RESYNC_PASSES_PER_SECOND`` models a second, so with many models each one's
  resync comes less often, never in a burst (models created together come due together).

A pass that made progress asks to run again at once, so the steps of a transition follow
each other with no delay. The wake flag is cleared before the pass reads anything: any
number of events during a pass cause exactly one more pass (bursts coalesce), and since
this loop is the only caller, passes of one model never overlap. The pass itself is
blocking code (API and owner calls); it runs in a bounded thread pool and holds the
model's ``threading.Lock``, which the delete handler also takes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import threading
import time
from concurrent.futures import Executor
from typing import Any, Callable

import aiohttp

from . import metrics
from .context import FollowUp, OwnerWait
from .owner_client import OwnerCalls
from .source_probes import SourceProbes

log = logging.getLogger("resident.operator")
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5, sock_connect=3)


class ModelHandle:
    """What the operator keeps in memory for one model: its wake flag, its pass lock, the
    owner transitions it waits on, and the children its status records (for the sweep: when
    they last changed, and when the sweep last looked at the model closely)."""

    def __init__(self, namespace: str, name: str, uid: str) -> None:
        self.namespace, self.name, self.uid = namespace, name, uid
        self.wake = asyncio.Event()
        self.lock = threading.Lock()
        self.waiters: dict[str, asyncio.Task] = {}
        self.recorded: set[str] = set()
        self.recorded_at = float("-inf")   # time.monotonic() when ``recorded`` last changed
        self.swept_at = float("-inf")      # time.monotonic() of the sweep's last close look
        self.generation: Any = None
        self.known: dict[str, Any] = {}   # what passes may reuse (the token); see passes.run_pass

    def record(self, uids: set[str]) -> None:
        """The children the model's status now records, as the model watch told."""
        if uids != self.recorded:
            self.recorded, self.recorded_at = uids, time.monotonic()

    def poke(self, cause: str) -> None:
        """Ask for a pass (call on the operator's event loop: asyncio.Event is not thread-safe).
        A cause in :data:`FORGETS` also makes the next pass read again what it names."""
        metrics.WAKES.labels(cause=cause).inc()
        if cause in FRESH_READS:
            self.known["read_model"] = True
        if cause in FORGETS:
            self.known["epoch"] = self.known.get("epoch", 0) + 1
            for key in FORGETS[cause]:
                self.known.pop(key, None)
        self.wake.set()


# What a pass reuses from earlier passes (``ModelHandle.known``), and the events after
# which it must read it again: the owners' token after a change of its Secret; the
# companions (Service, PodDisruptionBudget, NetworkPolicy), checked while ``endpoint`` is
# known, after a change of any of them or of the spec; both when the sweep, which lists
# every child kind each minute, finds the model's children differ from its records (a
# watch event missed). The safety resync, which costs every model, reads the model and
# its Pods again but trusts the watch and the sweep for the rest.
FORGETS = {"secret": ("token",), "model": ("endpoint",), "service": ("endpoint",),
           "budget": ("endpoint",), "control-policy": ("endpoint",), "sweep": ("token", "endpoint")}
# The causes after which a pass reads its model from the API server, not the watch's copy
# (passes.py): the safety resync, in case the watch missed the model's own event. (The
# sweep's close look reads the model afresh itself, and its copy goes into the cache.)
FRESH_READS = {"resync"}


class ResyncTurns:
    """Turns for the safety resyncs of all models, at most ``per_second`` a second, first
    come first served (used on the operator's event loop only). The resync is a net under
    the watches: at 3,000 models and 3 a second each model's comes every 1,000 s or so, and
    it never becomes the operator's main work. A model woken by an event while it waits
    for its turn lets the turn go unused."""

    def __init__(self, per_second: float) -> None:
        self.interval = 1.0 / per_second
        self.free_at = float("-inf")

    def take(self, now: float) -> float:
        """Take the next free turn: seconds from ``now`` (monotonic) until it comes."""
        turn = max(now, self.free_at)
        self.free_at = turn + self.interval
        return turn - now


def next_wait(follow: FollowUp, resync_seconds: float, on_probe: bool = False
              ) -> tuple[float | None, bool]:
    """Seconds until the next pass if no event comes (0 to go on at once, else the earliest
    due time, at most the safety resync, jittered by up to 10 % so models spread out), and
    whether that wait is the safety resync. A model that waits on the probe of a source
    that is down (``on_probe``) has no resync (None: until woken): the probe wakes it when
    the source answers, and until then a resync would find it down again."""
    if follow.again:
        return 0.0, False
    if on_probe:
        return follow.due, False
    resync = resync_seconds * random.uniform(0.9, 1.0)
    if follow.due is not None and follow.due < resync:
        return follow.due, False
    return resync, True


async def drive(handle: ModelHandle, stopped: Any, run_pass: Callable[[], FollowUp | None],
                pool: Executor, session: aiohttp.ClientSession, resync_seconds: float,
                sources: SourceProbes | None = None, owner_calls: OwnerCalls | None = None,
                resync_turns: ResyncTurns | None = None) -> None:
    """Run passes until the model is deleted (``stopped``) or gone. ``owner_calls`` waits
    on owner transitions (none are waited on without it); a due safety resync waits for
    its turn in ``resync_turns`` (none: at once)."""
    loop = asyncio.get_running_loop()
    wait, resync = 0.0, False
    try:
        while not stopped:
            await _sleep(handle.wake, stopped, wait)
            if stopped:
                break
            if resync and not handle.wake.is_set() and resync_turns is not None:
                await _sleep(handle.wake, stopped, resync_turns.take(time.monotonic()))
                if stopped:
                    break
            if resync and not handle.wake.is_set():
                handle.poke("resync")
            handle.wake.clear()
            # kopf.event() reads kopf's context variables: run the pass in a copy of them
            follow = await loop.run_in_executor(pool, contextvars.copy_context().run, run_pass)
            if follow is None:
                break
            for owner in follow.owner_waits if owner_calls is not None else ():
                if owner.url not in handle.waiters:
                    handle.waiters[owner.url] = asyncio.create_task(
                        _wait_owner(handle, owner, owner_calls), name=f"owner-wait {owner.url}")
            for source, error in follow.source_waits if sources is not None else ():
                opened = sources.wait(source, handle, error, time.monotonic())
                if opened is not None:   # this model found the source down first
                    opened.task = asyncio.create_task(probe_source(sources, opened.key, session),
                                                      name=f"source-probe {opened.key}")
            wait, resync = next_wait(follow, resync_seconds,
                                     on_probe=sources is not None and bool(follow.source_waits))
    finally:
        for task in list(handle.waiters.values()):
            task.cancel()
        for probe in sources.leave(handle) if sources is not None else ():
            if probe.task is not None:
                probe.task.cancel()
        if owner_calls is not None:
            owner_calls.forget_model(handle.uid)


async def _sleep(wake: asyncio.Event, stopped: Any, timeout: float | None) -> None:
    """Until woken, stopped, or ``timeout`` s (None: no timeout)."""
    if wake.is_set() or (timeout is not None and timeout <= 0):
        return
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def _wait_owner(handle: ModelHandle, owner: OwnerWait, calls: OwnerCalls) -> None:
    """Wait until the owner's transition has a result (or the owner stops answering),
    then wake the model."""
    try:
        await calls.wait_transition(owner)
        handle.poke("owner")
    finally:
        handle.waiters.pop(owner.url, None)


async def probe_source(sources: SourceProbes, key: str, session: aiohttp.ClientSession | None) -> None:
    """Probe the source ``key`` on its backoff until it answers, then wake every model that
    waits on it; stop when no model waits any more (``source_probes.py``). Its waiters have
    no safety resync meanwhile, so if the probe itself fails it wakes them all to read the
    source again (the first to find it down opens a new probe)."""
    try:
        await _probe_until_answered(sources, key, session)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - the waiters must not be left asleep
        log.exception("the probe of a source failed; its models read it again", extra={"source": key})
        for waiter in sources.answered(key, time.monotonic()):
            waiter.poke("source")


async def _probe_until_answered(sources: SourceProbes, key: str,
                                session: aiohttp.ClientSession | None) -> None:
    while (due := sources.next_probe(key)) is not None:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if sources.next_probe(key) is None:
            return
        error = await _probe_once(session, key + "/")
        metrics.SOURCE_PROBES.labels(result="down" if error else "answered").inc()
        if error is None:
            waiters = sources.answered(key, time.monotonic())
            log.info("source answers again", extra={"source": key, "models": len(waiters)})
            for waiter in waiters:
                waiter.poke("source")
            return
        sources.failed(key, error, time.monotonic())


async def _probe_once(session: aiohttp.ClientSession | None, url: str) -> str | None:
    """None if ``url`` answers (any HTTP status below 500 but 429), else why not. TLS is not
    verified: the probe trusts nothing it reads, it only asks whether the server answers;
    the models' own reads verify it."""
    if session is None:
        return "no HTTP session"
    try:
        async with session.get(url, timeout=PROBE_TIMEOUT, allow_redirects=False, ssl=False) as resp:
            if resp.status < 500 and resp.status != 429:
                return None
            return f"GET {url}: HTTP {resp.status}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return f"GET {url}: {type(e).__name__}: {e}"
