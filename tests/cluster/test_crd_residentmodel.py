"""The real API server enforces the ResidentModel schema: defaults, validation, columns."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

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
    assert spec["transition"] == {"strategy": "Auto", "maxUnavailable": 1, "timeoutSeconds": 600}
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
    (["spec", "bundle", "source"], "ftp://x/y", 'spec.bundle.source in body should match'),
    (["spec", "accelerator"], "not a resource", "spec.accelerator in body should match"),
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
