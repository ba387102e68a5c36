"""Operator settings: what the platform decides, as opposed to what a ResidentModel asks.

A ResidentModel says which bundle to keep resident and how to switch revisions. Where the
owner image comes from when the model does not name one, how owners are reached, how
often a settled model is looked at again although nothing changed: those belong to the installation, so they
are read once at startup from ``RESIDENT_*`` environment variables (the Helm chart sets
them) into one typed, immutable object that every handler receives.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "RESIDENT_"


class SettingsError(ValueError):
    """An operator setting (environment variable) is malformed."""


class OperatorSettings(BaseModel):
    """Installation-wide operator settings. Field ``owner_image`` <- ``RESIDENT_OWNER_IMAGE``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owner_image: str = Field(default="", description="owner image when spec.runtime.image is empty")
    owner_host: str = Field(default="", description="host to reach owners at instead of the Pod IP")
    owner_host_network: bool = Field(default=False, description="run owner Pods with hostNetwork")
    owner_timeout_seconds: float = Field(default=2.0, gt=0, description=(
        "per owner HTTP call (and the longest wait for a free call slot): an owner that "
        "gives no answer within it is OwnerUnresponsive (owner_client.OwnerCalls)"))
    owner_calls: int = Field(default=32, ge=1, description=(
        "owner HTTP calls of passes in flight at once, across every model; the background "
        "probes of unresponsive owners have as many of their own"))
    owner_calls_per_model: int = Field(default=4, ge=1, description=(
        "owner HTTP calls of one model in flight at once"))
    owner_recheck_seconds: float = Field(default=5.0, gt=0, description=(
        "an owner that did not answer is asked again this often: in the background while it "
        "hangs (its model is woken when it answers), by the next pass when it refused"))
    owner_run_as_non_root: bool = Field(default=True, description=(
        "owner Pods set runAsNonRoot; false only for vendor images that must run as root"))
    resync_seconds: float = Field(default=300.0, gt=0, description=(
        "safety resync: a settled model is passed again this often even if nothing woke it"))
    resync_passes_per_second: float = Field(default=3.0, gt=0, description=(
        "the safety resyncs of all models together pass at most this many models a second: a "
        "due resync waits its turn, so with many models each model's resync comes less often"))
    sweep_seconds: float = Field(default=60.0, gt=0, description=(
        "how often the cluster-wide sweep looks for labelled orphans (at least)"))
    sweep_share: float = Field(default=0.02, gt=0, le=1, description=(
        "the share of the time the sweep may take: after a sweep that took t seconds the "
        "next waits max(sweep_seconds, t / sweep_share), so a larger cluster is swept less "
        "often instead of costing the operator more"))
    sweep_budget_seconds: float = Field(default=20.0, gt=0, description=(
        "the longest one sweep runs (on its own thread) before it stops and leaves the rest "
        "to the next; it never waits longer than that for a model's pass to finish"))
    readiness_period_seconds: int = Field(default=5, ge=1)
    owner_start_limit_seconds: int = Field(default=3600, ge=1, description=(
        "an owner Pod's startupProbe asks /readyz every second until it answers, at most "
        "this long, then kubelet restarts the container: a started owner turns Ready within "
        "a second of having loaded, not up to a readiness period later"))
    delete_grace_seconds: float = Field(default=300.0, gt=0, description=(
        "how long a deleted model waits for the bridge to release a BundleDelivery (or for "
        "kubelet to finish an owner Pod) before it stops waiting and says what may remain"))
    node_loss_toleration_seconds: int = Field(default=10, ge=0, description=(
        "owner Pods tolerate the NoExecute taints node.kubernetes.io/unreachable and not-ready "
        "this long, instead of the 300 s the DefaultTolerationSeconds admission plugin gives "
        "every Pod: an owner on a lost node is evicted (and replaced) that long after the node "
        "lifecycle controller taints its node (docs/operator.md, \"When a node is lost\")"))
    owner_spread_topology_key: str = Field(default="kubernetes.io/hostname", description=(
        "owner Pods of a model that sets no topologySpreadConstraints spread over this node "
        "label (one owner per node by default); empty: no default spread"))
    owner_spread_max_skew: int = Field(default=1, ge=1, description="maxSkew of the default spread")
    owner_spread_when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = Field(
        default="ScheduleAnyway", description=(
            "ScheduleAnyway: the spread is a preference, so an owner never stays Pending for it "
            "while a card is free on a node that already holds one (placement.default_spread)"))
    owner_network_policy: bool = Field(default=False, description=(
        "a NetworkPolicy per model admits its owners' control port only from the operator's "
        "Pods (control_policy.py); the chart turns it on, as the operator run by hand does "
        "not know its own Pods"))
    owner_scrape_annotations: bool = Field(default=False, description=(
        "owner Pods carry prometheus.io/scrape, port and path annotations naming their "
        "inference port's /metrics, for a Prometheus that finds targets by annotations (the "
        "chart sets it when it makes no PodMonitor; docs/metrics.md)"))
    operator_namespace: str = Field(default="", description=(
        "the operator's namespace (the chart sets it from the Pod's metadata.namespace)"))
    operator_namespace_labels: dict[str, str] = Field(default_factory=dict, description=(
        "labels selecting the operator's namespace, as k=v,k=v; empty: "
        "kubernetes.io/metadata.name=<operator_namespace>"))
    operator_pod_labels: dict[str, str] = Field(default_factory=dict, description=(
        "labels selecting the operator's Pods, as k=v,k=v (the chart's selector labels)"))

    @field_validator("operator_namespace_labels", "operator_pod_labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        """``k=v,k=v`` (as kubectl writes labels) into a mapping; a mapping stays as it is."""
        if not isinstance(value, str):
            return value
        labels = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            key, eq, val = part.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"{part!r} is not key=value")
            labels[key.strip()] = val.strip()
        return labels

    @model_validator(mode="after")
    def _peer_known(self) -> "OperatorSettings":
        if self.owner_network_policy and not self.operator_pod_labels:
            raise ValueError(f"{ENV_PREFIX}OWNER_NETWORK_POLICY needs "
                             f"{ENV_PREFIX}OPERATOR_POD_LABELS (the operator's own Pod labels)")
        if self.owner_network_policy and not (self.operator_namespace or self.operator_namespace_labels):
            raise ValueError(f"{ENV_PREFIX}OWNER_NETWORK_POLICY needs {ENV_PREFIX}OPERATOR_NAMESPACE "
                             f"or {ENV_PREFIX}OPERATOR_NAMESPACE_LABELS")
        return self


def settings_from_env(environ: Mapping[str, str] | None = None) -> OperatorSettings:
    """Read every field from ``RESIDENT_<FIELD>``; unknown RESIDENT_* variables are ignored."""
    environ = os.environ if environ is None else environ
    values = {}
    for name in OperatorSettings.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            raw = environ[key]
            if OperatorSettings.model_fields[name].annotation is bool:
                low = raw.strip().lower()
                if low not in ("true", "false", "1", "0", "yes", "no", ""):
                    raise SettingsError(f"{key}={raw!r}: expected true or false")
                values[name] = low in ("true", "1", "yes")
            else:
                values[name] = raw
    try:
        return OperatorSettings(**values)
    except ValidationError as e:
        parts = [f"{ENV_PREFIX}{str(err['loc'][0]).upper()}: {err['msg']}" if err["loc"] else err["msg"]
                 for err in e.errors()]
        raise SettingsError("; ".join(parts)) from None
