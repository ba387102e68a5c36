"""Calls from the operator to an owner's control API (docs/contracts.md), and their gate.

An owner listens on ``podIP:spec.runtime.port`` (or on ``RESIDENT_OWNER_HOST`` when the
installation says so, e.g. 127.0.0.1 on a single-node local cluster) and requires the
model's bearer token. A connection failure or a non-2xx answer raises
:class:`OwnerUnreachable` with the address and what went wrong, never the token.

**Owners never stall the operator.** Every call goes through one :class:`OwnerCalls`, the
only place that decides owner-call concurrency and timeouts (from ``settings.py``):
- the calls run on the operator's event loop (aiohttp), so a waiting call holds no thread;
  a pass thread that needs answers submits all its owners' calls at once and waits for
  them together;
- at most ``RESIDENT_OWNER_CALLS`` calls are in flight across the operator and at most
  ``RESIDENT_OWNER_CALLS_PER_MODEL`` for one model; a call that finds no free slot within
  the timeout fails as :class:`OwnerCallsBusy` (the operator's fault, not the owner's);
- a call that gets no answer within ``RESIDENT_OWNER_TIMEOUT_SECONDS`` marks its owner
  **unresponsive** (:class:`OwnerUnresponsive`). While marked, every call to that owner
  fails at once, without touching the network, so a pass never waits on a hung owner
  twice; one background probe per marked owner asks ``/v1/identity`` every
  ``RESIDENT_OWNER_RECHECK_SECONDS`` and, when the owner answers anything (or refuses the
  connection: it is no longer hung), clears the mark and wakes the model. The probes are
  bounded by as many slots of their own, so hung owners never hold a slot a pass needs;
- every call opens its own connection and closes it after the answer (no keep-alive
  pool). A pooled connection stays with the process it was opened to, while an owner's
  address outlives its Pod: ``RESIDENT_OWNER_HOST``, hostNetwork and a reused Pod IP give
  a successor the same host and port, and a terminating owner still answers on the
  connections it holds. A call meant for the new owner would get the old one's answer (a
  quarantined state, or no identity once it closed its model).

When the operator stops, the gate is closed and its event loop stops and closes, while a
pass may still run on its thread: such a pass makes no call and raises
``kopf.TemporaryError``, so it ends without writing what it would have derived from
owners it could not ask. No task of the gate ends in an error either (a call in flight
ends with its answer or its OwnerUnreachable as a value, a probe or a transition wait
just ends): kopf waits for every task on its loop as it stops and re-raises any that
failed, which would fail the operator's exit.

Waiting on an owner's transition (``GET /v1/transitions/{id}?waitSeconds=N``) is a long
poll by design; it takes no slot (there is one per owner transition in flight) and holds
no thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import kopf

from . import metrics, retry_policy
from .context import OwnerWait
from .settings import OperatorSettings

log = logging.getLogger("resident.operator")
OWNER_WAIT_SECONDS = 30      # one waiting GET of a transition; the owner allows up to 60
UNREACHABLE_PAUSE = 1.0      # a transition wait that failed: wake the model, but not in a loop


class OwnerUnreachable(RuntimeError):
    """The owner did not answer, or answered with an error status."""


class OwnerUnresponsive(OwnerUnreachable):
    """The owner accepted no call or gave no answer within the owner-call timeout."""


class OwnerCallsBusy(OwnerUnreachable):
    """No owner-call slot came free in time: the operator is busy, the owner is not to blame."""


@dataclass(frozen=True)
class OwnerRequest:
    """One HTTP call to one owner (``owner`` is its Pod UID, ``model`` its model's UID)."""

    model: str
    owner: str
    method: str
    url: str
    token: str
    body: dict[str, Any] | None = None
    allow: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.method} {self.url}"


@dataclass
class Unresponsive:
    """An owner marked unresponsive: since when, why, and its background probe."""

    model: str
    since: float
    message: str
    probe: OwnerRequest
    task: asyncio.Task | None = field(default=None, repr=False)


