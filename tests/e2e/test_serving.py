"""Applications calling a model through its Service on a real node, during switches.

Every switch here goes to a fresh revision derived from A, so the node's store holds none
of the demo's B, C, D afterwards (test_story.py expects to deliver those for the first time).

Requests go to the Service's ClusterIP, through the node's kube-proxy, which follows the
EndpointSlices that the real controller derives from the owner Pods' readiness (kubelet's
probes).
"""

from __future__ import annotations

import json
import time

import openai

from localcluster.scenario import pod_log
from localcluster.traffic import ClosedLoop
from polling import wait_for


def ready_endpoints(story) -> list[str]:
    """``ip:port`` of the ready endpoints in the model's Service's EndpointSlices (port ``http``)."""
    from kubernetes import client

    slices = client.DiscoveryV1Api(story.cluster.api_client()).list_namespaced_endpoint_slice(
        story.namespace, label_selector=f"kubernetes.io/service-name={story.name}").items
    return sorted(f"{address}:{port.port}" for s in slices for e in (s.endpoints or [])
                  if e.conditions.ready for address in e.addresses
                  for port in (s.ports or []) if port.name == "http")


def call_from_a_pod(story, url: str) -> dict:
    """GET ``url`` from a Pod in the model's namespace (the project image's Python, as an
    application would); returns the JSON answer."""
    from kubernetes import client

    name = f"caller-{int(time.time() * 1000) % 100000}"
    image = story.owner_pods()[0].spec.containers[0].image
    story.core.create_namespaced_pod(story.namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="main", image=image, image_pull_policy="Never", command=[
                "python3", "-c", f"import urllib.request; print(urllib.request.urlopen('{url}', timeout=20).read().decode())"])])))
    done = wait_for(lambda: story.core.read_namespaced_pod(name, story.namespace).status.phase in ("Succeeded", "Failed")
                    and story.core.read_namespaced_pod(name, story.namespace), timeout=90, what=f"{name} finished")
    logs = pod_log(story.core, name, story.namespace)
    story.core.delete_namespaced_pod(name, story.namespace, grace_period_seconds=0)
    assert done.status.phase == "Succeeded", logs
    return json.loads(logs)


def test_openai_client_completes_through_the_service_and_endpoints_follow_readiness(world):
    story = world.ready("e2e-serve", world.revs.a, replicas=2)
    rm = story.get()
    assert rm["status"]["endpoint"] == "http://story.e2e-serve.svc:8000"
    # every owner on the Pod network serves on the one port, at its own address
    endpoints = wait_for(lambda: len(ready_endpoints(story)) == 2 and ready_endpoints(story), timeout=120,
                         what="two ready endpoints", every=0.1)
    assert {a.rsplit(":", 1)[1] for a in endpoints} == {"8000"}
    api = openai.OpenAI(base_url=f"http://{story.service_address()}/v1", api_key="unused", max_retries=0)
    for _ in range(4):
        done = api.completions.create(model="story", prompt="Resident keeps", max_tokens=5)
        assert done.system_fingerprint == world.revs.a and done.choices[0].text
    assert [m.id for m in api.models.list().data] == ["story"]
    # a Pod in the model's namespace calls status.endpoint by its DNS name (cluster DNS)
    assert call_from_a_pod(story, f"{rm['status']['endpoint']}/v1/models")["data"][0]["id"] == "story"
    # an owner that goes away leaves the EndpointSlice
    pod = story.core.list_namespaced_pod(story.namespace, label_selector="resident.dev/slot=1").items[0]
    story.core.delete_namespaced_pod(pod.metadata.name, story.namespace)
    wait_for(lambda: f"{pod.status.pod_ip}:8000" not in ready_endpoints(story), timeout=30,
             what="the deleted owner out of the EndpointSlice", every=0.1)
    story.delete_and_wait_gone()
    assert story.core.list_namespaced_service(story.namespace).items == []


