"""The ResidentModel spec as a typed value, and every rule a spec must meet.

The CRD (``crds/residentmodels.resident.dev.yaml``) enforces shapes, ranges and patterns,
and its validation rules (CEL) refuse at apply the specs whose fields contradict each
other. :func:`spec_problems` checks those rules again (the second line: a CRD installed
by other means, objects stored before a rule existed) and adds the ones the API server
cannot know, which depend on the installation (a default owner image, slot ports on host
networking) or on fields the CRD leaves open (affinity). It returns every problem in
plain words. A model with problems gets ``Degraded=True`` with reason ``InvalidSpec`` and
the operator does nothing else for it (no Pods, no deliveries) until the spec is fixed.

The decisions behind each rule are written down in ``docs/operator.md``.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bundle.manifest import DIGEST_RE, ManifestError
from bundle.sources import CREDENTIAL_SCHEMES
from bundle.sources.hf import HfLocation
from bundle.sources.s3 import S3Location

from .settings import OperatorSettings

# Backends whose card is known: the backend only runs with that extended resource.
BACKEND_ACCELERATORS: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu",),
    "rngd": ("furiosa.ai/rngd",),
    "atom": ("rebellions.ai/ATOM", "rebellions.ai/npu"),
    "torch": ("cpu", "nvidia.com/gpu"),
}
KNOWN_ACCELERATORS = ("furiosa.ai/rngd", "rebellions.ai/ATOM", "rebellions.ai/npu", "nvidia.com/gpu")
LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
AFFINITY_KINDS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SpecError(ValueError):
    """The spec is not usable; the message lists every problem."""


class _Camel(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")


class BundleRef(_Camel):
    source: str
    digest: str
    # a Secret in the model's namespace whose data signs the source's requests (s3://)
    credentials_secret: str | None = Field(default=None, alias="credentialsSecret")


class StageRef(_Camel):
    """``spec.stage``: a revision to stage ahead on every owner's node (no switch); with
    ``preload`` each owner also loads it beside the live revision, so a reload to it is a swap."""
    source: str
    digest: str
    preload: bool = False


class DeliverySpec(_Camel):
    mode: Literal["Auto", "GraphOnly", "WholeBundle"] = "Auto"
    rebase: Literal["Auto", "Never"] = "Auto"
    min_reuse: float = Field(default=0.5, ge=0, le=1, alias="minReuse")


class Variant(_Camel):
    name: str
    batch_size: int = Field(default=1, ge=1, alias="batchSize")
    max_seq_len: int | None = Field(default=None, ge=1, alias="maxSeqLen")


class RuntimeSpec(_Camel):
    image: str = ""
    backend: str = "cpu"
    port: int = Field(default=8080, ge=1, le=65535)
    warmup: bool = False
    variants: tuple[Variant, ...] = ()
    resources: dict[str, Any] = Field(default_factory=dict)


class TransitionSpec(_Camel):
    strategy: Literal["Auto", "InPlace", "Reload"] = "Auto"
    max_unavailable: int = Field(default=1, ge=1, alias="maxUnavailable")
    commit: Literal["Rolling", "Lockstep"] = "Rolling"
    timeout_seconds: int = Field(default=600, ge=1, le=86400, alias="timeoutSeconds")
    keep_previous: bool = Field(default=True, alias="keepPrevious")


class ServingSpec(_Camel):
    """How applications reach the model: the inference port and an optional API key."""
    port: int = Field(default=8000, ge=1, le=65535)
    api_key_secret: str | None = Field(default=None, alias="apiKeySecret")


class Toleration(_Camel):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")


class ModelSpec(_Camel):
    """``spec`` of a ResidentModel, with the CRD's defaults."""

    accelerator: str = "cpu"
    replicas: int = Field(default=1, ge=0, le=1024)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: tuple[Toleration, ...] = ()
    affinity: dict[str, Any] = Field(default_factory=dict)
    topology_spread_constraints: tuple[dict[str, Any], ...] = Field(
        default=(), alias="topologySpreadConstraints")
    priority_class_name: str = Field(default="", alias="priorityClassName")
    bundle: BundleRef
    stage: StageRef | None = None
    delivery: DeliverySpec = DeliverySpec()
    runtime: RuntimeSpec = RuntimeSpec()
    transition: TransitionSpec = TransitionSpec()
    serving: ServingSpec = ServingSpec()

    @property
    def cards(self) -> int:
        """Cards each owner Pod requests: exactly one, or none for cpu."""
        return 0 if self.accelerator == "cpu" else 1


