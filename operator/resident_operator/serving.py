"""Serving: the one Service per model that applications call.

Service ``<model>`` (port ``http`` = ``spec.serving.port``) selects the model's owner Pods
by the model's UID label and sends traffic to each Pod's port named ``http``, so the
slot ports of host networking resolve per Pod. Endpoints follow Pod readiness, which the
owner keeps true through an in-place switch and turns false before a reload closes the
old revision (docs/owner.md). The Service is a child like every other: created, recorded
by UID, adopted after a crash, deleted by UID with the model (``companions.py``).

A model whose name is not a DNS-1035 label (dots, a leading digit) gets a Service named
after it with those characters replaced (see :func:`service_name`).
"""

from __future__ import annotations

import re
from typing import Any

from . import naming
from .companions import ensure_companion
from .context import ModelContext
from .model_state import ModelState
from .spec import ModelSpec

KIND = "Service"


def service_name(model: str) -> str:
    """``model`` when it is a valid Service name, else a DNS-1035 label derived from it."""
    name = re.sub(r"[^a-z0-9-]", "-", model)
    if not name[:1].isalpha():
        name = "m-" + name
    return naming.fit(name).rstrip("-")


def endpoint(model: str, namespace: str, spec: ModelSpec) -> str:
    return f"http://{service_name(model)}.{namespace}.svc:{spec.serving.port}"


def build_service(model: str, model_uid: str, spec: ModelSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": KIND,
        "metadata": {"name": service_name(model),
                     "labels": naming.model_labels(model, model_uid, naming.COMPONENT_SERVICE)},
        "spec": {
            "selector": naming.owner_match(model_uid),
            "ports": [{"name": naming.PORT_HTTP, "port": spec.serving.port,
                       "targetPort": naming.PORT_HTTP, "protocol": "TCP"}],
        },
    }


def ensure_service(ctx: ModelContext, state: ModelState, spec: ModelSpec) -> str:
    """Create, adopt or correct the model's Service; returns ``status.endpoint`` ('' while
    its name is held by an object that is not ours)."""
    svc = ensure_companion(ctx, state, build_service(ctx.name, ctx.uid, spec), ("ports",))
    return endpoint(ctx.name, ctx.namespace, spec) if svc is not None else ""
