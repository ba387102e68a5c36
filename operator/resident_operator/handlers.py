"""The kopf handlers: thin, typed, and all funnelled into one driver per model.

- ``configure`` (startup) is the one place settings are applied: finalizer name,
  annotation-based progress storage, no diff-base (:class:`NoDiffBase`), server-side
  label selectors for the children's watches, event posting level, the API client, the
  pass pool, the gate of owner calls (``owner_client.OwnerCalls``), the source-probe HTTP
  session and the cluster-wide orphan sweep (on a thread of its own).
- ``Runtime.handles`` is the one registry of the models' :class:`~.driver.ModelHandle`
  by UID, which child handlers use to wake a model; ``model_changed`` adds a model's
  handle at its first event, keeps the children its status records, and removes it when
  the model is gone.
- ``model_changed`` and the ``*_changed`` handlers of its children (owner Pods, the token
  Secret, BundleDeliveries, the companions: Service, budget, control policy) wake the
  model a change concerns; ``drive`` (a daemon, one per model) runs its passes. Owner Pods
  and BundleDeliveries also go into the cache the passes read them from
  (``child_cache.py``), before the wake.
- ``on_delete`` deletes recorded children by UID and keeps the finalizer until all are
  gone; it takes the model's pass lock, so it never runs beside a pass.

See ``driver.py`` for what wakes a model and ``docs/operator.md`` for the event flow.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import kopf

from . import metrics, naming, retry_policy
from .cleanup import abandon_stuck_children, delete_recorded_children
from .child_cache import ChildCache
from .children import recorded_uids
from .driver import ModelHandle, ResyncTurns, drive
from .kube import MOUNT_EVENTS, Kube, load_config
from .owner_client import OwnerCalls
from .passes import model_context, run_pass
from .reconcile import state_of
from .settings import OperatorSettings, settings_from_env
from .source_probes import SourceProbes
from .sweep import pause_after, sweep_once

log = logging.getLogger("resident.operator")
MODEL = (naming.GROUP, naming.VERSION, naming.MODEL_PLURAL)
DELIVERIES = (naming.GROUP, naming.VERSION, naming.DELIVERY_PLURAL)
EVENTS = ("v1", "events")   # core Events, not events.k8s.io
OWNED = {naming.LABEL_MODEL_UID: kopf.PRESENT}
PASS_THREADS = 8        # passes of different models that may run at once
DELETE_LOCK_SECONDS = 30
EXIT_AFTER_CLEANUP_SECONDS: float | None = None   # set by `resident operator` (see __main__)


class Runtime:
    """The operator-wide objects, made once at startup and shared through kopf's memo."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.kube = Kube(load_config(), ChildCache())   # passes read Pods and deliveries from it
        self.pool = ThreadPoolExecutor(PASS_THREADS, thread_name_prefix="pass")
        # the sweep's own thread: passes cannot starve it, nor it them (its time budget)
        self.sweep_pool = ThreadPoolExecutor(1, thread_name_prefix="sweep")
        self.session: aiohttp.ClientSession | None = None
        self.owner_calls: OwnerCalls | None = None
        self.handles: dict[str, ModelHandle] = {}
        self.sweeper: asyncio.Task | None = None
        self.sources = SourceProbes()   # one probe per source that is down, shared by its models
        self.resync_turns = ResyncTurns(settings.resync_passes_per_second)