def parse_spec(raw: dict[str, Any] | None) -> ModelSpec:
    """Turn ``body['spec']`` into a :class:`ModelSpec`; raise :class:`SpecError` on shape errors."""
    try:
        return ModelSpec.model_validate(dict(raw or {}))
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            parts.append(f"spec.{loc}: {err['msg']}")
        raise SpecError("; ".join(parts)) from None


def spec_problems(spec: ModelSpec, settings: OperatorSettings) -> list[str]:
    """Every semantic problem of ``spec`` the CRD schema cannot catch, in plain words."""
    problems: list[str] = []
    problems += _bundle_problems(spec.bundle)
    if spec.stage is not None:
        problems += _source_problems("spec.stage", spec.stage.source, spec.stage.digest)
    problems += _runtime_problems(spec, settings)
    problems += _placement_problems(spec)
    return problems


def check_spec(raw: dict[str, Any] | None, settings: OperatorSettings) -> ModelSpec:
    """Parse and validate; raise :class:`SpecError` listing every problem."""
    spec = parse_spec(raw)
    problems = spec_problems(spec, settings)
    if problems:
        raise SpecError("; ".join(problems))
    return spec


def _bundle_problems(bundle: BundleRef) -> list[str]:
    out = _source_problems("spec.bundle", bundle.source, bundle.digest)
    parts = urlsplit(bundle.source)
    secret = bundle.credentials_secret
    if secret is not None:
        if not DNS_SUBDOMAIN_RE.match(secret) or len(secret) > 253:
            out.append(f"spec.bundle.credentialsSecret {secret!r} is not a valid Secret name")
        if parts.scheme not in CREDENTIAL_SCHEMES:
            out.append(f"spec.bundle.credentialsSecret is set, but a {parts.scheme or 'schemeless'}"
                       f" source reads no credentials (only {', '.join(s + '://' for s in CREDENTIAL_SCHEMES)}"
                       " sources do)")
    return out


def _runtime_problems(spec: ModelSpec, settings: OperatorSettings) -> list[str]:
    out = []
    rt = spec.runtime
    wanted = BACKEND_ACCELERATORS.get(rt.backend)
    if wanted is not None and spec.accelerator not in wanted:
        out.append(f"spec.runtime.backend {rt.backend!r} runs only on accelerator "
                   f"{' or '.join(wanted)}, not {spec.accelerator!r}")
    if spec.accelerator == "cpu" and rt.backend not in ("cpu", "torch"):
        out.append(f"spec.accelerator 'cpu' needs spec.runtime.backend 'cpu' or 'torch', "
                   f"not {rt.backend!r}")
    if not rt.image and not settings.owner_image:
        out.append("spec.runtime.image is empty and the operator has no default owner image "
                   "(RESIDENT_OWNER_IMAGE)")
    if rt.warmup and not rt.variants:
        out.append("spec.runtime.warmup is true but spec.runtime.variants is empty: "
                   "nothing to warm up")
    names = [v.name for v in rt.variants]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        out.append(f"spec.runtime.variants: duplicate names {', '.join(dups)}")
    out += _resources_problems(spec)
    out += _port_problems(spec, settings)
    secret = spec.serving.api_key_secret
    if secret is not None and not DNS_SUBDOMAIN_RE.match(secret):
        out.append(f"spec.serving.apiKeySecret {secret!r} is not a valid Secret name")
    return out


def _port_problems(spec: ModelSpec, settings: OperatorSettings) -> list[str]:
    """The control and inference ports must differ; on host networking slot k takes
    base+k of each (docs/operator.md), so the two ranges must not overlap either."""
    control, http = spec.runtime.port, spec.serving.port
    width = max(spec.replicas, 1) if settings.owner_host_network else 1
    if abs(control - http) < width:
        return [f"spec.runtime.port {control} and spec.serving.port {http} overlap"
                + (f" for {width} replicas on host networking (slot k uses port+k)" if width > 1 else "")]
    if settings.owner_host_network and max(control, http) + width - 1 > 65535:
        return [f"spec.replicas {spec.replicas}: slot ports above 65535 (slot k uses port+k)"]
    return []


