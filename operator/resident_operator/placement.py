"""Placement: the owner Pods and the token Secret of a model, as pure manifests.

Each owner Pod holds the model on exactly one card: it requests one unit of
``spec.accelerator`` (none for cpu), mounts the bundle through the CSI inline volume of
driver ``bundles.resident.dev`` (read-only; attributes ``digest``, ``source``, ``model``
per docs/contracts.md) at ``/bundle``, and the model's token Secret at
``/var/run/resident``. A model that names ``spec.bundle.credentialsSecret`` has it on the
bundle volume as ``nodePublishSecretRef``: kubelet, not the operator or the bridge, reads
that Secret (in the Pod's namespace) and hands its data to the bridge with each publish. kubelet only marks it Ready when the owner's ``/readyz`` answers, so
Pod readiness means "the model is resident and serving".

Where an owner may run is the scheduler's decision, never the operator's: no builder sets
``nodeName`` or a node affinity of its own, so a cordoned node (its ``unschedulable``
taint) never gets a new owner. Two placement rules are the installation's (settings):

- **Spread**: a model that sets no ``topologySpreadConstraints`` gets the default one,
  ``kubernetes.io/hostname`` with maxSkew 1, so its owners land one per node.
  ``ScheduleAnyway`` by default: a preference the scheduler scores, not a filter. With
  ``DoNotSchedule`` an owner stays Pending whenever the only free card is on a node that
  already holds one of the model's owners while another node in the domain count (a node
  without cards, or one of a pool the model's nodeSelector still admits) has none, e.g. a
  4th replica on 3 card nodes in a cluster with CPU nodes. A card left idle for the sake
  of spread is the one thing a resident model must not do; a model that wants a hard
  spread says so in its own ``topologySpreadConstraints``.
- **Node loss**: owners tolerate the NoExecute taints ``node.kubernetes.io/unreachable``
  and ``not-ready`` for ``node_loss_toleration_seconds`` only (default 10 s, instead of
  the 300 s admission gives every Pod), so the taint manager evicts an owner of a lost
  node soon and the operator places its replacement (docs/operator.md). A model that
  tolerates either taint itself keeps its own toleration.

The builders return plain dicts and never talk to the API server; the handlers adopt
(owner references) and create them.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from . import naming
from .settings import OperatorSettings
from .spec import ModelSpec

DIGEST_ANNOTATION = "resident.dev/bundle-digest"
# the node lifecycle controller's NoExecute taints of a node that stopped reporting
# (Ready=Unknown) or reports not ready (Ready=False)
NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
# Secret files belong to root; the owner image runs as a non-root user (10001) and the Pod
# sets no fsGroup (vendor images differ), so the token must be world-readable inside the
# one-container Pod.
TOKEN_MODE = 0o444
SOURCE_ANNOTATION = "resident.dev/bundle-source"


def owner_image(spec: ModelSpec, settings: OperatorSettings) -> str:
    return spec.runtime.image or settings.owner_image


def slot_ports(spec: ModelSpec, settings: OperatorSettings, slot: int) -> tuple[int, int]:
    """(control, inference) ports of the owner in ``slot``.

    Pods on host networking share the node's ports, so slot k listens on base+k of each
    and replicas of one model can run side by side on one node; otherwise every owner has
    its own network namespace and the bases themselves.
    """
    offset = slot if settings.owner_host_network else 0
    return spec.runtime.port + offset, spec.serving.port + offset


def owner_command(model: str, spec: ModelSpec, ports: tuple[int, int]) -> list[str]:
    """The owner's command line (the ``resident owner`` CLI)."""
    rt = spec.runtime
    cmd = ["resident", "owner", "--bundle-dir", naming.BUNDLE_MOUNT, "--backend", rt.backend,
           "--host", "0.0.0.0", "--port", str(ports[0]), "--inference-port", str(ports[1]),
           "--model-name", model, "--token-file", f"{naming.TOKEN_MOUNT_DIR}/{naming.TOKEN_KEY}"]
    if rt.backend == "torch":   # the card it was given, or the CPU
        cmd += ["--device", "cpu" if spec.accelerator == "cpu" else "cuda"]
    if spec.serving.api_key_secret:
        cmd += ["--api-key-file", f"{naming.API_KEY_MOUNT_DIR}/{naming.API_KEY_KEY}"]
    if rt.warmup:
        cmd.append("--warmup")
    return cmd


