"""One pass of one model, as the driver's thread pool runs it.

A pass starts from the operator's cached copy of the model, which is never older than its
own last status write (``child_cache.py``), and reads it from the API server only when the
cache has none or the safety resync woke it (a net under the watch, which reads afresh);
it runs :func:`~.reconcile.reconcile` under the model's lock and turns what happened into a
:class:`~.context.FollowUp`: a ``kopf.TemporaryError`` or an unexpected exception asks for
a retry after its delay (an unexpected one also shows on the model as ``Degraded``
``ReconcileFailed``), an invalid spec waits for the next spec change. Nothing here
raises: a driver loop must never die of a pass.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from . import conditions as c
from . import metrics, naming, retry_policy
from .context import FollowUp, ModelContext
from .kube import Kube
from .owner_client import OwnerCalls
from .reconcile import reconcile, write_status
from .settings import OperatorSettings
from .source_probes import SourceProbes

log = logging.getLogger("resident.operator")


def model_context(kube: Kube, settings: OperatorSettings, namespace: str, name: str,
                  uid: str | None = None, fresh: bool = False) -> ModelContext | None:
    """The model with Events posted on it; None if gone. For a pass of the model ``uid``,
    the cache's copy when there is one, unless ``fresh`` (:meth:`~.kube.Kube.model`);
    without ``uid``, as the API server has it now."""
    body = kube.get_model(namespace, name) if uid is None else kube.model(namespace, name, uid, fresh)
    if body is None:
        return None
    body.setdefault("apiVersion", naming.API_VERSION)
    body.setdefault("kind", "ResidentModel")

    def post(reason: str, message: str, warning: bool) -> None:
        kopf.event(body, type="Warning" if warning else "Normal", reason=reason,
                   message=message[:1000])

    return ModelContext(kube=kube, settings=settings, namespace=namespace, name=name,
                        uid=body["metadata"]["uid"], body=body, post_event=post)


def run_pass(kube: Kube, settings: OperatorSettings, namespace: str, name: str, uid: str,
             lock: threading.Lock, known: dict[str, Any], sources: SourceProbes | None = None,
             owner_calls: OwnerCalls | None = None) -> FollowUp | None:
    """One pass; None when the model is gone (or replaced by another of the same name).

    ``known`` carries what a pass may reuse from the last one (the owners' token, the
    checked companions' endpoint; the driver forgets each when an event says it changed,
    ``driver.FORGETS``), so a pass does not read them again. ``sources`` are the
    operator's shared source probes (``source_probes.py``), ``owner_calls`` its gate for
    owner calls (``owner_client.py``)."""
    t0 = time.perf_counter()
    with lock:
        epoch = known.get("epoch")   # before the model is read: a spec change after it is seen
        afresh = known.pop("read_model", False)   # the safety resync asked (driver.FRESH_READS)
        try:
            ctx = model_context(kube, settings, namespace, name, uid, fresh=afresh)
        except Exception as e:  # noqa: BLE001 - the API server may be restarting
            log.warning("cannot read the model", extra={"model": f"{namespace}/{name}",
                                                        "error": f"{type(e).__name__}: {e}"})
            return FollowUp(due=retry_policy.ERROR_SECONDS)
        if ctx is None or ctx.uid != uid:
            return None
        ctx.token, ctx.endpoint = known.get("token", ""), known.get("endpoint")
        ctx.sources, ctx.owner_calls = sources, owner_calls
        _reconcile(ctx)
        if known.get("epoch") == epoch:    # nothing it read changed meanwhile
            known.update(token=ctx.token, endpoint=ctx.endpoint)
    metrics.PASS_SECONDS.observe(time.perf_counter() - t0)
    return ctx.follow_up


def _reconcile(ctx: ModelContext) -> None:
    model = f"{ctx.namespace}/{ctx.name}"
    try:
        outcome, _ = reconcile(ctx)
    except kopf.TemporaryError as e:
        metrics.RECONCILES.labels(result="waiting").inc()
        log.info("pass waits", extra={"model": model, "reason": str(e)})
        ctx.follow_up.recheck_in(e.delay or retry_policy.ERROR_SECONDS)
        return
    except Exception as e:  # noqa: BLE001 - counted, logged, shown on the model and retried
        metrics.RECONCILES.labels(result="error").inc()
        metrics.RECONCILE_ERRORS.labels(reason=type(e).__name__).inc()
        log.exception("pass failed", extra={"model": model})
        ctx.follow_up.recheck_in(retry_policy.ERROR_SECONDS)
        _report_failure(ctx, e)
        return
    finally:
        ctx.announce_created()   # one Event for the children the pass created, also if it failed
    metrics.RECONCILES.labels(result=outcome).inc()


def _report_failure(ctx: ModelContext, error: Exception) -> None:
    """A pass that fails (the API server refuses a child: a full Service IP range, a
    ResourceQuota, a webhook) says so on the model: ``Degraded=True`` reason
    ``ReconcileFailed`` with the API server's own message, kept until a pass succeeds.
    Without it the model would show nothing, or an old status, while every retry fails."""
    message = f"{type(error).__name__}: {error}"
    if isinstance(error, ApiException):
        try:
            message = json.loads(error.body or "{}").get("message") or message
        except ValueError:
            pass
        message = f"the API server answered {error.status} {error.reason}: {message}"
    try:
        write_status(ctx, [c.condition(c.DEGRADED, True, "ReconcileFailed", message[:1000])],
                     {"phase": "Degraded"})
    except Exception:  # noqa: BLE001 - the API server may be the thing that fails
        log.warning("cannot report the failed pass on the model", extra={"model": f"{ctx.namespace}/{ctx.name}"})
