"""The model's Service and endpoint, as pure manifests."""

from resident_operator import naming
from resident_operator.serving import build_service, endpoint, service_name
from resident_operator.spec import parse_spec

A = "sha256:" + "aa" * 32


def spec(**over):
    raw = {"bundle": {"source": "file:///m/tiny", "digest": A}}
    raw.update(over)
    return parse_spec(raw)


def test_service_selects_the_models_owners_by_uid_and_targets_the_named_port():
    svc = build_service("tiny", "uid-1", spec(serving={"port": 9001}))
    assert svc["metadata"]["name"] == "tiny"
    assert svc["metadata"]["labels"][naming.LABEL_MODEL_UID] == "uid-1"
    assert svc["spec"]["selector"] == {naming.LABEL_MODEL_UID: "uid-1",
                                       naming.LABEL_COMPONENT: naming.COMPONENT_OWNER}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 9001, "targetPort": "http",
                                     "protocol": "TCP"}]


def test_endpoint_names_the_service_in_cluster_dns():
    assert endpoint("tiny", "team-a", spec()) == "http://tiny.team-a.svc:8000"


def test_service_names_are_dns_1035_labels():
    assert service_name("llama-3") == "llama-3"
    assert service_name("llama.v3") == "llama-v3"
    assert service_name("3b-model") == "m-3b-model"
    long = service_name("a" * 80)
    assert len(long) <= 63 and long[0].isalpha()


def test_disruption_budget_bounds_evictions_by_max_unavailable():
    from resident_operator.disruption import build_disruption_budget
    pdb = build_disruption_budget("tiny", "uid-1", spec(transition={"maxUnavailable": 2}))
    assert (pdb["apiVersion"], pdb["kind"], pdb["metadata"]["name"]) == \
        ("policy/v1", "PodDisruptionBudget", "tiny")
    assert pdb["spec"] == {"maxUnavailable": 2, "selector": {"matchLabels": {
        naming.LABEL_MODEL_UID: "uid-1", naming.LABEL_COMPONENT: naming.COMPONENT_OWNER}}}


def test_only_a_model_with_more_owners_than_max_unavailable_gets_a_budget():
    from resident_operator.disruption import bounds_evictions
    assert not bounds_evictions(spec())                        # one owner: every eviction allowed anyway
    assert not bounds_evictions(spec(replicas=0))
    assert bounds_evictions(spec(replicas=2))
    assert not bounds_evictions(spec(replicas=2, transition={"maxUnavailable": 2}))
    assert bounds_evictions(spec(replicas=3, transition={"maxUnavailable": 2}))


def test_a_reloading_owner_drains_only_when_another_replica_can_take_its_traffic():
    from resident_operator.owner_step import DRAIN_MARGIN_SECONDS, drain_seconds
    from resident_operator.settings import OperatorSettings
    settings = OperatorSettings(owner_image="x", readiness_period_seconds=3)
    assert drain_seconds(spec(replicas=1), settings) == 0.0
    assert drain_seconds(spec(replicas=2), settings) == 3 + DRAIN_MARGIN_SECONDS