class NoDiffBase(kopf.DiffBaseStorage):
    """What kopf remembers of the last spec it handled, to tell a creation from an update:
    nothing here. This operator has no creation or update handler (each model's daemon
    reads the spec at every pass; the delete handler is told by deletionTimestamp), so the
    annotation kopf would write at every creation and spec edit is one write for nothing."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence:
        return self.build(body=body)   # as if handled already: no change to tell

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    rt = Runtime(settings_from_env())
    rt.session = aiohttp.ClientSession()
    rt.owner_calls = OwnerCalls(rt.settings, wake=functools.partial(_owner_answers, rt))
    memo.runtime = rt
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="resident.dev")
    settings.persistence.diffbase_storage = NoDiffBase()
    # Only our children are watched: the API server filters them by label.
    for plural in ("pods", "secrets", "services", "poddisruptionbudgets", "networkpolicies"):
        settings.watching.label_selectors[plural] = naming.LABEL_MODEL_UID
    settings.watching.field_selectors[EVENTS] = MOUNT_EVENTS   # kubelet's FailedMount on Pods
    # Events are posted explicitly (kopf.event ignores this level); kopf's own log lines,
    # e.g. "failed temporarily" every retry while children go away, stay in the logs.
    settings.posting.level = logging.CRITICAL
    log.info("resident operator configured", extra={"settings": rt.settings.model_dump()})


@kopf.on.cleanup()
async def shut_down(memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    if rt.sweeper is not None:
        rt.sweeper.cancel()
    for probe in rt.sources.open_probes():
        if probe.task is not None:
            probe.task.cancel()
    if rt.session is not None:
        await rt.session.close()
    if rt.owner_calls is not None:
        await rt.owner_calls.close()
    rt.pool.shutdown(wait=False, cancel_futures=True)
    rt.sweep_pool.shutdown(wait=False, cancel_futures=True)
    if EXIT_AFTER_CLEANUP_SECONDS is not None:   # the process must end even if kopf's shutdown hangs
        threading.Thread(target=_exit_later, args=(EXIT_AFTER_CLEANUP_SECONDS,), daemon=True).start()


def _exit_later(seconds: float) -> None:
    time.sleep(seconds)
    log.error("kopf did not finish its shutdown; exiting", extra={"seconds": seconds})
    logging.shutdown()
    os._exit(1)


def _owner_answers(rt: Runtime, model_uid: str) -> None:
    """An owner that had stopped answering answers again: its model looks at it at once."""
    handle = rt.handles.get(model_uid)
    if handle is not None:
        handle.poke("owner")


async def _sweep_forever(rt: Runtime) -> None:
    loop = asyncio.get_running_loop()
    rounds, pause = 0, rt.settings.sweep_seconds
    while True:
        await asyncio.sleep(pause)
        began = time.monotonic()
        try:
            await loop.run_in_executor(rt.sweep_pool, contextvars.copy_context().run, sweep_once,
                                       rt.kube, rt.settings, list(rt.handles.values()),
                                       lambda h: loop.call_soon_threadsafe(h.poke, "sweep"), rounds)
        except Exception:  # noqa: BLE001 - the next sweep tries again
            log.exception("orphan sweep failed")
        rounds, pause = rounds + 1, pause_after(rt.settings, time.monotonic() - began)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """KUBECONFIG as it is when the operator starts (not when a client library was imported),
    else the in-cluster service account."""
    return kopf.login_with_kubeconfig(**kwargs) or _login_in_cluster(**kwargs)


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _login_in_cluster(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The service account against ``KUBERNETES_SERVICE_HOST:PORT``, as client-go does.

    kopf's own service-account login always dials ``kubernetes.default.svc``, which needs
    cluster DNS; the environment variables kubelet sets (or a Pod overrides, as clusters
    without a service network do) work everywhere.
    """
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not (host and port and (SERVICE_ACCOUNT / "token").exists()):
        return kopf.login_with_service_account(**kwargs)
    host = f"[{host}]" if ":" in host else host
    namespace = SERVICE_ACCOUNT / "namespace"
    return kopf.ConnectionInfo(
        server=f"https://{host}:{port}", ca_path=str(SERVICE_ACCOUNT / "ca.crt"),
        token=(SERVICE_ACCOUNT / "token").read_text().strip(),
        default_namespace=namespace.read_text().strip() if namespace.exists() else None)