def test_in_place_switch_under_load_fails_no_request_and_revision_follows_status(world):
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=61)
    story = world.ready("e2e-serve-in-place", old)
    with ClosedLoop(story.service_address(), "story", clients=4) as load:
        wait_for(lambda: len(load.between(0, time.monotonic())) > 20, timeout=120, what="answers on the old revision", every=0.1)
        t_patch = time.monotonic()
        story.patch_spec({"bundle": {"source": world.server.url, "digest": new}})
        rm = story.wait_ready(new)
        t_status = time.monotonic()       # status names C (and the transition is done) by now
        assert rm["status"]["lastTransition"]["strategy"] == "InPlace"
        time.sleep(1.0)
    answers = load.between(0, time.monotonic())
    failed = [a for a in answers if not a.ok]
    assert failed == [], failed[:5]
    assert {a.revision for a in answers} == {old, new}
    assert all(a.revision == old for a in answers if a.end < t_patch)
    assert all(a.revision == new for a in answers if a.start > t_status)
    # the owner flipped once: no answer from the old revision started after the first new one ended
    first_new = min(a.end for a in answers if a.revision == new)
    assert all(a.start <= first_new for a in answers if a.revision == old)
    story.delete_and_wait_gone()


def test_reload_of_two_replicas_drains_each_owner_and_fails_no_request(world):
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=62)
    story = world.ready("e2e-serve-reload", old, replicas=2)
    wait_for(lambda: len(ready_endpoints(story)) == 2, timeout=120, what="two ready endpoints", every=0.1)
    with ClosedLoop(story.service_address(), "story", clients=4) as load:
        seen = []
        story.patch_spec({"bundle": {"source": world.server.url, "digest": new},
                          "delivery": {"mode": "WholeBundle"}, "transition": {"strategy": "Reload"}})
        deadline = time.monotonic() + 240
        while (story.get()["status"].get("identity") or {}).get("bundle") != new \
                or story.get()["status"].get("ready") != "2/2":
            assert time.monotonic() < deadline, "the reload of two owners did not finish"
            seen.append(len(ready_endpoints(story)))
            time.sleep(0.1)
        time.sleep(0.5)
    assert min(seen) == 1, "an owner should leave the EndpointSlice while it reloads, one at a time"
    answers = load.between(0, time.monotonic())
    failed = sorted({(a.status, a.error) for a in answers if not a.ok})
    assert failed == [], (failed, story.probe_failures())
    assert {a.revision for a in answers} == {old, new}
    story.delete_and_wait_gone()


def test_reload_of_one_replica_answers_503_with_retry_after_never_a_reset(world):
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=63)
    story = world.ready("e2e-serve-solo", old)
    with ClosedLoop(story.service_address(), "story", clients=4) as load:
        wait_for(lambda: len(load.between(0, time.monotonic())) > 20, timeout=120, what="answers on A", every=0.1)
        story.transition({"bundle": {"source": world.server.url, "digest": new},
                          "transition": {"strategy": "Reload"}})
        time.sleep(0.5)
    answers = load.between(0, time.monotonic())
    assert {a.status for a in answers} <= {200, 503}, (sorted({(a.status, a.error) for a in answers}),
                                                       story.probe_failures())
    assert all(a.retry_after for a in answers if a.status == 503)
    assert {a.revision for a in answers if a.ok} == {old, new}
    story.delete_and_wait_gone()


def test_owners_on_host_networking_still_serve_through_the_service(world):
    """The chart's host-networking option, for clusters that want it: owners in the node's
    network namespace, replica k on port 8000+k, behind the same Service and ClusterIP."""
    from localcluster.install import local_values

    inst, cluster = world.installation, world.cluster

    def upgrade(owner: dict) -> None:
        values = local_values(inst.image, inst.bridge_root)
        values["operator"] = {"owner": owner}
        inst.helm.upgrade(inst.release, values=values)
        for deployment in cluster.kubectl("get", "deployments", "-n", inst.namespace, "-o", "name").stdout.split():
            cluster.kubectl("rollout", "status", deployment, "-n", inst.namespace, "--timeout=180s")

    upgrade({"hostNetwork": True})
    try:
        story = world.ready("e2e-serve-host", world.revs.a, replicas=2)
        pods = story.owner_pods()
        assert all(p.spec.host_network and p.status.pod_ip == cluster.node.address for p in pods)
        endpoints = wait_for(lambda: len(ready_endpoints(story)) == 2 and ready_endpoints(story), timeout=120,
                             what="two ready endpoints", every=0.1)
        assert endpoints == [f"{cluster.node.address}:8000", f"{cluster.node.address}:8001"]
        api = openai.OpenAI(base_url=f"http://{story.service_address()}/v1", api_key="unused", max_retries=0)
        done = api.completions.create(model="story", prompt="Resident keeps", max_tokens=5)
        assert done.system_fingerprint == world.revs.a and done.choices[0].text
        story.delete_and_wait_gone()
    finally:
        upgrade({})
