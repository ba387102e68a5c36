"""Spec parsing and the semantic rules: the operator's own check, the second line behind
the CRD's validation rules (whose cases are in tests/spec_refusals.py)."""

from pathlib import Path

import pytest
import yaml

from resident_operator.settings import OperatorSettings, SettingsError, settings_from_env
from resident_operator.spec import SpecError, check_spec, parse_spec, spec_problems
from spec_refusals import ACCEPTED, REFUSALS, UNKNOWN_RESOURCES_FIELD

CRD = Path(__file__).resolve().parents[2] / "crds" / "residentmodels.resident.dev.yaml"

DIGEST = "sha256:" + "ab" * 32
WITH_IMAGE = OperatorSettings(owner_image="resident:dev")


def raw(**over):
    spec = {"bundle": {"source": "file:///models/tiny", "digest": DIGEST}}
    spec.update(over)
    return spec


def test_defaults_match_the_crd():
    s = parse_spec(raw())
    assert (s.accelerator, s.replicas, s.runtime.backend, s.runtime.port) == ("cpu", 1, "cpu", 8080)
    assert (s.serving.port, s.serving.api_key_secret) == (8000, None)
    assert (s.delivery.mode, s.delivery.rebase, s.delivery.min_reuse) == ("Auto", "Auto", 0.5)
    assert (s.transition.strategy, s.transition.max_unavailable, s.transition.timeout_seconds) \
        == ("Auto", 1, 600)
    assert s.cards == 0
    assert spec_problems(s, WITH_IMAGE) == []


def test_camel_case_fields_are_read():
    s = parse_spec(raw(delivery={"minReuse": 0.9}, transition={"maxUnavailable": 3},
                       nodeSelector={"zone": "a"}))
    assert s.delivery.min_reuse == 0.9 and s.transition.max_unavailable == 3
    assert s.node_selector == {"zone": "a"}


@pytest.mark.parametrize("over, needle", [
    ({"accelerator": "furiosa.ai/rngd"}, "backend 'cpu' runs only on accelerator cpu"),
    ({"runtime": {"backend": "rngd"}}, "accelerator 'cpu' needs spec.runtime.backend 'cpu'"),
    ({"accelerator": "rebellions.ai/ATOM", "runtime": {"backend": "rngd"}}, "runs only on accelerator furiosa.ai/rngd"),
    ({"runtime": {"warmup": True}}, "nothing to warm up"),
    ({"runtime": {"variants": [{"name": "a"}, {"name": "a"}]}}, "duplicate names a"),
    ({"runtime": {"resources": {"limits": {"furiosa.ai/rngd": 2}}}}, "the card comes from spec.accelerator"),
    ({"runtime": {"resources": {"claims": []}}}, "only requests and limits"),
    ({"bundle": {"source": "file://relative/path", "digest": DIGEST}}, "absolute path"),
    ({"bundle": {"source": "oci://registry", "digest": DIGEST}}, "registry/repository"),
    ({"bundle": {"source": "ftp://x/y", "digest": DIGEST}}, "scheme must be"),
    ({"bundle": {"source": "file:///x", "digest": "sha256:XYZ"}}, "is not sha256"),
    ({"nodeSelector": {"bad key!": "x"}}, "not a valid label key"),
    ({"nodeSelector": {"zone": "not valid!"}}, "not a valid label value"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "must not have a value"),
    ({"tolerations": [{"key": "k", "tolerationSeconds": 5, "effect": "NoSchedule"}]}, "needs effect NoExecute"),
    ({"affinity": {"nodeAffinity": {}, "weird": {}}}, "spec.affinity: only nodeAffinity"),
    ({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone",
                                     "whenUnsatisfiable": "DoNotSchedule"}]}, "maxSkew must be"),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "Maybe"}]}, "topologyKey is required"),
    ({"priorityClassName": "Not Valid"}, "spec.priorityClassName"),
    ({"serving": {"port": 8080}}, "spec.runtime.port 8080 and spec.serving.port 8080 overlap"),
    ({"serving": {"apiKeySecret": "Not_A_Name"}}, "is not a valid Secret name"),
])
def test_semantic_problems_are_named(over, needle):
    problems = spec_problems(parse_spec(raw(**over)), WITH_IMAGE)
    assert any(needle in p for p in problems), problems
    with pytest.raises(SpecError, match="spec"):
        check_spec(raw(**over), WITH_IMAGE)


@pytest.mark.parametrize("case", REFUSALS + [UNKNOWN_RESOURCES_FIELD], ids=lambda c: c.rule)
def test_the_operator_refuses_what_the_crd_rules_refuse(case):
    problems = spec_problems(parse_spec(case.spec()), WITH_IMAGE)
    assert any(case.operator_says in p for p in problems), problems