# -- what wakes a model -------------------------------------------------------------------
def _handle(rt: Runtime, namespace: str, name: str, uid: str) -> ModelHandle:
    handle = rt.handles.get(uid)
    if handle is None:
        handle = rt.handles[uid] = ModelHandle(namespace, name, uid)
    return handle


@kopf.on.event(*MODEL)
async def model_changed(memo: kopf.Memo, namespace: str, name: str, uid: str, meta: Any,
                        status: Any, type: str | None, event: Any, **_: Any) -> None:
    """The spec changed (a new generation) or deletion began; our own status writes do
    not wake the model, but what they record is kept for the sweep. Every version goes
    into the cache the passes start from."""
    memo.runtime.kube.cache.observe_model(type, event["object"])
    if type == "DELETED":
        memo.runtime.handles.pop(uid, None)
        return
    handle = _handle(memo.runtime, namespace, name, uid)
    handle.record(recorded_uids((status or {}).get("children")))
    generation = (meta.get("generation"), bool(meta.get("deletionTimestamp")))
    if generation != handle.generation:
        handle.generation = generation
        handle.poke("model")


def _wake_model_of(labels: Any, cause: str, memo: kopf.Memo, event: Any) -> None:
    """Wake the model a child's event concerns, unless the event reports this operator's
    own write of it (a create's ADDED, a patch's MODIFIED): the pass that wrote it knew."""
    if event["type"] != "DELETED" and memo.runtime.kube.cache.is_own_write(event["object"]):
        return
    handle = memo.runtime.handles.get(labels.get(naming.LABEL_MODEL_UID))
    if handle is not None:
        handle.poke(cause)


# kopf runs no other handler before these indexes hold their first listing, so the
# passes' cache of Pods and deliveries is whole from the first pass (child_cache.py). They
# index nothing themselves; the watch events below keep the cache up to date afterwards.
@kopf.index("pods", labels=OWNED)
async def pods_listed(memo: kopf.Memo, body: Any, **_: Any) -> None:
    memo.runtime.kube.cache.observe("Pod", None, dict(body))


@kopf.index(*DELIVERIES, labels=OWNED)
async def deliveries_listed(memo: kopf.Memo, body: Any, **_: Any) -> None:
    memo.runtime.kube.cache.observe("BundleDelivery", None, dict(body))


@kopf.on.event("pods", labels=OWNED)
async def pod_changed(memo: kopf.Memo, event: Any, labels: Any, **_: Any) -> None:
    memo.runtime.kube.cache.observe("Pod", event["type"], event["object"])   # before the wake
    _wake_model_of(labels, "pod", memo, event)


@kopf.on.event(*EVENTS)
async def mount_failed(memo: kopf.Memo, event: Any, **_: Any) -> None:
    """kubelet's FailedMount on a Pod (the API server sends no other Events): its model
    reads the bridge's answer from it at once."""
    cache = memo.runtime.kube.cache
    cache.observe("Event", event["type"], event["object"])
    model_uid = cache.model_uid_of((event["object"].get("involvedObject") or {}).get("uid", ""))
    if event["type"] != "DELETED" and model_uid:
        handle = memo.runtime.handles.get(model_uid)
        if handle is not None:
            handle.poke("mount")


@kopf.on.event("secrets", labels=OWNED)
async def secret_changed(memo: kopf.Memo, event: Any, labels: Any, **_: Any) -> None:
    _wake_model_of(labels, "secret", memo, event)


@kopf.on.event("services", labels=OWNED)
async def service_changed(memo: kopf.Memo, event: Any, labels: Any, **_: Any) -> None:
    _wake_model_of(labels, "service", memo, event)


@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=OWNED)
async def budget_changed(memo: kopf.Memo, event: Any, labels: Any, **_: Any) -> None:
    _wake_model_of(labels, "budget", memo, event)


