"""The kopf handlers: thin, typed, and all funnelled into one locked reconcile pass.

- ``configure`` (startup) is the one place settings are applied: finalizer name,
  annotation-based progress storage, watch timeouts, event posting level, the API client.
- ``on_create`` / ``on_update`` (spec) / ``on_resume`` run a pass; an invalid spec raises
  :class:`kopf.PermanentError` after the condition is written.
- ``resync`` (timer) runs a pass every ``RESIDENT_RESYNC_SECONDS`` so status follows Pods
  and owners, and transitions progress; ``sweep`` (timer) deletes labelled orphans every
  ``RESIDENT_SWEEP_SECONDS``. Both tick each second and skip until their interval passed,
  so the intervals are settings read at startup, not at import.
- ``on_delete`` deletes recorded children by UID and keeps the finalizer until all are gone.

Passes of one model never overlap: each takes the model's lock (a timer that finds it
taken skips its turn; a change handler waits, then retries via TemporaryError).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import kopf

from . import metrics, naming
from .cleanup import delete_recorded_children, prune_records, sweep_orphans
from .context import ModelContext
from .kube import Kube, load_config
from .reconcile import INVALID, reconcile, state_of
from .settings import OperatorSettings, settings_from_env

log = logging.getLogger("resident_operator")
MODEL = (naming.GROUP, naming.VERSION, naming.MODEL_PLURAL)
# A change handler retries its pass for up to an hour; the resync timer keeps going after.
CHANGE_TIMEOUT = 3600.0
TICK_SECONDS = 1.0  # timers fire this often and run a pass when its interval has passed


class _Runtime:
    settings: OperatorSettings = OperatorSettings()
    kube: Kube | None = None
    locks: dict[str, threading.Lock] = {}
    last_run: dict[tuple[str, str], float] = {}
    guard = threading.Lock()

    @classmethod
    def due(cls, what: str, uid: str, interval: float) -> bool:
        """True (and remember now) if ``what`` last ran for ``uid`` at least ``interval`` ago."""
        now = time.monotonic()
        with cls.guard:
            if now - cls.last_run.get((what, uid), -1e9) < interval:
                return False
            cls.last_run[(what, uid)] = now
            return True

    @classmethod
    def lock(cls, uid: str) -> threading.Lock:
        with cls.guard:
            return cls.locks.setdefault(uid, threading.Lock())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    _Runtime.settings = settings_from_env()
    _Runtime.kube = Kube(load_config())
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="resident.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="resident.dev", key="last-handled-configuration")
    # Events are posted explicitly (kopf.event ignores this level); kopf's own log lines,
    # e.g. "failed temporarily" every retry while children go away, stay in the logs.
    settings.posting.level = logging.CRITICAL
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.execution.max_workers = 8
    log.info("resident operator configured", extra={"settings": _Runtime.settings.model_dump()})


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


def _context(namespace: str, name: str) -> ModelContext | None:
    kube = _Runtime.kube or Kube(load_config())
    body = kube.get_model(namespace, name)
    if body is None:
        return None
    body.setdefault("apiVersion", naming.API_VERSION)
    body.setdefault("kind", "ResidentModel")

    def post(reason: str, message: str, warning: bool) -> None:
        kopf.event(body, type="Warning" if warning else "Normal", reason=reason,
                   message=message[:1000])

    return ModelContext(kube=kube, settings=_Runtime.settings, namespace=namespace, name=name,
                        uid=body["metadata"]["uid"], body=body, post_event=post)


def _pass(namespace: str, name: str, uid: str, *, wait: bool) -> None:
    lock = _Runtime.lock(uid)
    if not lock.acquire(timeout=30 if wait else 0):
        if wait:
            raise kopf.TemporaryError("another pass of this model is running", delay=1)
        return
    try:
        ctx = _context(namespace, name)
        if ctx is None or ctx.uid != uid:
            return
        try:
            outcome, message = reconcile(ctx)
        except kopf.TemporaryError:
            metrics.RECONCILES.labels(result="waiting").inc()
            raise
        except Exception as e:
            metrics.RECONCILES.labels(result="error").inc()
            metrics.RECONCILE_ERRORS.labels(reason=type(e).__name__).inc()
            raise kopf.TemporaryError(f"{type(e).__name__}: {e}", delay=5) from e
        metrics.RECONCILES.labels(result=outcome).inc()
        if outcome == INVALID and wait:
            raise kopf.PermanentError(f"invalid spec: {message}")
    finally:
        lock.release()


@kopf.on.create(*MODEL, retries=None, backoff=2, timeout=CHANGE_TIMEOUT)
def on_create(namespace: str, name: str, uid: str, **_: Any) -> None:
    _pass(namespace, name, uid, wait=True)


@kopf.on.update(*MODEL, field="spec", retries=None, backoff=2, timeout=CHANGE_TIMEOUT)
def on_update(namespace: str, name: str, uid: str, **_: Any) -> None:
    _pass(namespace, name, uid, wait=True)


@kopf.on.resume(*MODEL, retries=None, backoff=2, timeout=CHANGE_TIMEOUT)
def on_resume(namespace: str, name: str, uid: str, **_: Any) -> None:
    _pass(namespace, name, uid, wait=True)


@kopf.timer(*MODEL, interval=TICK_SECONDS, initial_delay=TICK_SECONDS)
def resync(namespace: str, name: str, uid: str, status: dict, **_: Any) -> None:
    """Observe again every ``resync_seconds`` when settled; every tick while a transition
    or a placement is under way, so each step follows the previous one without a wait."""
    settled = not status.get("transition") and status.get("phase") in ("Ready", "Degraded")
    interval = _Runtime.settings.resync_seconds if settled else TICK_SECONDS
    if _Runtime.due("resync", uid, interval):
        _pass(namespace, name, uid, wait=False)


@kopf.timer(*MODEL, id="sweep", interval=TICK_SECONDS, initial_delay=TICK_SECONDS)
def sweep(namespace: str, name: str, uid: str, **_: Any) -> None:
    if not _Runtime.due("sweep", uid, _Runtime.settings.sweep_seconds):
        return
    lock = _Runtime.lock(uid)
    if not lock.acquire(blocking=False):
        return
    try:
        ctx = _context(namespace, name)
        if ctx is None or ctx.uid != uid or ctx.body["metadata"].get("deletionTimestamp"):
            return
        state = state_of(ctx)
        prune_records(ctx, state)
        sweep_orphans(ctx, state)
    finally:
        lock.release()


@kopf.on.delete(*MODEL, retries=None, backoff=2, timeout=None)  # until every child is gone
def on_delete(namespace: str, name: str, uid: str, **_: Any) -> None:
    lock = _Runtime.lock(uid)
    if not lock.acquire(timeout=30):
        raise kopf.TemporaryError("a pass of this model is still running", delay=1)
    try:
        ctx = _context(namespace, name)
        if ctx is None or ctx.uid != uid:
            return
        ctx.kube.patch_model_status(namespace, name, {"phase": "Terminating"})
        metrics.set_model_phase(f"{namespace}/{name}", "Terminating")
        remaining = delete_recorded_children(ctx, state_of(ctx))
        if remaining:
            names = ", ".join(f"{r['kind']}/{r['name']}" for r in remaining[:5])
            raise kopf.TemporaryError(f"waiting for {len(remaining)} children to go: {names}", delay=2)
        ctx.event("CleanupDone", "every recorded child is gone; removing the finalizer")
        metrics.set_model_phase(f"{namespace}/{name}", None)
    finally:
        lock.release()
    with _Runtime.guard:
        _Runtime.locks.pop(uid, None)
        for key in [k for k in _Runtime.last_run if k[1] == uid]:
            _Runtime.last_run.pop(key, None)
