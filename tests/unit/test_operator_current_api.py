"""What the operator creates is valid for the Kubernetes versions users run (1.29-1.34),
checked against each version's published OpenAPI schemas (kubernetes-validate, strict:
an unknown field fails too). The chart's own manifests are checked the same way in
tests/cluster/test_chart_release.py."""

import kopf
import pytest
import kubernetes_validate

from resident_operator.control_policy import build_control_policy
from resident_operator.disruption import build_disruption_budget
from resident_operator.placement import build_owner_pod, build_token_secret
from resident_operator.serving import build_service
from resident_operator.settings import OperatorSettings
from resident_operator.spec import parse_spec

VERSIONS = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0"]
DIGEST = "sha256:" + "ab" * 32
MODEL = {"apiVersion": "resident.dev/v1alpha1", "kind": "ResidentModel",
         "metadata": {"name": "tiny", "namespace": "ns", "uid": "uid-1"}}
SPEC = parse_spec({
    "bundle": {"source": "http://bundles:8000/tiny", "digest": DIGEST},
    "accelerator": "furiosa.ai/rngd", "replicas": 2,
    "runtime": {"backend": "rngd", "resources": {"requests": {"memory": "1Gi"}}},
    "serving": {"apiKeySecret": "keys"},
    "tolerations": [{"key": "npu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["npu"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
    "priorityClassName": "models"})


def children() -> list[dict]:
    settings = OperatorSettings(owner_image="resident-owner:1", owner_network_policy=True,
                                operator_namespace="resident-system",
                                operator_pod_labels={"app.kubernetes.io/component": "operator"})
    objs = [build_owner_pod("tiny", "uid-1", SPEC, settings, 1, 0, DIGEST, "http://bundles:8000/tiny"),
            build_token_secret("tiny", "uid-1", "t0ken"), build_service("tiny", "uid-1", SPEC),
            build_disruption_budget("tiny", "uid-1", SPEC),
            build_control_policy("tiny", "uid-1", settings)]
    for obj in objs:
        kopf.adopt(obj, owner=MODEL)
    return objs


@pytest.mark.parametrize("version", VERSIONS)
def test_children_validate_against_current_schemas(version):
    for obj in children():
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_check_catches_a_wrong_field():
    pod = children()[0]
    pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["prot"] = "control"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)
