"""Pod Security Admission, judged by the real API server: owner Pods and the operator are
admitted where ``restricted`` is enforced; the bridge needs ``privileged``.

Admission happens when a Pod is created, so no kubelet is needed: the owner Pods are
really created (they stay Pending, there is no node); the chart's Pod templates are
created with a server-side dry run in the release's own namespace (their ServiceAccounts
live there) while its enforce label is switched.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from resident_operator.placement import build_owner_pod
from resident_operator.pod_template import stamp
from resident_operator.settings import OperatorSettings
from resident_operator.spec import parse_spec

from polling import wait_for

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from charts.helmenv import Helm  # noqa: E402

ENFORCE = "pod-security.kubernetes.io/enforce"
DIGEST = "sha256:" + "ab" * 32
SOURCE = "file:///srv/bundles/tiny"
SETTINGS = OperatorSettings(owner_image="resident:dev")


def _enforce(cluster, namespace: str, level: str) -> None:
    """Label the namespace, and wait until admission enforces the new level: it reads
    namespaces from an informer, which may still hold the old labels for a moment."""
    core = client.CoreV1Api(cluster.api_client())
    core.patch_namespace(namespace, {"metadata": {"labels": {ENFORCE: level}}})
    probe = client.V1Pod(metadata=client.V1ObjectMeta(name="level-probe"), spec=client.V1PodSpec(
        host_network=True, containers=[client.V1Container(name="c", image="x")]))

    def enforced() -> bool:
        try:
            core.create_namespaced_pod(namespace, probe, dry_run="All")
            return level == "privileged"
        except ApiException as e:
            return e.status == 403 and f'\\"{level}:latest\\"' in e.body
    wait_for(enforced, timeout=30, what=f"admission enforcing {level} in {namespace}", every=0.2)


def _owner_pod(settings: OperatorSettings, slot: int = 0) -> dict:
    spec = parse_spec({"bundle": {"source": SOURCE, "digest": DIGEST},
                       "serving": {"apiKeySecret": "keys"}})
    return stamp(build_owner_pod("tiny", "uid-1", spec, settings, slot, 0, DIGEST, SOURCE),
                 "tiny", spec, settings)


def _refusal(call) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return err.value.body


def test_owner_pods_are_admitted_where_restricted_is_enforced(cluster, namespace):
    _enforce(cluster, namespace, "restricted")
    core = client.CoreV1Api(cluster.api_client())
    created = core.create_namespaced_pod(namespace, _owner_pod(SETTINGS))
    assert created.spec.containers[0].name == "owner" and not created.spec.host_network


@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_owner_pods_on_host_networking_are_not(cluster, namespace, level):
    _enforce(cluster, namespace, level)
    core = client.CoreV1Api(cluster.api_client())
    host = OperatorSettings(owner_image="resident:dev", owner_host_network=True)
    body = _refusal(lambda: core.create_namespaced_pod(namespace, _owner_pod(host)))
    assert f'violates PodSecurity \\"{level}:latest\\": host namespaces (hostNetwork=true)' in body


def test_the_chart_runs_the_operator_restricted_and_the_bridge_privileged(cluster, namespace):
    helm = Helm(cluster.kubeconfig, namespace)
    release = f"ps-{uuid.uuid4().hex[:6]}"
    helm.install(release, {"crds": {"enabled": False}})
    apps = client.AppsV1Api(cluster.api_client())
    core = client.CoreV1Api(cluster.api_client())
    try:
        templates = {
            "operator": apps.list_namespaced_deployment(namespace).items[0].spec.template,
            "bridge": apps.list_namespaced_daemon_set(namespace).items[0].spec.template}

        def dry_run(component: str):
            pod = client.V1Pod(metadata=client.V1ObjectMeta(name=f"{component}-{uuid.uuid4().hex[:6]}"),
                               spec=templates[component].spec)
            return core.create_namespaced_pod(namespace, pod, dry_run="All")

        _enforce(cluster, namespace, "restricted")
        dry_run("operator")
        body = _refusal(lambda: dry_run("bridge"))
        assert 'container \\"bridge\\" must not set securityContext.privileged=true' in body, body
        assert 'use restricted volume type \\"hostPath\\"' in body, body
        _enforce(cluster, namespace, "baseline")
        body = _refusal(lambda: dry_run("bridge"))
        assert 'container \\"bridge\\" must not set securityContext.privileged=true' in body, body
        assert "hostPath volumes" in body, body
        _enforce(cluster, namespace, "privileged")
        dry_run("bridge")
    finally:
        helm.uninstall(release)


def test_root_owner_pods_need_baseline(cluster, namespace):
    """A vendor image that must run as root (operator.owner.runAsNonRoot=false)."""
    core = client.CoreV1Api(cluster.api_client())
    root = OperatorSettings(owner_image="resident:dev", owner_run_as_non_root=False)
    _enforce(cluster, namespace, "restricted")
    assert "runAsNonRoot" in _refusal(lambda: core.create_namespaced_pod(namespace, _owner_pod(root)))
    _enforce(cluster, namespace, "baseline")
    core.create_namespaced_pod(namespace, _owner_pod(root))
