"""Applications calling a model through its Service on a real node, during switches.

Every switch here goes to a fresh revision derived from A, so the node's store holds none
of the demo's B, C, D afterwards (test_story.py expects to deliver those for the first time).

The local node runs no kube-proxy and no cluster DNS, so requests go where kube-proxy
would send them: to the ready addresses of the Service's Endpoints, which the real
endpoints controller derives from the owner Pods' readiness (kubelet's probes).
"""

from __future__ import annotations

import time

import openai

from localcluster.traffic import ClosedLoop, EndpointsFollower
from polling import wait_for


def test_openai_client_completes_through_the_service_and_endpoints_follow_readiness(world):
    story = world.ready("e2e-serve", world.revs.a, replicas=2)
    rm = story.get()
    assert rm["status"]["endpoint"] == "http://story.e2e-serve.svc:8000"
    with EndpointsFollower(story.core, story.namespace, "story") as endpoints:
        # host networking: slot k listens on 8000+k, and both are in the Endpoints
        addresses = wait_for(lambda: len(endpoints.addresses) == 2 and endpoints.addresses, timeout=120, what="two ready endpoints", every=0.1)
        assert sorted(a.rsplit(":", 1)[1] for a in addresses) == ["8000", "8001"]
        for address in addresses:
            api = openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0)
            done = api.completions.create(model="story", prompt="Resident keeps", max_tokens=5)
            assert done.system_fingerprint == world.revs.a and done.choices[0].text
            assert [m.id for m in api.models.list().data] == ["story"]
        # an owner that goes away leaves the Endpoints
        pod = story.core.list_namespaced_pod(story.namespace, label_selector="resident.dev/slot=1").items[0]
        story.core.delete_namespaced_pod(pod.metadata.name, story.namespace)
        wait_for(lambda: all(not a.endswith(":8001") for a in endpoints.addresses), timeout=30, what="the deleted owner out of the Endpoints", every=0.1)
    story.delete_and_wait_gone()
    assert story.core.list_namespaced_service(story.namespace).items == []


def test_in_place_switch_under_load_fails_no_request_and_revision_follows_status(world):
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=61)
    story = world.ready("e2e-serve-in-place", old)
    with EndpointsFollower(story.core, story.namespace, "story") as endpoints, \
            ClosedLoop(endpoints.pick, "story", clients=4) as load:
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
    with EndpointsFollower(story.core, story.namespace, "story") as endpoints:
        wait_for(lambda: len(endpoints.addresses) == 2, timeout=120, what="two ready endpoints", every=0.1)
        with ClosedLoop(endpoints.pick, "story", clients=4) as load:
            seen = []
            story.patch_spec({"bundle": {"source": world.server.url, "digest": new},
                              "delivery": {"mode": "WholeBundle"}, "transition": {"strategy": "Reload"}})
            deadline = time.monotonic() + 240
            while (story.get()["status"].get("identity") or {}).get("bundle") != new \
                    or story.get()["status"].get("ready") != "2/2":
                assert time.monotonic() < deadline, "the reload of two owners did not finish"
                seen.append(len(endpoints.addresses))
                time.sleep(0.1)
            time.sleep(0.5)
    assert min(seen) == 1, "an owner should leave the Endpoints while it reloads, one at a time"
    answers = load.between(0, time.monotonic())
    assert [a for a in answers if not a.ok] == []
    assert {a.revision for a in answers} == {old, new}
    story.delete_and_wait_gone()


def test_reload_of_one_replica_answers_503_with_retry_after_never_a_reset(world):
    old, new = world.revs.a, world.fresh_revision("a", "rows", seed=63)
    story = world.ready("e2e-serve-solo", old)
    target = "127.0.0.1:8000"         # the one owner (slot 0, host network)
    with ClosedLoop(lambda: target, "story", clients=4) as load:
        wait_for(lambda: len(load.between(0, time.monotonic())) > 20, timeout=120, what="answers on A", every=0.1)
        story.transition({"bundle": {"source": world.server.url, "digest": new},
                          "transition": {"strategy": "Reload"}})
        time.sleep(0.5)
    answers = load.between(0, time.monotonic())
    assert {a.status for a in answers} <= {200, 503}, sorted({(a.status, a.error) for a in answers})
    assert all(a.retry_after for a in answers if a.status == 503)
    assert {a.revision for a in answers if a.ok} == {old, new}
    story.delete_and_wait_gone()