class OwnerCalls:
    """The operator's one gate for owner calls (see the module docstring).

    Make it on the operator's event loop; :meth:`call_many` and :meth:`call` are for pass
    threads, everything else runs on the loop. ``wake(model_uid)`` is called on the loop
    when an unresponsive owner of that model answers again."""

    def __init__(self, settings: OperatorSettings, wake: Callable[[str], None] = lambda uid: None
                 ) -> None:
        self.timeout = settings.owner_timeout_seconds
        self.recheck = settings.owner_recheck_seconds
        self.per_model = settings.owner_calls_per_model
        self.loop = asyncio.get_running_loop()
        self.slots = asyncio.Semaphore(settings.owner_calls)
        # the probes of unresponsive owners have slots of their own, as many: hung owners,
        # however many, never hold a slot that a pass needs, of their model or another
        self.probe_slots = asyncio.Semaphore(settings.owner_calls)
        self.model_slots: dict[str, asyncio.Semaphore] = {}
        self.unresponsive: dict[str, Unresponsive] = {}   # owner Pod UID -> mark
        metrics.OWNERS_UNRESPONSIVE.set_function(lambda: len(self.unresponsive))
        self.wake = wake
        self.closed = False
        # force_close: one connection per call, so an answer comes from whoever listens at
        # the owner's address now, never from a predecessor a kept connection leads to
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))

    async def close(self) -> None:
        """The operator stops: no call is made from now on."""
        self.closed = True
        for mark in self.unresponsive.values():
            if mark.task is not None:
                mark.task.cancel()
        await self.session.close()

    # -- from a pass thread -----------------------------------------------------------
    def call_many(self, requests: list[OwnerRequest]) -> list[tuple[int, dict[str, Any]] | OwnerUnreachable]:
        """Send ``requests`` together; each answer, or the OwnerUnreachable it raised. Takes
        at most two timeouts (one for a slot, one for the answer) whatever the owners do."""
        if not requests:
            return []
        if self.closed:
            raise _stopping()
        gather = self._gather(requests)
        try:
            future = asyncio.run_coroutine_threadsafe(gather, self.loop)
        except RuntimeError:   # the loop is closed
            gather.close()
            raise _stopping() from None
        try:
            answers = future.result(timeout=2 * self.timeout + 1.0)
        except concurrent.futures.CancelledError:   # the loop cancelled it as it stopped
            raise _stopping() from None
        except TimeoutError:   # the loop itself is stuck (or stopping): never wait longer
            future.cancel()
            if not self.loop.is_running():
                raise _stopping() from None
            return [OwnerCallsBusy(f"{r.describe()}: the operator's event loop did not run the call")
                    for r in requests]
        if self.closed:   # closed while the calls ran
            raise _stopping()
        return answers

    def call(self, request: OwnerRequest) -> tuple[int, dict[str, Any]]:
        answer, = self.call_many([request])
        if isinstance(answer, OwnerUnreachable):
            raise answer
        return answer

    # -- on the loop ------------------------------------------------------------------
    async def _gather(self, requests: list[OwnerRequest]) -> list[Any]:
        return list(await asyncio.gather(*(self._answer(r) for r in requests)))

    async def _answer(self, r: OwnerRequest) -> tuple[int, dict[str, Any]] | OwnerUnreachable:
        """The answer to ``r``, or the OwnerUnreachable it raised, as a value: the task that
        runs it never fails (see the module docstring on stopping)."""
        if self.closed:
            return OwnerCallsBusy(f"{r.describe()}: the operator is stopping")
        try:
            return await self.send(r)
        except OwnerUnreachable as e:
            return e
        except Exception as e:  # noqa: BLE001 - e.g. the session closed under it as the operator stops
            return OwnerUnreachable(f"{r.describe()}: {type(e).__name__}: {e}")

    async def send(self, r: OwnerRequest) -> tuple[int, dict[str, Any]]:
        """One call through the gate: refused at once for an owner marked unresponsive."""
        mark = self.unresponsive.get(r.owner)
        if mark is not None:
            raise OwnerUnresponsive(mark.message)
        try:
            return await self._send(r)
        except OwnerUnresponsive as e:
            self._mark(r, str(e))
            raise

    async def _send(self, r: OwnerRequest) -> tuple[int, dict[str, Any]]:
        model = self.model_slots.setdefault(r.model, asyncio.Semaphore(self.per_model))
        async with _slot(self.slots, self.timeout, r, "operator"), _slot(model, self.timeout, r, "model"):
            return await self._http(r)

    async def _http(self, r: OwnerRequest) -> tuple[int, dict[str, Any]]:
        """The HTTP call itself, in whatever slot the caller holds."""
        try:
            async with self.session.request(
                    r.method, r.url, json=r.body, headers={"Authorization": f"Bearer {r.token}"},
                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                status, text = resp.status, await resp.text()
        except asyncio.TimeoutError:   # also aiohttp's connect and read timeouts
            raise OwnerUnresponsive(f"{r.describe()}: no answer within {self.timeout:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise OwnerUnreachable(f"{r.describe()}: {type(e).__name__}: {e}") from None
        return answer_of(r, status, text)

    def _mark(self, r: OwnerRequest, message: str) -> None:
        if r.owner in self.unresponsive or self.closed:
            return
        log.warning("owner unresponsive", extra={"owner_uid": r.owner, "model_uid": r.model,
                                                 "error": message})
        probe = OwnerRequest(r.model, r.owner, "GET", r.url.split("/v1/")[0] + "/v1/identity", r.token)
        mark = Unresponsive(r.model, time.time(), message, probe)
        self.unresponsive[r.owner] = mark
        mark.task = asyncio.create_task(self._probe(r.owner, mark), name=f"owner-probe {r.owner}")

    async def _probe(self, owner: str, mark: Unresponsive) -> None:
        """Ask the marked owner again every ``recheck`` s until it answers; then clear the
        mark and wake its model."""
        try:
            while True:
                await asyncio.sleep(self.recheck)
                if self.closed:
                    return
                try:
                    async with _slot(self.probe_slots, self.timeout, mark.probe, "probes"):
                        await self._http(mark.probe)
                except (OwnerUnresponsive, OwnerCallsBusy):
                    continue
                except OwnerUnreachable:
                    pass   # refused or an error status: an answer, so not hung
                except RuntimeError:   # the session closed under it: the operator stops
                    return
                break
        finally:
            if self.unresponsive.get(owner) is mark:
                del self.unresponsive[owner]
        log.info("owner answers again", extra={"owner_uid": owner, "model_uid": mark.model})
        self.wake(mark.model)

    def retain(self, model: str, owners: set[str]) -> None:
        """Forget marks (and stop probes) of ``model``'s owners not in ``owners`` (their Pods
        are gone or terminating). Thread-safe: it runs on the loop."""
        try:
            self.loop.call_soon_threadsafe(self._retain, model, owners)
        except RuntimeError:   # the loop is closed: its marks and probes are gone with it
            raise _stopping() from None

    def _retain(self, model: str, owners: set[str]) -> None:
        for owner, mark in list(self.unresponsive.items()):
            if mark.model == model and owner not in owners:
                del self.unresponsive[owner]
                if mark.task is not None:
                    mark.task.cancel()

    def forget_model(self, model: str) -> None:
        """On the loop, when the model's driver ends."""
        self._retain(model, set())
        self.model_slots.pop(model, None)

    async def wait_transition(self, owner: OwnerWait) -> None:
        """Return when the owner's transition has a result, or the owner stops answering."""
        headers = {"Authorization": f"Bearer {owner.token}"}
        timeout = aiohttp.ClientTimeout(total=OWNER_WAIT_SECONDS + self.timeout)
        while not self.closed:
            try:
                async with self.session.get(owner.url, params={"waitSeconds": str(OWNER_WAIT_SECONDS)},
                                            headers=headers, timeout=timeout) as resp:
                    body = await resp.json(content_type=None) if resp.status == 200 else None
            except RuntimeError:   # the session closed under it: the operator stops
                return
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                log.info("owner did not answer a transition wait",
                         extra={"url": owner.url, "error": f"{type(e).__name__}: {e}"})
                await asyncio.sleep(UNREACHABLE_PAUSE)
                return
            if not (isinstance(body, dict) and body.get("result") == "running"):
                return


def _stopping() -> kopf.TemporaryError:
    return kopf.TemporaryError("the operator is stopping: owners are not called",
                                delay=retry_policy.STOPPING_SECONDS)


class _slot:
    """``async with`` a semaphore, waiting at most ``timeout`` for it."""

    def __init__(self, sem: asyncio.Semaphore, timeout: float, r: OwnerRequest, scope: str) -> None:
        self.sem, self.timeout, self.r, self.scope = sem, timeout, r, scope

    async def __aenter__(self) -> None:
        try:
            await asyncio.wait_for(self.sem.acquire(), self.timeout)
        except asyncio.TimeoutError:
            raise OwnerCallsBusy(f"{self.r.describe()}: no free owner-call slot ({self.scope}) "
                                 f"within {self.timeout:g}s") from None

    async def __aexit__(self, *exc: object) -> None:
        self.sem.release()


def answer_of(r: OwnerRequest, status: int, text: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of an owner's answer, or OwnerUnreachable for an error or non-JSON."""
    if status >= 400 and status not in r.allow:
        raise OwnerUnreachable(f"{r.describe()}: HTTP {status}: {text[:300]}")
    try:
        body = json.loads(text)
    except ValueError:
        raise OwnerUnreachable(f"{r.describe()}: answer is not JSON: {text[:200]!r}") from None
    return status, body


class OwnerClient:
    """One owner's control API, through the operator's :class:`OwnerCalls`."""

    def __init__(self, calls: OwnerCalls, model: str, owner: str, host: str, port: int,
                 token: str) -> None:
        host = f"[{host}]" if ":" in host else host
        self.calls, self.model, self.owner = calls, model, owner
        self.base = f"http://{host}:{port}"
        self.token = token

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                allow: tuple[int, ...] = ()) -> OwnerRequest:
        return OwnerRequest(self.model, self.owner, method, self.base + path, self.token, body, allow)

    def identity(self) -> dict[str, Any]:
        return self.calls.call(self.request("GET", "/v1/identity"))[1]

    def start_transition(self, target: str, path: str, strategy: str,
                         drain_seconds: float = 0.0, leave_endpoints: bool = True,
                         hold_seconds: float | None = None) -> dict[str, Any]:
        """Start a transition. A reload first keeps serving, not ready, for ``drain_seconds``
        so that the owner leaves its Service's Endpoints before the old revision closes;
        with ``leave_endpoints`` false it stays in them (a model's only replica). With
        ``hold_seconds`` it only prepares (commit Deferred) and waits that long for its
        commit or abort (a lockstep switch)."""
        body: dict[str, Any] = {"target": target, "path": path, "strategy": strategy}
        if hold_seconds is not None:
            body.update(commit="Deferred", holdSeconds=round(hold_seconds, 3))
        if drain_seconds > 0:   # owners before drains existed accept the request without it
            body["drainSeconds"] = drain_seconds
        if not leave_endpoints:
            body["leaveEndpoints"] = False
        return self.calls.call(self.request("POST", "/v1/transitions", body))[1]

    def wait(self, transition_id: str) -> OwnerWait:
        """How to wait for this transition's result (the driver does it, asynchronously)."""
        return OwnerWait(url=f"{self.base}/v1/transitions/{transition_id}", token=self.token)

    def transition(self, transition_id: str) -> dict[str, Any] | None:
        """The owner's record of a transition, or None if it does not know the id (404)."""
        status, body = self.calls.call(self.request("GET", f"/v1/transitions/{transition_id}",
                                                    allow=(404,)))
        return None if status == 404 else body


def identities(clients: list[OwnerClient]) -> list[dict[str, Any] | OwnerUnreachable]:
    """Every owner's ``/v1/identity`` at once (one wait for all, however many hang)."""
    if not clients:
        return []
    answers = clients[0].calls.call_many([c.request("GET", "/v1/identity") for c in clients])
    return [a if isinstance(a, OwnerUnreachable) else a[1] for a in answers]
