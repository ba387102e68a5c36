"""Reaching a ResidentModel the way kubectl does: kubeconfig, context, namespace, errors.

The kubeconfig comes from ``--kubeconfig``, else ``KUBECONFIG`` (a list of files, merged
as kubectl merges them), else ``~/.kube/config``; ``--context`` picks a context, else the
current one; the namespace is ``-n``, else the context's, else ``default``. Every failure
becomes :class:`AccessError` with a message a human can act on: no kubeconfig, no API
server, a model that is not there, a user without RBAC for ``residentmodels``, a cluster
without the CRD, a change the API server refuses, or one that raced another writer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

GROUP, VERSION, PLURAL = "resident.dev", "v1alpha1", "residentmodels"
RESOURCE = f"{PLURAL}.{GROUP}"
REQUEST_TIMEOUT = 10   # seconds per read; a watch waits longer (WATCH_SECONDS)
WATCH_SECONDS = 300    # the server ends a watch after this; it is then resumed


class AccessError(Exception):
    """A failure to reach the model, with the message to print."""


@dataclass
class Target:
    namespace: str
    name: str
    api: client.ApiClient
    context: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


def connect(name: str, namespace: str | None, kubeconfig: str | None, context: str | None) -> Target:
    """The API client and namespace as kubectl would choose them."""
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((c for c in contexts if c["name"] == context), None) if context else current
        if chosen is None:
            raise AccessError(f"context {context!r} is not in the kubeconfig")
        api = config.new_client_from_config(config_file=kubeconfig, context=chosen["name"])
    except (ConfigException, FileNotFoundError) as e:
        raise AccessError(f"no usable kubeconfig ({e}); set KUBECONFIG or pass --kubeconfig") from None
    api.configuration.retries = 1   # an absent server is reported at once, not after 3 retries
    ns = namespace or (chosen.get("context") or {}).get("namespace") or "default"
    return Target(namespace=ns, name=name, api=api, context=chosen["name"])


def _explain(e: Exception, t: Target, verb: str) -> AccessError:
    where = f"namespace {t.namespace!r} (context {t.context!r})"
    if isinstance(e, ApiException):
        if e.status == 404:
            if _names_object(e):
                return AccessError(f"residentmodel {t.name!r} not found in {where}")
            return AccessError(f"the server has no {RESOURCE} resource: is Resident's CRD installed? "
                               f"(context {t.context!r})")
        if e.status == 403:
            grants = "patch" if verb == "patch" else "get, list and watch"
            return AccessError(f"forbidden: you cannot {verb} {RESOURCE} in {where}; ask for a Role "
                               f"granting {grants} on {RESOURCE} (server said: {_message(e)})")
        if e.status == 409:
            return AccessError(f"residentmodel {t.name!r} changed after it was read (someone else wrote "
                               f"it at the same time); nothing was written: run the command again")
        if e.status == 422:
            return AccessError(f"the API server refused the change: {_message(e)}")
        if e.status == 401:
            return AccessError(f"unauthorized: the API server refused the credentials of context {t.context!r}")
        return AccessError(f"the API server answered {e.status} {e.reason}: {_message(e)}")
    return AccessError(f"cannot reach the API server of context {t.context!r} at "
                       f"{t.api.configuration.host}: {_cause(e)}")


def _names_object(e: ApiException) -> bool:
    """A 404 for a missing object is a Status naming it; a missing resource is not."""
    try:
        return bool(((json.loads(e.body or "{}").get("details")) or {}).get("name"))
    except (ValueError, AttributeError):
        return False


def _message(e: ApiException) -> str:
    try:
        return json.loads(e.body or "{}").get("message") or e.reason
    except (ValueError, AttributeError):
        return str(e.reason)


def _cause(e: Exception) -> str:
    reason = getattr(e, "reason", None)
    return str(reason or e).splitlines()[0]


NETWORK = (urllib3.exceptions.HTTPError, OSError)


def read_model(t: Target) -> dict[str, Any]:
    try:
        return t.custom.get_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL, t.name,
                                                     _request_timeout=REQUEST_TIMEOUT)
    except (ApiException, *NETWORK) as e:
        raise _explain(e, t, "get") from None


def patch_model(t: Target, patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch of the model's spec; the ``resourceVersion`` it carries makes a
    concurrent change a 409 (:class:`AccessError`) instead of a lost update."""
    try:
        return t.custom.patch_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL, t.name, patch,
                                                       _request_timeout=REQUEST_TIMEOUT)
    except (ApiException, *NETWORK) as e:
        raise _explain(e, t, "patch") from None


def transition_events(t: Target, model: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events on this model (by its UID, so not a deleted namesake's), each as
    ``{reason, message, count, time}``; [] when the user may not list Events (the history
    then shows the status alone). Read through events.k8s.io/v1, the same Events the
    operator posts through v1: a generic read, so the plugin need not load the whole core
    API client (seconds of imports for one list)."""
    uid = model["metadata"]["uid"]
    try:
        found = t.custom.list_namespaced_custom_object("events.k8s.io", "v1", t.namespace, "events",
                                                       field_selector=f"regarding.uid={uid}",
                                                       _request_timeout=REQUEST_TIMEOUT)
    except ApiException as e:
        if e.status == 403:
            return []
        raise _explain(e, t, "list events for") from None
    except NETWORK as e:
        raise _explain(e, t, "list events for") from None
    return [{"reason": e.get("reason") or "", "message": e.get("note") or "",
             "count": (e.get("series") or {}).get("count") or e.get("deprecatedCount") or 1,
             "time": ((e.get("series") or {}).get("lastObservedTime") or e.get("deprecatedLastTimestamp")
                      or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp"))}
            for e in found.get("items") or []]


def changes(t: Target, resource_version: str, until: float | None = None
            ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The model's changes after ``resource_version``, as (type, model), for as long as the
    caller reads (or, with ``until``, up to that ``time.monotonic()``); a watch the server
    ends is resumed, one that expired (410) starts from a fresh read (yielded as MODIFIED)."""
    w = watch.Watch()
    while until is None or time.monotonic() < until:
        seconds = WATCH_SECONDS if until is None else max(1, min(WATCH_SECONDS, int(until - time.monotonic())))
        try:
            for event in w.stream(t.custom.list_namespaced_custom_object, GROUP, VERSION, t.namespace,
                                  PLURAL, field_selector=f"metadata.name={t.name}",
                                  resource_version=resource_version, timeout_seconds=seconds,
                                  allow_watch_bookmarks=False):
                obj = event["object"]
                resource_version = obj["metadata"]["resourceVersion"]
                yield event["type"], obj
        except ApiException as e:
            if e.status != 410:
                raise _explain(e, t, "watch") from None
            fresh = read_model(t)
            resource_version = fresh["metadata"]["resourceVersion"]
            yield "MODIFIED", fresh
        except NETWORK as e:
            raise _explain(e, t, "watch") from None
