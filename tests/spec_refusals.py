"""Semantic errors in a ResidentModel spec, one for each validation rule of the CRD.

The API server refuses each at ``kubectl apply`` with the CRD's rule
(``x-kubernetes-validations`` in crds/residentmodels.resident.dev.yaml), naming the field;
the operator's own check (``resident_operator.spec``) refuses the same spec again, as the
second line. tests/cluster/test_crd_residentmodel.py applies every case,
tests/unit/test_operator_spec.py checks every case against the operator and every rule of
the CRD against this table, so a rule without a case fails a test.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

DIGEST = "sha256:" + "ab" * 32
SPEC = {"bundle": {"source": "file:///srv/bundles/tiny", "digest": DIGEST}}


@dataclass(frozen=True)
class Refusal:
    """A spec that breaks one rule; ``field`` and ``says`` are in the API server's answer,
    ``operator_says`` in the operator's."""
    rule: str
    change: dict[str, Any]
    field: str
    says: str
    operator_says: str

    def spec(self) -> dict[str, Any]:
        return merged(SPEC, self.change)


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _toleration(**fields: Any) -> dict[str, Any]:
    return {"tolerations": [fields]}


REFUSALS = [
    Refusal("cpu backend on a card", {"accelerator": "nvidia.com/gpu"},
            "spec.runtime.backend", "spec.runtime.backend cpu runs only on accelerator cpu",
            "backend 'cpu' runs only on accelerator cpu"),
    Refusal("torch backend on a vendor card", {"accelerator": "furiosa.ai/rngd", "runtime": {"backend": "torch"}},
            "spec.runtime.backend", "torch runs only on accelerator cpu or nvidia.com/gpu",
            "runs only on accelerator cpu or nvidia.com/gpu"),
    Refusal("rngd backend on another card", {"accelerator": "rebellions.ai/ATOM", "runtime": {"backend": "rngd"}},
            "spec.runtime.backend", "rngd runs only on accelerator furiosa.ai/rngd",
            "runs only on accelerator furiosa.ai/rngd"),
    Refusal("atom backend on another card", {"accelerator": "furiosa.ai/rngd", "runtime": {"backend": "atom"}},
            "spec.runtime.backend", "atom runs only on accelerator rebellions.ai/ATOM or rebellions.ai/npu",
            "runs only on accelerator rebellions.ai/ATOM or rebellions.ai/npu"),
    Refusal("cpu accelerator with a card's backend", {"runtime": {"backend": "vllm"}},
            "spec.accelerator", "spec.accelerator cpu needs spec.runtime.backend cpu or torch",
            "accelerator 'cpu' needs spec.runtime.backend 'cpu' or 'torch'"),
    Refusal("one port for control and inference", {"serving": {"port": 8080}},
            "spec.serving.port", "must differ from spec.runtime.port",
            "spec.runtime.port 8080 and spec.serving.port 8080 overlap"),
    Refusal("the card in resources.requests",
            {"accelerator": "furiosa.ai/rngd", "runtime": {"backend": "rngd",
                                                           "resources": {"requests": {"furiosa.ai/rngd": 1}}}},
            "spec.runtime.resources.requests", "must not name an accelerator",
            "the card comes from spec.accelerator"),
    Refusal("a card in resources.limits", {"runtime": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
            "spec.runtime.resources.limits", "must not name an accelerator",
            "the card comes from spec.accelerator"),
    Refusal("warmup without variants", {"runtime": {"warmup": True}},
            "spec.runtime.warmup", "nothing to warm up", "nothing to warm up"),
    Refusal("two variants of one name", {"runtime": {"variants": [{"name": "a"}, {"name": "a", "batchSize": 4}]}},
            "spec.runtime.variants", "every variant needs its own name", "duplicate names a"),
    Refusal("Exists toleration with a value", _toleration(key="npu", operator="Exists", value="yes"),
            "spec.tolerations[0].value", "operator Exists must not have a value", "must not have a value"),
    Refusal("toleration without a key or Exists", _toleration(operator="Equal", value="yes"),
            "spec.tolerations[0].operator", "an empty key needs operator Exists", "an empty key needs operator Exists"),
    Refusal("tolerationSeconds without NoExecute",
            _toleration(key="npu", operator="Exists", effect="NoSchedule", tolerationSeconds=30),
            "spec.tolerations[0].tolerationSeconds", "tolerationSeconds needs effect NoExecute",
            "needs effect NoExecute"),
    Refusal("a relative file:// source", {"bundle": {"source": "file://srv/bundles/tiny"}},
            "spec.bundle.source", "needs an absolute path and no host", "absolute path"),
    Refusal("an http:// source without a host", {"bundle": {"source": "http:///tiny"}},
            "spec.bundle.source", "an http(s):// source needs a host", "needs a host"),
    Refusal("an oci:// source without a repository", {"bundle": {"source": "oci://registry:5000"}},
            "spec.bundle.source", "needs registry/repository", "registry/repository"),
    Refusal("an s3:// source with an invalid bucket name", {"bundle": {"source": "s3://My_Models/tiny"}},
            "spec.bundle.source", "an s3:// source needs a valid bucket name", "not a valid S3 bucket name"),
    Refusal("an hf:// source without a commit", {"bundle": {"source": "hf://acme/tiny"}},
            "spec.bundle.source", "an hf:// source needs a repository and a commit", "no revision; pin a commit"),
    Refusal("a staged revision at a relative file:// source",
            {"stage": {"source": "file://srv/bundles/next", "digest": DIGEST}},
            "spec.stage.source", "needs an absolute path and no host", "absolute path"),
    Refusal("a staged revision at an http:// source without a host",
            {"stage": {"source": "http:///next", "digest": DIGEST}},
            "spec.stage.source", "an http(s):// source needs a host", "needs a host"),
    Refusal("a staged revision at an oci:// source without a repository",
            {"stage": {"source": "oci://registry:5000", "digest": DIGEST}},
            "spec.stage.source", "needs registry/repository", "registry/repository"),
    Refusal("a staged revision at an s3:// source with an invalid bucket name",
            {"stage": {"source": "s3://My_Models/next", "digest": DIGEST}},
            "spec.stage.source", "an s3:// source needs a valid bucket name", "not a valid S3 bucket name"),
    Refusal("a staged revision at an hf:// source without a commit",
            {"stage": {"source": "hf://acme/next", "digest": DIGEST}},
            "spec.stage.source", "an hf:// source needs a repository and a commit", "no revision; pin a commit"),
    Refusal("credentials for a source that reads none", {"bundle": {"credentialsSecret": "creds"}},
            "spec.bundle", "only s3:// and hf:// sources read credentials", "reads no credentials"),
]

# Not a validation rule but the resources schema: only requests and limits are declared,
# and kubectl's strict field validation refuses anything else (claims would add devices).
UNKNOWN_RESOURCES_FIELD = Refusal(
    "resources beyond requests and limits", {"runtime": {"resources": {"claims": [{"name": "x"}]}}},
    "spec.runtime.resources.claims", 'unknown field "spec.runtime.resources.claims"',
    "only requests and limits")

# Specs that pass every rule: each rule's accepting side, and the cpu resource on cpu.
ACCEPTED = [
    merged(SPEC, {"runtime": {"backend": "torch", "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                                                "limits": {"cpu": 4}}}}),
    merged(SPEC, {"accelerator": "furiosa.ai/rngd", "replicas": 2,
                  "bundle": {"source": "oci://registry:5000/models/tiny"},
                  "runtime": {"backend": "rngd", "port": 9000, "warmup": True,
                              "variants": [{"name": "short"}, {"name": "long", "maxSeqLen": 4096}]},
                  "serving": {"port": 9001},
                  "tolerations": [{"key": "npu", "operator": "Exists", "effect": "NoExecute",
                                   "tolerationSeconds": 30},
                                  {"operator": "Exists"},
                                  {"key": "pool", "operator": "Equal", "value": "npu"}]}),
    merged(SPEC, {"accelerator": "rebellions.ai/npu", "runtime": {"backend": "atom"},
                  "bundle": {"source": "https://user@bundles.example:8443/tiny"}}),
    merged(SPEC, {"accelerator": "nvidia.com/gpu", "runtime": {"backend": "vendor-x"},
                  "bundle": {"source": "file://localhost/srv/bundles/tiny"}}),
    merged(SPEC, {"bundle": {"source": "s3://models.team-a/tiny/v1?endpoint=http://minio.storage:9000"
                                       "&region=eu-1&addressing=virtual",
                             "credentialsSecret": "s3-reader.team-a"}}),
    merged(SPEC, {"bundle": {"source": "s3://models"}}),
    merged(SPEC, {"bundle": {"source": "hf://acme/tiny-llama@0123456789abcdef0123456789abcdef01234567"
                                       "?endpoint=http://hub-mirror.models:8090&chunk=1048576",
                             "credentialsSecret": "hf-reader"}}),
]
