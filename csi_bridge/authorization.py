"""Namespace authorization: a Pod may mount only bundles its own namespace declares.

With ``podInfoOnMount`` kubelet tells the bridge which Pod a volume is for. A bundle is
declared in a namespace by a ResidentModel there: its ``spec.bundle`` and ``spec.stage``
(digest and source), the revision it keeps for a rollback (``status.previousBundle``) or,
while a transition is under way, the revision it currently reports in
``status.identity.bundle``. A Pod naming a bundle no ResidentModel of its namespace
declares gets PERMISSION_DENIED. Declaring a digest is not enough to read it: a copied
digest with a bogus source is stopped by the proof of possession (``possession.py``).

Three policies, chosen by ``--authorize``:
- ``api`` reads ResidentModels from the Kubernetes API (the production policy);
- ``deny`` refuses every publish; it is the fallback when the bridge has no API access,
  so a misconfigured bridge fails closed;
- ``static`` reads a JSON file ``{"<namespace>": ["sha256:...", ...]}`` for tests and
  clusters without API access. ``allow-any`` exists for conformance suites only.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Protocol

from .arguments import BundleRef, PodRef

RESIDENT_GROUP, RESIDENT_VERSION, MODELS = "resident.dev", "v1alpha1", "residentmodels"


class Denied(Exception):
    """The Pod's namespace does not declare the bundle it asks for (or cannot be checked)."""


class Unchecked(Denied):
    """The check could not be made: the API server did not answer, or answered 429 or 5xx.
    Still a refusal (the bridge fails closed), but a passing one: try again."""


class Authorizer(Protocol):
    name: str

    def authorize(self, pod: PodRef, bundle: BundleRef) -> None: ...


def _require_namespace(pod: PodRef) -> str:
    if not pod.namespace:
        raise Denied("volume_context carries no csi.storage.k8s.io/pod.namespace: the CSIDriver "
                     "must set podInfoOnMount: true so the bridge can check the Pod's namespace")
    return pod.namespace


class DenyAll:
    name = "deny"

    def authorize(self, pod: PodRef, bundle: BundleRef) -> None:
        raise Denied("namespace authorization has no API access (--authorize=deny): every "
                     "publish is refused; run with --authorize=api and a kubeconfig or service account")


class AllowAny:
    name = "allow-any"

    def authorize(self, pod: PodRef, bundle: BundleRef) -> None:
        return None


class StaticPolicy:
    """Allowed digests per namespace from a JSON file, read once at start."""

    name = "static"

    def __init__(self, path: Path):
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"authorization file {path}: {e}") from None
        if not isinstance(doc, dict) or not all(
                isinstance(v, list) and all(isinstance(d, str) for d in v) for v in doc.values()):
            raise ValueError(f"authorization file {path}: expected {{namespace: [digest, ...]}}")
        self.allowed = {ns: set(v) for ns, v in doc.items()}

    def authorize(self, pod: PodRef, bundle: BundleRef) -> None:
        ns = _require_namespace(pod)
        if bundle.digest not in self.allowed.get(ns, set()):
            raise Denied(f"namespace {ns!r} does not declare bundle {bundle.digest}")


def declared_bundles(model: dict) -> set[tuple[str, str | None]]:
    """(digest, source) pairs a ResidentModel declares; source None means 'any source'."""
    spec, status = model.get("spec") or {}, model.get("status") or {}
    status_identity = status.get("identity") or {}
    out: set[tuple[str, str | None]] = set()
    # the live revision, the one staged ahead, and the one kept for a rollback
    for ref in (spec.get("bundle"), spec.get("stage"), status.get("previousBundle")):
        if isinstance(ref, dict) and ref.get("digest"):
            out.add((ref["digest"], ref.get("source")))
    if status_identity.get("bundle"):
        out.add((status_identity["bundle"], None))
    return out


def model_declares(model: dict, bundle: BundleRef) -> bool:
    return any(d == bundle.digest and (s is None or s == bundle.source)
               for d, s in declared_bundles(model))


class ApiPolicy:
    """Reads ResidentModels of the Pod's namespace from the API server on every check."""

    name = "api"

    def __init__(self, api_client):
        from kubernetes import client
        self.api = client.CustomObjectsApi(api_client)

    def authorize(self, pod: PodRef, bundle: BundleRef) -> None:
        from kubernetes.client.exceptions import ApiException
        ns = _require_namespace(pod)
        try:
            if bundle.model:
                models = [self.api.get_namespaced_custom_object(
                    RESIDENT_GROUP, RESIDENT_VERSION, ns, MODELS, bundle.model, _request_timeout=10)]
            else:
                models = self.api.list_namespaced_custom_object(
                    RESIDENT_GROUP, RESIDENT_VERSION, ns, MODELS, _request_timeout=10)["items"]
        except ApiException as e:
            if e.status == 404:
                raise Denied(f"ResidentModel {bundle.model!r} not found in namespace {ns!r}") from None
            refusal = Unchecked if e.status == 429 or e.status >= 500 else Denied
            raise refusal(f"cannot read ResidentModels in {ns!r}: HTTP {e.status} {e.reason}") from None
        except Exception as e:  # network errors: fail closed, say why, and try again
            raise Unchecked(f"cannot read ResidentModels in {ns!r}: {type(e).__name__}: {e}") from None
        if not any(model_declares(m, bundle) for m in models):
            who = f"ResidentModel {bundle.model!r}" if bundle.model else "no ResidentModel"
            verb = "does not declare" if bundle.model else "declares"
            raise Denied(f"{who} in namespace {ns!r} {verb} bundle {bundle.digest} "
                         f"from {bundle.source}")


class AwaitedPolicy:
    """The policy of a bridge that serves before it has reached the API server.

    The bridge registers with kubelet first (importing the Kubernetes client costs seconds,
    and every mount that fails meanwhile doubles kubelet's wait); a check made before the
    real policy arrives waits for it, up to ``wait_seconds``, instead of failing.
    """

    def __init__(self, name: str, wait_seconds: float = 30.0):
        self.name, self.wait_seconds = name, wait_seconds
        self._policy: Authorizer | None = None
        self._arrived = threading.Event()

    def arrive(self, policy: Authorizer) -> None:
        self._policy = policy
        self._arrived.set()

    def authorize(self, pod: PodRef, bundle: BundleRef) -> None:
        if not self._arrived.wait(self.wait_seconds):
            raise Unchecked(f"the bridge has not reached the Kubernetes API within "
                            f"{self.wait_seconds:g} s of the check; try again")
        self._policy.authorize(pod, bundle)


def make_authorizer(mode: str, *, api_client=None, static_file: Path | None = None) -> Authorizer:
    if mode == "allow-any":
        return AllowAny()
    if mode == "deny":
        return DenyAll()
    if mode == "static":
        if static_file is None:
            raise ValueError("--authorize=static needs --authorize-file")
        return StaticPolicy(static_file)
    if mode == "api":
        return ApiPolicy(api_client) if api_client is not None else DenyAll()
    raise ValueError(f"unknown authorization mode {mode!r} (api, deny, static, allow-any)")