@pytest.mark.parametrize("spec", ACCEPTED)
def test_the_operator_accepts_what_the_crd_rules_accept(spec):
    assert spec_problems(parse_spec(spec), WITH_IMAGE) == []


def _crd_rules(schema, path="") -> list[tuple[str, str]]:
    """(where, message) of every x-kubernetes-validations rule in a CRD schema."""
    found = [(path, rule["message"]) for rule in schema.get("x-kubernetes-validations") or []]
    for name, sub in (schema.get("properties") or {}).items():
        found += _crd_rules(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += _crd_rules(schema["items"], f"{path}[]")
    return found


def test_every_crd_rule_has_a_refused_case_that_names_its_field():
    crd = yaml.safe_load(CRD.read_text())
    rules = _crd_rules(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    assert len(rules) == len(REFUSALS)
    for where, message in rules:
        cases = [c for c in REFUSALS if c.says in message]
        assert cases, f"no case in tests/spec_refusals.py for the rule at {where}: {message}"
        assert all(c.field.startswith("spec.") for c in cases)


def test_a_cpu_resource_on_the_cpu_is_no_card():
    s = parse_spec(raw(runtime={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}))
    assert spec_problems(s, WITH_IMAGE) == []


def test_slot_port_ranges_must_not_overlap_on_host_networking():
    s = parse_spec(raw(replicas=3, runtime={"port": 8080}, serving={"port": 8082}))
    assert spec_problems(s, WITH_IMAGE) == []      # own network namespaces: bases only
    host = OperatorSettings(owner_image="x", owner_host_network=True)
    assert any("overlap for 3 replicas on host networking" in p for p in spec_problems(s, host))
    assert spec_problems(parse_spec(raw(replicas=2, serving={"port": 8082})), host) == []
    assert any("above 65535" in p for p in spec_problems(
        parse_spec(raw(replicas=4, runtime={"port": 65534}, serving={"port": 8000})), host))


def test_torch_runs_on_the_cpu_or_a_gpu_and_is_told_which():
    from resident_operator.placement import owner_command
    for accelerator, device in (("cpu", "cpu"), ("nvidia.com/gpu", "cuda")):
        s = parse_spec(raw(accelerator=accelerator, runtime={"backend": "torch"}))
        assert spec_problems(s, WITH_IMAGE) == []
        cmd = owner_command("m", s, (8080, 8000))
        assert cmd[cmd.index("--device") + 1] == device
    s = parse_spec(raw(accelerator="furiosa.ai/rngd", runtime={"backend": "torch"}))
    assert any("runs only on accelerator cpu or nvidia.com/gpu" in p for p in spec_problems(s, WITH_IMAGE))


def test_vendor_backend_on_its_card_is_valid():
    s = parse_spec(raw(accelerator="rebellions.ai/npu", runtime={"backend": "atom"}))
    assert spec_problems(s, WITH_IMAGE) == [] and s.cards == 1


def test_missing_image_needs_an_operator_default():
    s = parse_spec(raw())
    assert any("RESIDENT_OWNER_IMAGE" in p for p in spec_problems(s, OperatorSettings()))
    s2 = parse_spec(raw(runtime={"image": "mine:1"}))
    assert spec_problems(s2, OperatorSettings()) == []


def test_shape_errors_say_where():
    with pytest.raises(SpecError, match="spec.bundle"):
        parse_spec({})
    with pytest.raises(SpecError, match="spec.transition.strategy"):
        parse_spec(raw(transition={"strategy": "Sideways"}))


def test_every_problem_is_reported_at_once():
    problems = spec_problems(parse_spec(raw(runtime={"warmup": True, "backend": "rngd"})), OperatorSettings())
    assert len(problems) >= 3


def test_settings_from_env():
    s = settings_from_env({"RESIDENT_OWNER_IMAGE": "img:1", "RESIDENT_OWNER_HOST_NETWORK": "true",
                           "RESIDENT_RESYNC_SECONDS": "1.5", "UNRELATED": "x"})
    assert s.owner_image == "img:1" and s.owner_host_network is True and s.resync_seconds == 1.5
    with pytest.raises(SettingsError, match="RESIDENT_OWNER_HOST_NETWORK"):
        settings_from_env({"RESIDENT_OWNER_HOST_NETWORK": "maybe"})
    with pytest.raises(SettingsError, match="RESIDENT_RESYNC_SECONDS"):
        settings_from_env({"RESIDENT_RESYNC_SECONDS": "-1"})
