"""The real API server enforces the ResidentModel schema: defaults, validation, columns,
and the CRD's validation rules (CEL), which refuse a semantic error at ``kubectl apply``
with a message that names the field (cases in tests/spec_refusals.py)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from spec_refusals import ACCEPTED, REFUSALS, UNKNOWN_RESOURCES_FIELD

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)

GROUP, VERSION, PLURAL = "resident.dev", "v1alpha1", "residentmodels"
DIGEST = "sha256:" + "ab" * 32
VALID = {
    "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResidentModel",
    "metadata": {"name": "tiny"},
    "spec": {"bundle": {"source": "file:///srv/bundles/tiny", "digest": DIGEST}},
}


def _create(cluster, namespace, body):
    api = client.CustomObjectsApi(cluster.api_client())
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def test_valid_model_is_accepted_with_defaults(cluster, namespace):
    created = _create(cluster, namespace, VALID)
    spec = created["spec"]
    assert spec["accelerator"] == "cpu"
    assert spec["replicas"] == 1
    assert spec["delivery"] == {"mode": "Auto", "rebase": "Auto", "minReuse": 0.5}
    assert spec["transition"] == {"strategy": "Auto", "maxUnavailable": 1, "timeoutSeconds": 600,
                                  "commit": "Rolling", "keepPrevious": True}
    assert spec["runtime"]["backend"] == "cpu" and spec["runtime"]["port"] == 8080


def _mutated(path: list[str], value):
    body = copy.deepcopy(VALID)
    node = body
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return body


@pytest.mark.parametrize("path,value,message", [
    (["spec", "bundle", "digest"], "sha256:XYZ", 'spec.bundle.digest in body should match'),
    (["spec", "bundle", "digest"], "md5:" + "0" * 32, 'spec.bundle.digest in body should match'),
    (["spec", "replicas"], -1, "spec.replicas in body should be greater than or equal to 0"),
    (["spec", "delivery", "mode"], "Torrent", 'spec.delivery.mode: Unsupported value: \\"Torrent\\": supported values: \\"Auto\\", \\"GraphOnly\\", \\"WholeBundle\\"'),
    (["spec", "delivery", "minReuse"], 1.5, "spec.delivery.minReuse in body should be less than or equal to 1"),
    (["spec", "transition", "strategy"], "Sometimes", 'spec.transition.strategy: Unsupported value: \\"Sometimes\\"'),
    (["spec", "transition", "commit"], "AllAtOnce", 'spec.transition.commit: Unsupported value: \\"AllAtOnce\\"'),
    (["spec", "stage", "digest"], "sha256:XYZ", 'spec.stage.digest in body should match'),
    (["spec", "bundle", "source"], "ftp://x/y", 'spec.bundle.source in body should match'),
    (["spec", "accelerator"], "not a resource", "spec.accelerator in body should match"),
    (["spec", "bundle", "credentialsSecret"], "S3_Creds", "spec.bundle.credentialsSecret in body should match"),
])
def test_invalid_models_are_rejected_by_the_server(cluster, namespace, path, value, message):
    with pytest.raises(ApiException) as err:
        _create(cluster, namespace, _mutated(path, value))
    assert err.value.status == 422
    assert message in err.value.body


def test_missing_bundle_is_rejected(cluster, namespace):
    body = copy.deepcopy(VALID)
    del body["spec"]["bundle"]
    with pytest.raises(ApiException) as err:
        _create(cluster, namespace, body)
    assert err.value.status == 422 and "spec.bundle: Required value" in err.value.body


def test_status_is_a_subresource(cluster, namespace):
    api = client.CustomObjectsApi(cluster.api_client())
    body = copy.deepcopy(VALID)
    body["status"] = {"phase": "Ready"}
    created = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert "status" not in created or created["status"].get("phase") != "Ready"
    patched = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "tiny", {"status": {"phase": "Pending", "ready": "0/1"}})
    assert patched["status"]["phase"] == "Pending"


def test_kubectl_shows_printer_columns(cluster, namespace):
    _create(cluster, namespace, VALID)
    out = cluster.kubectl("get", "rm", "-n", namespace).stdout
    header = out.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "BUNDLE", "READY", "ENDPOINT", "AGE"]
    assert DIGEST in out


def _apply(cluster, namespace: str, name: str, spec: dict):
    """``kubectl apply`` of a ResidentModel, as a user would; the completed process."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResidentModel",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)


