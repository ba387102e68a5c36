"""The model's NetworkPolicy around its owners' control port, as a pure manifest, and the
settings that tell the operator who it is."""

import pytest

from resident_operator import naming
from resident_operator.control_policy import build_control_policy
from resident_operator.settings import OperatorSettings, SettingsError, settings_from_env

OPERATOR = {"app.kubernetes.io/name": "resident", "app.kubernetes.io/instance": "rel",
            "app.kubernetes.io/component": "operator"}
ENABLED = {"RESIDENT_OWNER_NETWORK_POLICY": "true",
           "RESIDENT_OPERATOR_POD_LABELS": ",".join(f"{k}={v}" for k, v in OPERATOR.items())}


def test_policy_admits_control_only_from_the_operator_and_inference_from_anyone():
    settings = settings_from_env({**ENABLED, "RESIDENT_OPERATOR_NAMESPACE": "resident-system"})
    policy = build_control_policy("tiny", "uid-1", settings)
    assert (policy["apiVersion"], policy["kind"], policy["metadata"]["name"]) == \
        ("networking.k8s.io/v1", "NetworkPolicy", "tiny-owner-control")
    assert policy["metadata"]["labels"][naming.LABEL_MODEL_UID] == "uid-1"
    spec = policy["spec"]
    # the owners of this model only: the labels its Service and budget select
    assert spec["podSelector"] == {"matchLabels": {naming.LABEL_MODEL_UID: "uid-1",
                                                   naming.LABEL_COMPONENT: naming.COMPONENT_OWNER}}
    assert spec["policyTypes"] == ["Ingress"]
    control, inference = spec["ingress"]
    assert control == {"from": [{"namespaceSelector": {"matchLabels": {
                                     "kubernetes.io/metadata.name": "resident-system"}},
                                 "podSelector": {"matchLabels": OPERATOR}}],
                       "ports": [{"port": "control", "protocol": "TCP"}]}
    assert inference == {"ports": [{"port": "http", "protocol": "TCP"}]}   # no "from": anyone


def test_namespace_labels_replace_the_namespace_name_and_long_models_fit():
    settings = settings_from_env({**ENABLED, "RESIDENT_OPERATOR_NAMESPACE": "resident-system",
                                  "RESIDENT_OPERATOR_NAMESPACE_LABELS": "team=platform, tier=infra"})
    peer, = build_control_policy("tiny", "u", settings)["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"team": "platform", "tier": "infra"}}
    name = build_control_policy("m" * 80, "u", settings)["metadata"]["name"]
    assert len(name) <= 63 and name.endswith("-owner-control")


def test_the_policy_setting_needs_to_know_the_operators_pods():
    assert OperatorSettings().owner_network_policy is False   # run by hand: off; the chart turns it on
    with pytest.raises(SettingsError, match="RESIDENT_OPERATOR_POD_LABELS"):
        settings_from_env({"RESIDENT_OWNER_NETWORK_POLICY": "true", "RESIDENT_OPERATOR_NAMESPACE": "ns"})
    with pytest.raises(SettingsError, match="RESIDENT_OPERATOR_NAMESPACE"):
        settings_from_env(ENABLED)
    with pytest.raises(SettingsError, match="RESIDENT_OPERATOR_POD_LABELS"):
        settings_from_env({**ENABLED, "RESIDENT_OPERATOR_NAMESPACE": "ns",
                           "RESIDENT_OPERATOR_POD_LABELS": "app.kubernetes.io/name"})
    off = settings_from_env({"RESIDENT_OWNER_NETWORK_POLICY": "false"})
    assert off.owner_network_policy is False and off.operator_pod_labels == {}
