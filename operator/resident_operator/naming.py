"""Deterministic names and labels of everything the operator creates for a model.

A name is a function of the model and of what the object is for, never random, so an
operator that restarts in the middle of a step finds (or re-creates, tolerating 409) the
same object instead of a duplicate. Owner Pods are numbered *slots*; a replaced owner
gets the next *incarnation* of its slot (``-r1``, ``-r2``...) because the old Pod may
still be terminating under the same name. A BundleDelivery is named after the slot and
the target revision, so one delivery exists per (owner, revision).

Long model names are shortened with a hash so names stay within the 63-character limit
of Pod hostnames and label values.
"""

from __future__ import annotations

import hashlib

GROUP = "resident.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
MODEL_PLURAL = "residentmodels"
DELIVERY_PLURAL = "bundledeliveries"
CSI_DRIVER = "bundles.resident.dev"
FINALIZER = "resident.dev/cleanup"
BRIDGE_FINALIZER = "bundles.resident.dev/lease"   # the bridge's, on every BundleDelivery

LABEL_MODEL = "resident.dev/model"
LABEL_MODEL_UID = "resident.dev/model-uid"
LABEL_COMPONENT = "resident.dev/component"
LABEL_SLOT = "resident.dev/slot"
LABEL_INCARNATION = "resident.dev/incarnation"
LABEL_REVISION = "resident.dev/revision"
COMPONENT_OWNER = "owner"
COMPONENT_DELIVERY = "delivery"
COMPONENT_TOKEN = "token"
TOKEN_KEY = "token"
TOKEN_MOUNT_DIR = "/var/run/resident"
API_KEY_KEY = "api-key"
API_KEY_MOUNT_DIR = "/var/run/resident-api-key"
PORT_CONTROL = "control"
PORT_HTTP = "http"
OWNER_CONTAINER = "owner"               # the owner Pod's one container
COMPONENT_SERVICE = "service"
COMPONENT_BUDGET = "disruption-budget"
COMPONENT_CONTROL_POLICY = "control-policy"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"   # set on every Namespace from 1.21
BUNDLE_MOUNT = "/bundle"
MAX_NAME = 63


def fit(name: str, limit: int = MAX_NAME) -> str:
    """``name`` if short enough, else a prefix plus an 8-hex hash of the whole name."""
    if len(name) <= limit:
        return name
    tag = hashlib.sha256(name.encode()).hexdigest()[:8]
    return name[: limit - 9].rstrip("-.") + "-" + tag


def owner_pod_name(model: str, slot: int, incarnation: int = 0) -> str:
    suffix = f"-owner-{slot}" + (f"-r{incarnation}" if incarnation else "")
    return fit(model, MAX_NAME - len(suffix)) + suffix


def control_policy_name(model: str) -> str:
    """The model's NetworkPolicy (``control_policy.py``)."""
    return fit(model, MAX_NAME - len("-owner-control")) + "-owner-control"


def token_secret_name(model: str) -> str:
    return fit(f"{model}-owner-token", 253)


def delivery_name(model: str, slot: int, incarnation: int, digest: str) -> str:
    """One BundleDelivery per owner incarnation and target revision."""
    short = digest.split(":", 1)[-1][:12]
    suffix = f"-{slot}" + (f"-r{incarnation}" if incarnation else "") + f"-{short}"
    return fit(model, MAX_NAME - len(suffix)) + suffix


def revision_label(digest: str) -> str:
    """A label-safe revision tag: the first 16 hex digits of the bundle digest."""
    return digest.split(":", 1)[-1][:16]


def model_labels(model: str, model_uid: str, component: str) -> dict[str, str]:
    """Labels that tie a child to its model by name and by UID (the orphan sweep uses both)."""
    return {LABEL_MODEL: fit(model), LABEL_MODEL_UID: model_uid, LABEL_COMPONENT: component}


def owner_match(model_uid: str) -> dict[str, str]:
    """The labels that select a model's owner Pods (its Service's selector)."""
    return {LABEL_MODEL_UID: model_uid, LABEL_COMPONENT: COMPONENT_OWNER}


def owner_selector(model_uid: str) -> str:
    """:func:`owner_match` as a label selector string (``status.selector``, read by the
    scale subresource, so ``kubectl scale`` and an HPA can count the owners)."""
    return ",".join(f"{k}={v}" for k, v in owner_match(model_uid).items())
