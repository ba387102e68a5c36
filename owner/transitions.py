"""Running one transition: choose in place or reload, time every phase, report honestly.

``Auto`` tries in place first: if admission says the change cannot be applied in place,
the strategy chosen is ``Reload`` (a plan, decided before anything live changed).
``InPlace`` that is not admissible ends as ``needs-reload`` with nothing changed. An
in-place update that was admitted and then fails is ``failed`` - never turned into a
reload. After an apply, the new revision must answer one token (``firstToken``): if it does
not, the update is rolled back in place to the revision that was live (its changed rows
staged from its own files, verified like any update) and the transition is ``failed``;
if the rollback fails too, the reason says so and which revision serves. After a reload
the old runtime is gone, so a failed check (or warm-up) ends ``failed`` with the reloaded
revision named as the one serving. The result's ``identity`` is always the revision live
when it was written. Reload closes the old runtime first, so a failed reload leaves the owner
``unloaded``; its staging step therefore checks that every target file is present with
the manifest's size before the old runtime is closed. A reload whose target holds the
live weights (``weightsReused``: only the graph is compiled and bound to them) touches
nothing live until the new graph is ready, so its failure (``ReloadRefused``) leaves the
old revision serving and the owner ``ready``.

Traffic: an in-place transition keeps the owner ready; its apply holds the revision lock
alone, so requests finish on the old revision or wait (bounded) for the new one. A reload
first turns the owner not-ready and keeps serving the old revision for ``drainSeconds``
(so the kubelet's probe takes it out of the Service's Endpoints) and until no request
comes for a while, then holds the lock alone: the requests in flight finish, and a
request a proxy still sends here waits (bounded, as behind an apply) for the new revision,
which answers it; the owner turns ready again once that revision has answered its first
token (and warmed up). With ``leaveEndpoints: false`` (the operator sends it for a
model's only replica) the owner stays ready throughout and holds the lock *closed*: there
is no other endpoint to drain to, and a client of the Service gets the owner's 503 with
Retry-After at once rather than a refused connection or a wait as long as the load. A reload
to a revision the owner preloaded (owner/preload.py) is a swap, like the commit of a
reload loaded beside: no drain, ready throughout, requests wait for the swap.

Two steps (``commit: Deferred``, for a lockstep switch of several owners): the transition
prepares as far as it can without touching the live revision (in place: admission and the
staged rows; reload: the pre-check of every target file and, where the backend can and
memory for both revisions is there, the target loaded beside the live one, and warmed up
there when the owner warms up, so that the commit is a swap: ``loadedBeside``), publishes
result ``prepared``
and waits for ``commit`` (it then goes on, result ``running`` again) or ``abort`` (result
``aborted``, nothing changed). Without either within ``holdSeconds`` it aborts itself. The
owner stays ready while prepared.

Phases and their timings: ``stage`` (admission and reading/hash-checking changed chunks,
or the reload pre-check), ``apply`` (journal + write, or close + load), ``verify``
(read-back, or identity check of the loaded revision), ``warmup`` (only for a reload that
compiled its graph anew, when the owner warms up: every variant once, as at start),
``firstToken`` (one token from the new identity), ``total``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import TYPE_CHECKING

from . import api
from .backends.base import ReloadRefused, first_token
from .inplace import InPlaceFailed, NeedsReload, ReleaseFailed, RestoreFailed
from .revisions import IntegrityError, Revision, RevisionError

if TYPE_CHECKING:
    from .runtime import Owner

log = logging.getLogger("resident.owner")


def new_status(owner: "Owner", req: api.TransitionRequest, target: Revision) -> api.TransitionStatus:
    cur = owner.current()
    return api.TransitionStatus(id=uuid.uuid4().hex[:12], **{"from": cur.digest if cur else None},
                                to=target.digest, requested=req.strategy, path=req.path,
                                commit=req.commit)


def _precheck(target: Revision) -> None:
    for entry in target.manifest.files:
        path = target.file(entry)
        if not path.is_file() or os.stat(path).st_size != entry.size:
            raise IntegrityError(f"{entry.path}: missing or not {entry.size} bytes in {target.dir}")


def _identity(owner: "Owner") -> api.Identity | None:
    ident = owner.backend.describe().identity
    return api.Identity(**ident) if ident else None


def _failed_apply(owner: "Owner", e: InPlaceFailed) -> tuple[str, str]:
    """(owner state, reason) after an admitted in-place update failed to apply."""
    if isinstance(e, RestoreFailed):
        owner.backend.close()
        return "unloaded", f"{e}; the model was unloaded"
    if isinstance(e, ReleaseFailed):
        return "quarantined", f"{e}; the owner is quarantined ({'new' if e.applied else 'old'} identity live)"
    return "ready", str(e)  # verification failed and the journal restored the old rows


def _in_place(owner: "Owner", st: api.TransitionStatus, target: Revision, t: api.Timings
              ) -> tuple[str, str]:
    previous = owner.current()
    t0 = time.perf_counter()
    update = owner.backend.stage_in_place(target)
    t.stage_seconds = time.perf_counter() - t0
    st.strategy, st.bytes_read, st.rows_changed = "InPlace", update.bytes_read, update.rows_changed
    if not owner.await_commit(st):
        return "ready", "aborted"
    with owner.revision_lock.exclusive():
        try:
            report = owner.backend.apply_in_place(update)
        except InPlaceFailed as e:
            final, st.reason = _failed_apply(owner, e)
            return final, "failed"
        t.apply_seconds, t.verify_seconds = report.apply_seconds, report.verify_seconds
        try:
            t.first_token_seconds = owner.probe()
            st.first_token_at = time.time()
        except Exception as e:  # noqa: BLE001 - whatever the model raised, it did not answer
            return _roll_back(owner, st, previous, f"{type(e).__name__}: {e}")
    return "ready", "succeeded"


def _roll_back(owner: "Owner", st: api.TransitionStatus, previous: Revision, problem: str
               ) -> tuple[str, str]:
    """After the first-token check failed on an applied update: apply ``previous`` in place
    again (inference is still excluded), and say in the reason which revision serves."""
    why = f"the first-token check failed after the in-place apply ({problem})"
    log.warning("first-token check failed after apply, rolling back",
                extra={"transition": st.id, "reason": problem, "to": previous.digest})
    try:
        owner.backend.apply_in_place(owner.backend.stage_in_place(previous))
    except InPlaceFailed as e:
        final, reason = _failed_apply(owner, e)
        st.reason = f"{why}; rolling back in place to {previous.digest} failed: {reason}"
    except Exception as e:  # noqa: BLE001 - e.g. the previous revision's files no longer verify
        final = "ready"
        st.reason = f"{why}; rolling back in place to {previous.digest} failed: {type(e).__name__}: {e}"
    else:
        st.reason = f"{why}; rolled back in place: {previous.digest} serves"
        return "ready", "failed"
    live = owner.live_digest()
    st.reason += f"; {live} serves" if live else "; no revision serves"
    return final, "failed"


def memory_available() -> int:
    """Bytes this process may still allocate: the kernel's MemAvailable, bounded by the
    container's cgroup (v2) limit when it has one."""
    avail = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read())
        if limit != "max":
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return avail


