"""One card each, on a real extended resource: the local node's test-card device plugin
(:mod:`localcluster.test_cards`) advertises two ``furiosa.ai/rngd`` cards through kubelet's
device-plugin API, and a 3-replica rngd model asks for three.

The real scheduler binds two owners and leaves the third Pending with "Insufficient
furiosa.ai/rngd", which the model's Delivered condition repeats; kubelet's device manager
gives each bound owner one test card of its own. The owner image has no ``furiosa_llm``,
so the two owners that are placed exit at start with a ``BackendUnavailable`` termination
message and kubelet backs them off: the model is Degraded with reason BackendUnavailable,
not Loading. Deleting the model removes all.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from localcluster.scenario import condition, model_body
from localcluster.test_cards import device_ids
from polling import wait_for

CARD = "furiosa.ai/rngd"
INSUFFICIENT = f"Insufficient {CARD}"


@pytest.fixture
def two_cards(world):
    """The node as its device plugin advertises it: two test cards."""
    core = client.CoreV1Api(world.cluster.api_client())
    node = world.cluster.node_name
    wait_for(lambda: (core.read_node(node).status.allocatable or {}).get(CARD) == "2", timeout=60,
             what=f"{node} advertising two {CARD} cards")
    return core, node


def cards_given(cluster, node: str) -> dict[str, list[str]]:
    """Pod UID -> the test cards kubelet's device manager gave it (its checkpoint on the node)."""
    checkpoint = cluster.kubelet_dir(node) / "device-plugins" / "kubelet_internal_checkpoint"
    entries = json.loads(checkpoint.read_text())["Data"]["PodDeviceEntries"] or []
    given: dict[str, list[str]] = {}
    for e in entries:
        if e["ResourceName"] == CARD:
            given.setdefault(e["PodUID"], []).extend(d for ids in e["DeviceIDs"].values() for d in ids)
    return given


def unschedulable(pod) -> str:
    cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
    return cond.message if cond and cond.status == "False" and cond.reason == "Unschedulable" else ""


def test_three_owners_on_two_cards_two_bind_one_waits_and_a_missing_sdk_degrades(world, two_cards):
    core, node = two_cards
    assert core.read_node(node).status.allocatable[CARD] == "2"
    story = world.story("e2e-cards", "cards")
    body = model_body(story.name, world.server.url, world.revs.a, port=18180)
    body["spec"].update(accelerator=CARD, replicas=3, serving={"port": 18190})
    body["spec"]["runtime"]["backend"] = "rngd"
    story.apply(body)

    # the scheduler: two owners bound to the node, one card each; the third Pending
    def placed():
        pods = story.owner_pods()
        bound = [p for p in pods if p.spec.node_name == node]
        waiting = [p for p in pods if INSUFFICIENT in unschedulable(p)]
        return (bound, waiting) if len(pods) == 3 and len(bound) == 2 and len(waiting) == 1 else None
    bound, (waiting,) = wait_for(placed, timeout=180, what="2 owners bound and 1 unschedulable", every=1)
    for p in bound:
        limits = p.spec.containers[0].resources.limits
        assert limits[CARD] == "1" and p.spec.containers[0].resources.requests[CARD] == "1"
    # kubelet's device manager gave each bound owner one card of its own, from the plugin's two
    given = wait_for(lambda: (lambda g: g if all(p.metadata.uid in g for p in bound) else None)(
        cards_given(world.cluster, node)), timeout=60, what="kubelet's card allocations")
    cards = [given[p.metadata.uid] for p in bound]
    assert all(len(c) == 1 for c in cards) and sorted(c[0] for c in cards) == device_ids(node, 2)
    assert waiting.status.phase == "Pending" and not waiting.spec.node_name

    # the model: Delivered names the scheduler's message; Degraded names the missing SDK (as
    # soon as one owner exits, so wait until both bound owners' entries name it too)
    def reasons(rm):
        entries = {o["pod"]: o for o in rm.get("status", {}).get("owners") or []}
        return [entries.get(p.metadata.name, {}).get("reason") for p in bound]
    rm = story.wait("Degraded with BackendUnavailable on both bound owners", lambda rm: (
        rm.get("status", {}).get("phase") == "Degraded"
        and condition(rm, "Degraded")["reason"] == "BackendUnavailable"
        and INSUFFICIENT in condition(rm, "Delivered")["message"]
        and reasons(rm) == ["BackendUnavailable"] * 2), timeout=180)
    delivered, degraded = condition(rm, "Delivered"), condition(rm, "Degraded")
    print(f"\nDelivered: {delivered['reason']}: {delivered['message']}\nDegraded: {degraded['reason']}: "
          f"{degraded['message']}")
    assert (delivered["status"], delivered["reason"]) == ("False", "Unschedulable")
    assert waiting.metadata.name in delivered["message"]
    assert degraded["status"] == "True" and "furiosa_llm" in degraded["message"]
    assert rm["status"]["ready"] == "0/3"
    entries = {o["pod"]: o for o in rm["status"]["owners"]}
    assert entries[waiting.metadata.name]["reason"] == "Unschedulable"
    assert INSUFFICIENT in entries[waiting.metadata.name]["message"]

    # kubelet backs the failing owners off; the model still says why, not "Loading"
    def backing_off():
        pods = [p for p in story.owner_pods() if p.spec.node_name == node]
        return [p for p in pods for s in p.status.container_statuses or []
                if s.state.waiting and s.state.waiting.reason == "CrashLoopBackOff"
                and s.last_state.terminated
                and (s.last_state.terminated.message or "").startswith("BackendUnavailable: ")]
    wait_for(backing_off, timeout=180, what="an owner in CrashLoopBackOff", every=1)
    rm = story.get()
    assert rm["status"]["phase"] == "Degraded" and condition(rm, "Degraded")["reason"] == "BackendUnavailable"
    row = world.cluster.kubectl("get", "residentmodels", "-n", story.namespace, "--no-headers").stdout.split()
    assert row[:2] == [story.name, "Degraded"] and row[3] == "0/3"
    warnings = [e.reason for e in core.list_namespaced_event(story.namespace).items
                if e.involved_object.kind == "ResidentModel" and e.type == "Warning"]
    assert "BackendUnavailable" in warnings

    story.delete_and_wait_gone()
    wait_for(lambda: not any(story.leftovers()[k] for k in ("pods", "bundleDeliveries", "services"))
          or None, timeout=90, what="every child gone", every=1)