def _resources_problems(spec: ModelSpec) -> list[str]:
    out = []
    res = spec.runtime.resources
    extra = sorted(set(res) - {"requests", "limits"})
    if extra:
        out.append(f"spec.runtime.resources: only requests and limits are allowed, not {', '.join(extra)}")
    for part in ("requests", "limits"):
        section = res.get(part) or {}
        if not isinstance(section, dict):
            out.append(f"spec.runtime.resources.{part} must be a map of resource to quantity")
            continue
        cards = sorted(k for k in section
                       if k in KNOWN_ACCELERATORS or (spec.cards and k == spec.accelerator))
        if cards:
            out.append(f"spec.runtime.resources.{part} names {', '.join(cards)}: the card comes "
                       "from spec.accelerator (exactly one per owner), not from resources")
    return out


def _placement_problems(spec: ModelSpec) -> list[str]:
    out = []
    for key, value in spec.node_selector.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not DNS_SUBDOMAIN_RE.match(prefix)) or not name or len(name) > 63 \
                or not LABEL_NAME_RE.match(name):
            out.append(f"spec.nodeSelector key {key!r} is not a valid label key")
        if len(value) > 63 or not LABEL_NAME_RE.match(value):
            out.append(f"spec.nodeSelector[{key!r}] value {value!r} is not a valid label value")
    for i, t in enumerate(spec.tolerations):
        if t.operator == "Exists" and t.value:
            out.append(f"spec.tolerations[{i}]: operator Exists must not have a value")
        if not t.key and t.operator != "Exists":
            out.append(f"spec.tolerations[{i}]: an empty key needs operator Exists")
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            out.append(f"spec.tolerations[{i}]: tolerationSeconds needs effect NoExecute")
    extra = sorted(set(spec.affinity) - AFFINITY_KINDS)
    if extra:
        out.append(f"spec.affinity: only {', '.join(sorted(AFFINITY_KINDS))} are allowed, "
                   f"not {', '.join(extra)}")
    for i, tsc in enumerate(spec.topology_spread_constraints):
        if not isinstance(tsc.get("maxSkew"), int) or tsc["maxSkew"] < 1:
            out.append(f"spec.topologySpreadConstraints[{i}].maxSkew must be an integer >= 1")
        if not tsc.get("topologyKey"):
            out.append(f"spec.topologySpreadConstraints[{i}].topologyKey is required")
        if tsc.get("whenUnsatisfiable") not in ("DoNotSchedule", "ScheduleAnyway"):
            out.append(f"spec.topologySpreadConstraints[{i}].whenUnsatisfiable must be "
                       "DoNotSchedule or ScheduleAnyway")
    if spec.priority_class_name and not DNS_SUBDOMAIN_RE.match(spec.priority_class_name):
        out.append(f"spec.priorityClassName {spec.priority_class_name!r} is not a valid name")
    return out


def _source_problems(field: str, source: str, digest: str) -> list[str]:
    """What is wrong with a revision's digest and source (``field`` is spec.bundle or spec.stage)."""
    out = []
    if not DIGEST_RE.match(digest):
        out.append(f"{field}.digest {digest!r} is not sha256:<64 lowercase hex>")
    parts = urlsplit(source)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            out.append(f"{field}.source {source!r}: a file:// source needs an absolute "
                       "path and no host (file:///path)")
    elif parts.scheme in ("http", "https"):
        if not parts.hostname:
            out.append(f"{field}.source {source!r}: an http(s):// source needs a host")
    elif parts.scheme == "oci":
        if not parts.netloc or parts.path.strip("/") == "":
            out.append(f"{field}.source {source!r}: an oci:// source needs "
                       "registry/repository (oci://host:port/repo)")
    elif parts.scheme in ("s3", "hf"):
        try:
            (S3Location if parts.scheme == "s3" else HfLocation).parse(source)
        except ManifestError as e:
            out.append(f"{field}.source {e}")
    else:
        out.append(f"{field}.source {source!r}: scheme must be file, http, https, oci, s3 or hf")
    return out