def beside_refusal(backend) -> str:
    """Why ``backend`` cannot load a revision beside its live one now, or "": a backend
    without ``load_beside`` (torch, the vendor adapters), or not the memory for both (the
    live weights' bytes again, plus a quarter)."""
    if not hasattr(backend, "load_beside"):
        return f"the {backend.name} backend cannot load a revision beside the live one"
    live = backend.describe().residency
    need = int(1.25 * (live.bytes if live else 0))
    if memory_available() < need:
        return f"no memory for two revisions: {need} bytes needed beside the live one"
    return ""


def load_beside(owner: "Owner", target: Revision):
    """``target`` loaded into a backend of its own beside the live revision, and warmed up
    there when the owner warms up (while the live revision serves, not after a swap).
    Raises ReloadRefused: nothing live changed."""
    beside = owner.backend.load_beside(target)
    if owner.warmup:
        try:
            for variant in beside.variants():
                first_token(beside, variant)
        except Exception as e:  # noqa: BLE001 - nothing live changed: the old revision serves on
            beside.close()
            raise ReloadRefused(f"warming {target.digest} up beside the live revision failed: "
                                f"{type(e).__name__}: {e}") from e
    return beside


def _load_beside(owner: "Owner", st: api.TransitionStatus, target: Revision):
    """A Deferred reload prepares by loading the target beside the live revision when it
    can (:func:`beside_refusal`); its commit is then a swap. Otherwise None: the commit
    loads, as a reload does."""
    if st.commit != "Deferred":
        return None
    refusal = beside_refusal(owner.backend)
    if refusal:
        log.info("not loading beside the live revision; the commit will load",
                 extra={"transition": st.id, "reason": refusal})
        st.loaded_beside = False
        return None
    beside = load_beside(owner, target)
    st.loaded_beside = True
    return beside


