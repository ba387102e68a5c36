"""The owner Pod template's hash: which owner Pods were made from an older spec.

An owner Pod is built from the spec's runtime (image, backend, port, resources, variants,
warmup), its placement (accelerator, nodeSelector, tolerations) and the installation's
settings. When any of these change, running owners must be replaced to pick the change
up; a change of the bundle revision must not (that is a transition, done in place or by
the transition's own replacements). :func:`template_hash` hashes the Pod spec
:func:`~.placement.build_owner_pod` would build, with what is not template left out (the
revision in the CSI volume's attributes; names and labels live in metadata), and each
owner Pod carries it in the annotation ``resident.dev/pod-template-hash``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .placement import build_owner_pod
from .settings import OperatorSettings
from .spec import ModelSpec

TEMPLATE_ANNOTATION = "resident.dev/pod-template-hash"


def template_hash(model: str, spec: ModelSpec, settings: OperatorSettings) -> str:
    """16 hex digits that change exactly when the owner Pod template changes."""
    pod_spec = build_owner_pod(model, "", spec, settings, 0, 0, "", "")["spec"]
    for volume in pod_spec.get("volumes") or []:
        attrs = (volume.get("csi") or {}).get("volumeAttributes")
        if attrs:
            attrs.pop("digest", None)
            attrs.pop("source", None)
    text = json.dumps(pod_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamp(pod: dict[str, Any], model: str, spec: ModelSpec, settings: OperatorSettings) -> dict[str, Any]:
    """``pod`` with its template hash annotation."""
    pod["metadata"].setdefault("annotations", {})[TEMPLATE_ANNOTATION] = template_hash(model, spec, settings)
    return pod


def outdated(pod: dict[str, Any], current: str) -> bool:
    """Was ``pod`` made from another template? A Pod without the annotation (made by an
    operator from before owners carried it) is taken as current and is not rolled."""
    made = ((pod.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_ANNOTATION)
    return made is not None and made != current
