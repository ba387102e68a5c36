"""The model's NetworkPolicy: its owners' control port is reached only from the operator.

Owners serve transitions and identity on the Pod port named ``control`` behind the
model's bearer token; the policy adds a network boundary in the model's own namespace,
where the owners run. It selects the model's owner Pods (the labels its Service and
PodDisruptionBudget select) and admits:
- the ``control`` port only from the operator's Pods: a namespace selector on the
  operator's namespace (``kubernetes.io/metadata.name``, or the labels the installation
  gives) together with a Pod selector on the operator's own Pod labels, both settings the
  chart passes (``settings.py``);
- the inference port (``http``) from every client: a Pod that some policy selects admits
  only what a policy allows, so the open port is listed too. Any other port of an owner is
  closed.

A companion child (``companions.py``): named ``<model>-owner-control``, owned by the
model, recorded by UID, re-created when deleted, put back when its spec drifted, deleted
by UID with the model. With ``RESIDENT_OWNER_NETWORK_POLICY`` off the operator creates
none and deletes, by UID, the ones it recorded earlier. It is enforced only by a CNI that
implements NetworkPolicy, and not for owners on host networking.
"""

from __future__ import annotations

from typing import Any

from . import naming
from .companions import ensure_companion, retire_companion
from .context import ModelContext
from .model_state import ModelState
from .settings import OperatorSettings

KIND = "NetworkPolicy"
API_VERSION = "networking.k8s.io/v1"


def operator_peer(settings: OperatorSettings) -> dict[str, Any]:
    """The operator's Pods as a NetworkPolicy peer (namespace AND Pod selector)."""
    namespace = (dict(settings.operator_namespace_labels)
                 or {naming.NAMESPACE_NAME_LABEL: settings.operator_namespace})
    return {"namespaceSelector": {"matchLabels": namespace},
            "podSelector": {"matchLabels": dict(settings.operator_pod_labels)}}


def build_control_policy(model: str, model_uid: str, settings: OperatorSettings) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": naming.control_policy_name(model),
                     "labels": naming.model_labels(model, model_uid, naming.COMPONENT_CONTROL_POLICY)},
        "spec": {
            "podSelector": {"matchLabels": naming.owner_match(model_uid)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [operator_peer(settings)],
                 "ports": [{"port": naming.PORT_CONTROL, "protocol": "TCP"}]},
                {"ports": [{"port": naming.PORT_HTTP, "protocol": "TCP"}]},
            ],
        },
    }


def ensure_control_policy(ctx: ModelContext, state: ModelState) -> None:
    """Create, adopt or correct the model's policy; with the setting off, delete ours."""
    if ctx.settings.owner_network_policy:
        ensure_companion(ctx, state, build_control_policy(ctx.name, ctx.uid, ctx.settings),
                         ("podSelector", "policyTypes", "ingress"))
        return
    retire_companion(ctx, state, KIND, "RESIDENT_OWNER_NETWORK_POLICY is off")