def _reload(owner: "Owner", st: api.TransitionStatus, target: Revision, t: api.Timings,
            drain_seconds: float, leave_endpoints: bool = True) -> tuple[str, str]:
    st.strategy = "Reload"
    t0 = time.perf_counter()
    _precheck(target)
    beside = owner.preloads.take(target.digest)   # loaded ahead of the switch: the commit is a swap
    if beside is not None:
        st.loaded_beside = st.preloaded = True
    else:
        beside = _load_beside(owner, st, target)
    t.stage_seconds = time.perf_counter() - t0
    if not owner.await_commit(st):
        return "ready", "aborted"
    owner.reloading = leave_endpoints and beside is None  # /readyz 503 until the new revision answered
    if drain_seconds and beside is None:
        log.info("draining before reload", extra={"transition": st.id, "seconds": drain_seconds})
        waited = owner.drain(drain_seconds)  # still serving the old revision meanwhile
        log.info("drained", extra={"transition": st.id, "seconds": round(waited, 3)})
    # A swap is brief: requests wait for it, as for an in-place apply. So do those a proxy
    # still sends after the drain (its watch of the endpoints lags, e.g. after an API
    # server restart): the new revision answers them. The only replica, which stays in
    # the endpoints, turns its clients away while it loads (503 + Retry-After).
    with owner.revision_lock.exclusive(closed=beside is None and not leave_endpoints):
        t1 = time.perf_counter()
        try:
            report = owner.backend.swap_in(beside) if beside is not None else owner.backend.reload(target)
        except ReloadRefused as e:
            st.reason = f"reload failed before the live revision changed, which still serves: {e}"
            return "ready", "failed"
        except Exception as e:  # noqa: BLE001 - the old runtime is closed: whatever failed, we are unloaded
            owner.backend.close()
            st.reason = f"reload failed after closing the old runtime: {type(e).__name__}: {e}"
            return "unloaded", "failed"
        t2 = time.perf_counter()
        t.apply_seconds = t2 - t1
        st.graph_reused, st.weights_reused = report.graph_reused, report.weights_reused
        if owner.backend.describe().identity != target.manifest.identity():
            owner.backend.close()
            st.reason = "the reloaded runtime reports another identity than the target"
            return "unloaded", "failed"
        t.verify_seconds = time.perf_counter() - t2
        try:
            if owner.warmup and not report.graph_reused and beside is None:
                t3 = time.perf_counter()
                owner.warm_up()  # a newly compiled graph is a new engine: warm it as at start
                t.warmup_seconds = time.perf_counter() - t3
            t.first_token_seconds = owner.probe()
            st.first_token_at = time.time()
        except Exception as e:  # noqa: BLE001 - the old runtime is gone; say what serves
            st.reason = (f"warm-up or the first-token check failed after the reload "
                         f"({type(e).__name__}: {e}); it is loaded: {target.digest} serves")
            return "ready", "failed"
    return "ready", "succeeded"


def run_transition(owner: "Owner", st: api.TransitionStatus, target: Revision,
                   drain_seconds: float = 0.0, leave_endpoints: bool = True) -> None:
    """Body of a transition thread; always leaves ``st`` finished and the guard released.

    The result is published last, after the new identity and the owner's state: whoever
    reads ``succeeded`` (a poller, or a waiter woken by :meth:`Owner.finish`) also reads
    the identity and state it produced.
    """
    t = st.timings
    start = time.perf_counter()
    owner.set_state("transitioning")
    final, result = "ready", "failed"
    try:
        wants_in_place = st.requested in ("Auto", "InPlace")
        if wants_in_place and not owner.backend.describe().in_place:
            if st.requested == "InPlace":
                raise NeedsReload(f"the {owner.backend.name} backend cannot update in place")
            wants_in_place = False
        if wants_in_place:
            try:
                final, result = _in_place(owner, st, target, t)
            except NeedsReload as e:
                if st.requested == "InPlace":
                    raise
                log.info("in place not admissible, reloading", extra={"transition": st.id, "reason": str(e)})
                st.reason = f"reload chosen: {e}"
                final, result = _reload(owner, st, target, t, drain_seconds, leave_endpoints)
        else:
            final, result = _reload(owner, st, target, t, drain_seconds, leave_endpoints)
    except NeedsReload as e:
        result, st.reason = "needs-reload", str(e)
    except (IntegrityError, RevisionError) as e:
        result, st.reason = "failed", f"target revision rejected: {e}"
    except Exception as e:  # noqa: BLE001 - a transition thread must always report
        log.exception("transition crashed", extra={"transition": st.id})
        result, st.reason = "failed", f"{type(e).__name__}: {e}"
    finally:
        t.total_seconds = time.perf_counter() - start
        owner.preloads.settle()
        st.identity = _identity(owner)
        owner.set_state(final, st.reason if final != "ready" else "")
        owner.reloading = False
        owner.metrics.observe_transition(st.strategy or "None", result, {
            "stage": t.stage_seconds, "apply": t.apply_seconds, "verify": t.verify_seconds,
            "warmup": t.warmup_seconds, "first_token": t.first_token_seconds, "total": t.total_seconds})
        log.info("transition finished", extra={"transition": st.id, "result": result,
                                               "strategy": st.strategy, "reason": st.reason,
                                               "timings": t.model_dump(by_alias=True)})
        owner.transition_guard.release()
        owner.commits.pop(st.id, None)
        owner.finish(st, result)