@kopf.on.event("networking.k8s.io", "networkpolicies", labels=OWNED)
async def control_policy_changed(memo: kopf.Memo, event: Any, labels: Any, **_: Any) -> None:
    _wake_model_of(labels, "control-policy", memo, event)


@kopf.on.event(*DELIVERIES, labels=OWNED)
async def delivery_changed(memo: kopf.Memo, event: Any, labels: Any, **_: Any) -> None:
    memo.runtime.kube.cache.observe("BundleDelivery", event["type"], event["object"])
    _wake_model_of(labels, "delivery", memo, event)


# -- the model's passes ---------------------------------------------------------------------
@kopf.daemon(*MODEL, cancellation_timeout=1.0)
async def drive_model(stopped: kopf.DaemonStopped, memo: kopf.Memo, namespace: str, name: str,
                      uid: str, body: kopf.Body, **_: Any) -> None:
    rt: Runtime = memo.runtime
    if rt.sweeper is None:   # started here, in a context where kopf.event() works
        rt.sweeper = asyncio.create_task(_sweep_forever(rt), name="orphan sweep")
    rt.kube.cache.mark_ready()   # a daemon starts only once kopf's indexes are whole
    await _finalizer_added(body, stopped)
    rt.kube.cache.observe_model(None, dict(body))   # the finalizer's version, if its event is not in yet
    handle = _handle(rt, namespace, name, uid)
    one_pass = functools.partial(run_pass, rt.kube, rt.settings, namespace, name, uid, handle.lock,
                                 handle.known, rt.sources, rt.owner_calls)
    await drive(handle, stopped, one_pass, rt.pool, rt.session, rt.settings.resync_seconds, rt.sources,
                rt.owner_calls, rt.resync_turns)


FINALIZER_WAIT_SECONDS = 5.0


async def _finalizer_added(body: kopf.Body, stopped: kopf.DaemonStopped) -> None:
    """Wait (at most FINALIZER_WAIT_SECONDS) until kopf's patch adding the finalizer, made
    as this daemon starts, has landed. ``body`` is kopf's live view of the model. A first
    pass read before it would have its conditional status write refused (409) by that
    patch and write again: two requests more (one model of three in a cluster test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FINALIZER_WAIT_SECONDS
    while not stopped and loop.time() < deadline:
        meta = body.get("metadata") or {}
        if naming.FINALIZER in (meta.get("finalizers") or []) or meta.get("deletionTimestamp"):
            return
        await asyncio.sleep(0.02)


@kopf.on.delete(*MODEL, retries=None, backoff=1, timeout=None)  # until every child is gone
def on_delete(memo: kopf.Memo, namespace: str, name: str, uid: str, **_: Any) -> None:
    rt: Runtime = memo.runtime
    handle = rt.handles.get(uid)
    lock = handle.lock if handle is not None else None
    if lock is not None and not lock.acquire(timeout=DELETE_LOCK_SECONDS):
        raise kopf.TemporaryError("a pass of this model is still running",
                                  delay=retry_policy.DELETE_SECONDS)
    try:
        ctx = model_context(rt.kube, rt.settings, namespace, name)
        if ctx is None or ctx.uid != uid:
            return
        ctx.body = ctx.kube.patch_model_status(namespace, name, {"phase": "Terminating"})  # its records' base
        metrics.set_model_phase(f"{namespace}/{name}", "Terminating")
        state = state_of(ctx)
        remaining = abandon_stuck_children(ctx, state, delete_recorded_children(ctx, state),
                                           rt.settings.delete_grace_seconds)
        if remaining:
            names = ", ".join(f"{r['kind']}/{r['name']}" for r in remaining[:5])
            raise kopf.TemporaryError(f"waiting for {len(remaining)} children to go: {names}",
                                      delay=retry_policy.DELETE_SECONDS)
        ctx.event("CleanupDone", "every recorded child is gone; removing the finalizer")
        metrics.set_model_phase(f"{namespace}/{name}", None)
    finally:
        if lock is not None:
            lock.release()