def owner_resources(spec: ModelSpec) -> dict[str, dict[str, Any]]:
    """User requests/limits plus exactly one card of the accelerator (requests == limits)."""
    requests = dict(spec.runtime.resources.get("requests") or {})
    limits = dict(spec.runtime.resources.get("limits") or {})
    if spec.cards:
        requests[spec.accelerator] = str(spec.cards)
        limits[spec.accelerator] = str(spec.cards)
    out: dict[str, dict[str, Any]] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def blas_threads(spec: ModelSpec) -> int | None:
    """The cpu backend's compute threads: the whole CPUs of the owner container's CPU limit
    (at least one), or None without a limit (the owner then computes on one thread,
    docs/owner.md). A limit that is no quantity is left to the API server to refuse."""
    limit = (spec.runtime.resources.get("limits") or {}).get("cpu")
    if spec.runtime.backend != "cpu" or limit is None:
        return None
    text = str(limit)
    try:
        return max(1, int(float(text[:-1]) / 1000 if text.endswith("m") else float(text)))
    except (ValueError, OverflowError):   # not a number, nan, inf
        return None


def build_owner_pod(model: str, model_uid: str, spec: ModelSpec, settings: OperatorSettings,
                    slot: int, incarnation: int, bundle_digest: str, bundle_source: str
                    ) -> dict[str, Any]:
    """The owner Pod of ``slot`` (its ``incarnation``), delivering ``bundle_digest``."""
    rt = spec.runtime
    labels = naming.model_labels(model, model_uid, naming.COMPONENT_OWNER)
    labels.update({naming.LABEL_SLOT: str(slot), naming.LABEL_INCARNATION: str(incarnation),
                   naming.LABEL_REVISION: naming.revision_label(bundle_digest)})
    env = [{"name": "RESIDENT_MODEL", "value": model}]
    if (threads := blas_threads(spec)) is not None:
        env.append({"name": "OPENBLAS_NUM_THREADS", "value": str(threads)})
    if rt.variants:
        env.append({"name": "RESIDENT_VARIANTS", "value": json.dumps(
            [v.model_dump(by_alias=True, exclude_none=True) for v in rt.variants])})
    ports = slot_ports(spec, settings, slot)
    container = {
        "name": naming.OWNER_CONTAINER,
        "image": owner_image(spec, settings),
        "command": owner_command(model, spec, ports),
        "env": env,
        "ports": [{"name": naming.PORT_CONTROL, "containerPort": ports[0], "protocol": "TCP"},
                  {"name": naming.PORT_HTTP, "containerPort": ports[1], "protocol": "TCP"}],
        # Until the startup probe passes kubelet runs no readiness probe; when it passes,
        # kubelet runs one at once, as no readiness result exists yet.
        "startupProbe": {
            "httpGet": {"path": "/readyz", "port": naming.PORT_CONTROL},
            "periodSeconds": 1, "failureThreshold": settings.owner_start_limit_seconds,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": naming.PORT_CONTROL},
            "periodSeconds": settings.readiness_period_seconds, "failureThreshold": 1,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": naming.PORT_CONTROL},
            "periodSeconds": 10, "failureThreshold": 6,
        },
        "volumeMounts": [
            {"name": "bundle", "mountPath": naming.BUNDLE_MOUNT, "readOnly": True},
            {"name": "owner-token", "mountPath": naming.TOKEN_MOUNT_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    resources = owner_resources(spec)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": settings.owner_host_network,
        "securityContext": {"runAsNonRoot": settings.owner_run_as_non_root,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "bundle", "csi": bundle_volume(model, spec, bundle_digest, bundle_source)},
            {"name": "owner-token", "secret": {
                "secretName": naming.token_secret_name(model), "defaultMode": TOKEN_MODE}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    if spec.serving.api_key_secret:
        container["volumeMounts"].append(
            {"name": "api-key", "mountPath": naming.API_KEY_MOUNT_DIR, "readOnly": True})
        pod_spec["volumes"].append({"name": "api-key", "secret": {
            "secretName": spec.serving.api_key_secret, "defaultMode": TOKEN_MODE,
            "items": [{"key": naming.API_KEY_KEY, "path": naming.API_KEY_KEY}]}})
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    tolerations += node_loss_tolerations(tolerations, settings.node_loss_toleration_seconds)
    pod_spec["tolerations"] = tolerations
    if spec.affinity:
        pod_spec["affinity"] = dict(spec.affinity)
    spread = spec.topology_spread_constraints or default_spread(settings)
    if spread:
        pod_spec["topologySpreadConstraints"] = [_owner_scoped(tsc, model_uid) for tsc in spread]
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    annotations = {DIGEST_ANNOTATION: bundle_digest, SOURCE_ANNOTATION: bundle_source}
    if settings.owner_scrape_annotations:   # metadata only: no template roll (pod_template.py)
        annotations.update(scrape_annotations(ports[1]))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": naming.owner_pod_name(model, slot, incarnation), "labels": labels,
                     "annotations": annotations},
        "spec": pod_spec,
    }


def scrape_annotations(port: int) -> dict[str, str]:
    """The de facto annotations a Prometheus with annotation-based discovery reads: the
    owner's inference port serves ``/metrics`` (the control port is the operator's only)."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics"}


def bundle_volume(model: str, spec: ModelSpec, digest: str, source: str) -> dict[str, Any]:
    """The ``csi`` of the owner's bundle volume: the revision, and the model's credentials."""
    csi: dict[str, Any] = {"driver": naming.CSI_DRIVER, "readOnly": True,
                           "volumeAttributes": {"digest": digest, "source": source, "model": model}}
    if spec.bundle.credentials_secret:
        csi["nodePublishSecretRef"] = {"name": spec.bundle.credentials_secret}
    return csi


def node_loss_tolerations(own: list[dict[str, Any]], seconds: int) -> list[dict[str, Any]]:
    """Tolerations of the node-loss taints for ``seconds``, except of a taint ``own`` (the
    model's tolerations) already tolerates with effect NoExecute."""
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in NODE_LOSS_TAINTS if not any(_tolerates_no_execute(t, key) for t in own)]


def _tolerates_no_execute(toleration: dict[str, Any], key: str) -> bool:
    """Does ``toleration`` match the NoExecute taint ``key`` (whatever its value)?"""
    if toleration.get("effect") not in (None, "", "NoExecute"):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"   # tolerates every taint
    return toleration["key"] == key


def default_spread(settings: OperatorSettings) -> list[dict[str, Any]]:
    """The installation's spread for a model that sets none (empty when turned off)."""
    if not settings.owner_spread_topology_key:
        return []
    return [{"maxSkew": settings.owner_spread_max_skew,
             "topologyKey": settings.owner_spread_topology_key,
             "whenUnsatisfiable": settings.owner_spread_when_unsatisfiable}]


def _owner_scoped(constraint: dict[str, Any], model_uid: str) -> dict[str, Any]:
    """A spread constraint without a labelSelector counts this model's owners."""
    out = dict(constraint)
    out.setdefault("labelSelector", {"matchLabels": naming.owner_match(model_uid)})
    return out


def new_token() -> str:
    return secrets.token_urlsafe(32)


def build_token_secret(model: str, model_uid: str, token: str) -> dict[str, Any]:
    """The per-model Secret holding the bearer token owners require (key ``token``)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": naming.token_secret_name(model),
                     "labels": naming.model_labels(model, model_uid, naming.COMPONENT_TOKEN)},
        "stringData": {naming.TOKEN_KEY: token},
    }