def _models(cluster, namespace: str) -> list[str]:
    out = cluster.kubectl("get", "rm", "-n", namespace, "-o", "name").stdout
    return out.split()


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: c.rule)
def test_kubectl_apply_refuses_a_semantic_error_naming_the_field(cluster, namespace, case):
    done = _apply(cluster, namespace, "tiny", case.spec())
    assert done.returncode != 0, done.stdout
    assert f"{case.field}: Invalid value" in done.stderr, done.stderr
    assert case.says in done.stderr, done.stderr
    assert _models(cluster, namespace) == []


def test_kubectl_apply_refuses_resources_beyond_requests_and_limits(cluster, namespace):
    case = UNKNOWN_RESOURCES_FIELD
    done = _apply(cluster, namespace, "tiny", case.spec())
    assert done.returncode != 0 and case.says in done.stderr, done.stderr
    assert _models(cluster, namespace) == []


def test_kubectl_apply_accepts_specs_that_meet_every_rule(cluster, namespace):
    for i, spec in enumerate(ACCEPTED):
        done = _apply(cluster, namespace, f"ok-{i}", spec)
        assert done.returncode == 0, done.stderr
    assert sorted(_models(cluster, namespace)) == [f"residentmodel.resident.dev/ok-{i}"
                                                   for i in range(len(ACCEPTED))]


def test_an_edit_that_breaks_a_rule_is_refused_and_the_stored_spec_stays(cluster, namespace):
    assert _apply(cluster, namespace, "tiny", ACCEPTED[0]).returncode == 0
    broken = copy.deepcopy(ACCEPTED[0])
    broken["serving"] = {"port": 8080}
    done = _apply(cluster, namespace, "tiny", broken)
    assert done.returncode != 0 and "spec.serving.port: Invalid value" in done.stderr, done.stderr
    stored = json.loads(cluster.kubectl("get", "rm", "tiny", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["serving"]["port"] == 8000 and stored["metadata"]["generation"] == 1


def _without_rules(schema):
    """A CRD schema with every validation rule left out, as a CRD from before them."""
    if isinstance(schema, dict):
        return {k: _without_rules(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [_without_rules(v) for v in schema]
    return schema


def test_a_model_stored_before_the_rules_still_takes_metadata_and_status_writes(cluster, namespace, tmp_path):
    """The operator's check is the second line: a model that breaks a rule but was stored
    before the rule existed stays, its finalizer and status (InvalidSpec) can be written
    (CRD validation ratcheting), an edit that keeps the error is refused, the fix passes."""
    from localcluster.controlplane import CRD_DIR

    for source in CRD_DIR.glob("*.yaml"):
        (tmp_path / source.name).write_text(yaml.safe_dump(_without_rules(yaml.safe_load(source.read_text()))))
    api = client.CustomObjectsApi(cluster.api_client())
    where = (GROUP, VERSION, namespace, PLURAL)
    cluster.install_crds(tmp_path)
    try:
        body = copy.deepcopy(VALID)
        body["spec"]["accelerator"] = "nvidia.com/gpu"      # with the default backend cpu
        _create(cluster, namespace, body)
    finally:
        cluster.install_crds()
    api.patch_namespaced_custom_object(*where, "tiny", {"metadata": {"finalizers": ["resident.dev/cleanup"]}})
    api.patch_namespaced_custom_object_status(*where, "tiny", {"status": {"phase": "Degraded"}})
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_custom_object(*where, "tiny", {"spec": {"replicas": 2}})
    assert "spec.runtime.backend: Invalid value" in err.value.body
    api.patch_namespaced_custom_object(*where, "tiny", {"spec": {"runtime": {"backend": "torch"}}})
    api.patch_namespaced_custom_object(*where, "tiny", {"metadata": {"finalizers": None}})
