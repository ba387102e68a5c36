"""Tenant isolation on a real node (issue #14): a digest copied from another tenant gets
nothing out of the node's store unless the copier's own source serves it.

Tenant A runs a model on a revision of its own (A), so the node store holds A. Tenant B names A's digest
with a source of its own: a working bundle server that holds another revision, not A.
B's ResidentModel declares the digest, so namespace authorization alone would let it
through; what stops it is the bridge's proof of possession (csi_bridge/possession.py).
B tries twice: through the operator (which refuses to place a model whose source lacks
the revision) and around it, with a plain Pod carrying the CSI volume of A's owner Pod,
only the source and model changed. kubelet is told PermissionDenied, nothing is mounted
or leased, and A keeps serving on A the whole time.
"""

from __future__ import annotations

import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.kubelet import ROOT_DIR
from localcluster.scenario import BundleServer, Story, condition, model_body, node_state

from machine_state import mounts_below
from polling import wait_for

TENANT_A, TENANT_B = "e2e-tenant-a", "e2e-tenant-b"
WATCH_SECONDS = 15.0  # kubelet retries a failed mount after 0.5, 1, 2, 4, 8 s: several refusals


def tenant(cluster, installation, namespace: str, model: str) -> Story:
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_service_account(namespace)
    return Story(cluster, namespace, model, installation.bridge_root)


def copied_volume_pod(story: Story, owner: client.V1Pod, source: str) -> dict:
    """A Pod of ``story``'s tenant, made without the operator: the CSI volume of another
    tenant's ``owner`` Pod, with ``source`` and the story's model in its attributes. Its
    container lists the bundle, which it could read if the volume were mounted."""
    volume = next(v for v in owner.spec.volumes if v.csi is not None)
    csi = story.core.api_client.sanitize_for_serialization(volume.csi)
    csi["volumeAttributes"] = {**csi["volumeAttributes"], "source": source, "model": story.name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "copied-digest"},
            "spec": {"hostNetwork": True, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "containers": [{"name": "reader", "image": owner.spec.containers[0].image,
                                     "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "ls -R /bundle && exec sleep 3600"],
                                     "volumeMounts": [{"name": "bundle", "mountPath": "/bundle",
                                                       "readOnly": True}]}],
                     "volumes": [{"name": "bundle", "csi": csi}]}}


def test_a_copied_digest_with_a_bogus_source_is_refused_and_mounts_nothing(world, tmp_path):
    cluster, installation, server = world.cluster, world.installation, world.server
    revision_a = world.fresh_revision("a", "rows", seed=51)     # held by tenant A alone
    with BundleServer(tmp_path / "elsewhere", tmp_path / "logs-elsewhere", cluster=cluster) as elsewhere:
        elsewhere.push(world.dirs["b"])          # B's source serves bundles, only not A
        a = tenant(cluster, installation, TENANT_A, "model")
        a.apply(model_body(a.name, server.url, revision_a))
        a.wait_ready(revision_a)
        owner = a.owner_pods()[0]
        ready_since = condition(a.get(), "Ready")["lastTransitionTime"]
        leases = node_state(installation.bridge_root)["leases"]
        holders = [h for h, d in leases if d == revision_a]   # the store holds A, leased by A's volume
        assert len(holders) == 1 and holders[0].startswith("volume:"), holders

        def a_serves_on_a() -> None:
            rm = a.get()
            assert rm["status"]["phase"] == "Ready" and rm["status"]["identity"]["bundle"] == revision_a
            assert condition(rm, "Ready")["lastTransitionTime"] == ready_since, rm["status"]["conditions"]
            assert [p.metadata.uid for p in a.owner_pods()] == [owner.metadata.uid]
            _, answer = a.complete("Resident keeps", max_tokens=4)
            assert answer["system_fingerprint"] == revision_a

        def b_never_ready(rm: dict) -> None:
            assert rm["status"].get("phase") != "Ready" and condition(rm, "Ready").get("status") != "True"
            assert not rm["status"].get("owners") and b.owner_pods() == []

        # 1. through the operator: the first-placement source check refuses, no owner Pod
        b = tenant(cluster, installation, TENANT_B, "copied")
        b.apply(model_body(b.name, elsewhere.url, revision_a))
        rm = b.wait("Degraded for its source", lambda rm: condition(rm, "Degraded").get("status") == "True",
                    timeout=60)
        degraded = condition(rm, "Degraded")
        assert degraded["reason"] == "SourceUnavailable", degraded
        assert elsewhere.url in degraded["message"] and "HTTP 404" in degraded["message"], degraded
        b_never_ready(rm)
        a_serves_on_a()

        # 2. around the operator: A's volume, B's source, in a Pod of B's own
        b.core.create_namespaced_pod(TENANT_B, copied_volume_pod(b, owner, elsewhere.url))
        refused = wait_for(lambda: [e for e in b.failed_mounts("copied-digest") if "PermissionDenied" in e.message],
                           timeout=60, what="kubelet's FailedMount with PermissionDenied", every=0.5)
        message = refused[0].message
        assert f"namespace {TENANT_B!r} may not mount {revision_a}" in message, message
        assert f"source {elsewhere.url} did not serve the manifest of {revision_a}" in message, message
        assert "HTTP 404" in message, message
        pod = b.core.read_namespaced_pod("copied-digest", TENANT_B)
        pod_dir = str(ROOT_DIR / "pods" / pod.metadata.uid)
        watch_until = time.monotonic() + WATCH_SECONDS
        while time.monotonic() < watch_until:    # kubelet retries; every retry is refused
            pod = b.core.read_namespaced_pod("copied-digest", TENANT_B)
            assert pod.status.phase == "Pending", pod.status
            assert not any(s.state.running or s.state.terminated for s in pod.status.container_statuses or [])
            assert mounts_below(pod_dir) == []
            state = node_state(installation.bridge_root)
            assert state["leases"] == leases     # B took no lease on A
            assert not [t for t, _ in state["publications"] if pod.metadata.uid in t]
            b_never_ready(b.get())
            a_serves_on_a()
            time.sleep(1)
        counts = [e.count for e in b.failed_mounts("copied-digest") if "PermissionDenied" in e.message]
        assert sum(counts) >= 2, counts          # refused again on retry, not only the first time

        # 3. cleanup: B's Pod and model, A's model, both namespaces, nothing left on the node
        b.core.delete_namespaced_pod("copied-digest", TENANT_B, grace_period_seconds=0)
        b.delete_and_wait_gone()
        a_serves_on_a()
        a.delete_and_wait_gone()
        wait_for(lambda: not any(a.leftovers().values()), timeout=60, what="nothing of A left", every=1)
        for namespace in (TENANT_A, TENANT_B):
            a.core.delete_namespace(namespace)
        wait_for(lambda: not any(_exists(a.core, n) for n in (TENANT_A, TENANT_B)), timeout=120,
                 what="both namespaces gone", every=1)


def _exists(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
