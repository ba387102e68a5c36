"""The whole chain on a real node: API server -> operator -> owner Pod -> kubelet -> CSI bridge ->
owner runtime -> transition -> cleanup, with Resident installed by its Helm chart.

Each step is asserted from the API (ResidentModel status, Pods, BundleDeliveries) and from
the node (CSI mounts in /proc/self/mountinfo, the bridge's leases and publications in its
SQLite databases, revision trees in the volume). The tests run in order on one cluster.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kubernetes import client

from bundle.scan import read_manifest
from localcluster.scenario import Story, model_body, node_state, whole_bundle_reload
from polling import wait_for

SIZE = 16 * 2**20   # the demo bundles' size (conftest.py)


def _owner_pod(story: Story) -> client.V1Pod:
    pods = story.owner_pods()
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def test_model_is_served_transitions_and_is_cleaned_up(world):
    cluster, server, revs, _, dirs = world
    story = world.story("e2e-story")
    story.apply(model_body(story.name, server.url, revs.a))
    rm = story.wait_ready(revs.a)
    assert rm["status"]["ready"] == "1/1"
    conditions = {c["type"]: c["status"] for c in rm["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["Delivered"] == "True"

    # the node: one read-only CSI mount for the owner Pod, a lease on A, a publication
    pod = _owner_pod(story)
    state = node_state(story.bridge_root)
    mine = [m for m in state["csiMounts"] if pod.metadata.uid in m]
    assert len(mine) == 1
    options = next(l.split()[5] for l in Path("/proc/self/mountinfo").read_text().splitlines()
                   if l.split()[4] == mine[0])
    assert options.split(",")[0] == "ro"
    assert [revs.a] == [d for h, d in state["leases"] if h.startswith("volume:")]
    volume = Path(mine[0])  # what the owner container sees, through kubelet's target path
    assert os.readlink(volume / "current") == f"revisions/{revs.a.replace(':', '-')}"

    answer = story.generate("hello", max_tokens=6)
    assert answer["identity"]["bundle"] == revs.a and len(answer["tokens"]) == 6

    # graph-only: only the graph file moves
    last = story.transition({"bundle": {"source": server.url, "digest": revs.b}})
    assert (last["path"], last["method"], last["result"]) == ("GraphOnly", "graph-only", "succeeded")
    _assert_steps_follow_at_once(last)
    size_b = read_manifest(dirs["b"]).total_bytes
    assert last["bytes"]["fetched"] < 64 * 1024
    assert last["bytes"]["fetched"] + last["bytes"]["reused"] == size_b
    assert (volume / "revisions" / revs.b.replace(":", "-")).is_dir()

    # rows: a whole-bundle rebase on B, applied in place
    last = story.transition({"bundle": {"source": server.url, "digest": revs.c}})
    assert (last["path"], last["method"], last["strategy"], last["result"]) == (
        "WholeBundle", "rebase", "InPlace", "succeeded")
    assert 0 < last["bytes"]["fetched"] < 0.5 * SIZE
    _assert_steps_follow_at_once(last)
    pod_after = _owner_pod(story)
    assert pod_after.metadata.uid == pod.metadata.uid  # in place: the same Pod, no restart
    assert story.generate("hello", max_tokens=6)["identity"]["bundle"] == revs.c

    # whole bundle with a reload, rebased on C
    last = story.transition(whole_bundle_reload(server.url, revs.d))
    assert (last["path"], last["method"], last["strategy"], last["result"]) == (
        "WholeBundle", "rebase", "Reload", "succeeded")
    _assert_steps_follow_at_once(last)
    assert story.generate("hello", max_tokens=6)["identity"]["bundle"] == revs.d
    # the volume's lease pins what it was published with until unpublish; of the delivered
    # revisions the live one and the one left for a rollback stay leased (keepPrevious: C;
    # B's delivery was deleted at the switch to D)
    leases = sorted((h.split(":")[0], d) for h, d in node_state(story.bridge_root)["leases"])
    assert leases == sorted([("delivery", revs.c), ("delivery", revs.d), ("volume", revs.a)])

    events = cluster.kubectl("describe", "rm", story.name, "-n", story.namespace).stdout
    for reason in ("TransitionPlanned", "DeliveryStaged", "OwnerTransitionApplied", "TransitionSucceeded"):
        assert reason in events

    story.delete_and_wait_gone()
    _assert_nothing_left(story)


def _assert_steps_follow_at_once(last: dict) -> None:
    """What the operator adds to a transition beyond the bridge's staging and the owner's
    own work: planning, watch latency, API writes. A 1 s tick used to make it ~2.5 s; the
    bound is loose on purpose (experiments/09 holds the real figure): 1.0 failed once at
    1.17 s on this 2-core machine with the suite's other work running, 2.0 still tells an
    event-driven operator from a ticking one."""
    d = last["durations"]
    assert d["stagingSeconds"] > 0 and d["ownerSeconds"] > 0, d
    assert d["overheadSeconds"] <= 2.0, d


def test_status_follows_an_owner_pod_deletion_and_reads_0_of_0_at_zero_replicas(world):
    cluster, server, revs, _, _ = world
    story = world.ready("e2e-status", revs.a)
    pod = _owner_pod(story)
    t0 = time.monotonic()
    story.core.delete_namespaced_pod(pod.metadata.name, story.namespace)
    deadline = t0 + 10
    while story.get()["status"].get("ready") != "0/1":
        assert time.monotonic() < deadline, "status still says the deleted owner is ready"
        time.sleep(0.05)
    lag = time.monotonic() - t0
    assert lag <= 3.0, f"status followed the owner Pod's deletion after {lag:.2f}s"
    story.wait_ready(revs.a)                      # a new owner takes the slot
    # the deleted one may still drain its last requests (up to 10 s) beside it; then it is gone
    wait_for(lambda: len(story.owner_pods()) == 1, timeout=60, every=0.5, what="the deleted owner gone")
    assert _owner_pod(story).metadata.uid != pod.metadata.uid
    story.patch_spec({"replicas": 0})
    rm = story.wait("ready 0/0 with no owner", lambda rm: rm.get("status", {}).get("ready") == "0/0"
                    and not story.core.list_namespaced_pod(
                        story.namespace, label_selector=f"resident.dev/model={story.name}").items, timeout=120)
    assert rm["status"]["ready"] == "0/0"
    story.delete_and_wait_gone()
    _assert_nothing_left(story)


def _assert_nothing_left(story: Story, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = story.leftovers()
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert left == {"pods": [], "bundleDeliveries": [], "services": [], "leases": [], "publications": [],
                    "csiMounts": []}


def _wait_transition_started(story: Story, timeout: float = 60.0) -> None:
    story.wait("transitioning", lambda rm: bool(rm.get("status", {}).get("transition")), timeout)


def test_operator_restarted_mid_transition_resumes_without_duplicates(world, slow_url):
    cluster, server, revs, installation, _ = world
    story = world.ready("e2e-restart", revs.b)
    owner_uid = _owner_pod(story).metadata.uid
    fresh = world.fresh_revision("b", "rows", seed=41)
    story.patch_spec({"bundle": {"source": slow_url, "digest": fresh}})
    _wait_transition_started(story)
    operators = story.core.list_namespaced_pod(installation.namespace,
                                               label_selector="app.kubernetes.io/component=operator").items
    assert len(operators) == 1
    story.core.delete_namespaced_pod(operators[0].metadata.name, installation.namespace, grace_period_seconds=0)
    last = story.transition({"bundle": {"source": slow_url, "digest": fresh}}, timeout=300)
    assert last["result"] == "succeeded"
    assert _owner_pod(story).metadata.uid == owner_uid
    deliveries = story.custom.list_namespaced_custom_object("resident.dev", "v1alpha1", story.namespace,
                                                            "bundledeliveries")["items"]
    # one delivery of the target; B, the revision left, may be staged beside it already
    assert [d["spec"]["bundle"]["digest"] for d in deliveries if d["spec"].get("activate") is not False] == [fresh]
    assert {d["spec"]["bundle"]["digest"] for d in deliveries if d["spec"].get("activate") is False} <= {revs.b}
    story.delete_and_wait_gone()
    _assert_nothing_left(story)


def test_model_deleted_while_transitioning_is_cleaned_up(world, slow_url):
    cluster, server, revs, _, _ = world
    story = world.ready("e2e-delete", revs.c)
    story.patch_spec(whole_bundle_reload(slow_url, world.fresh_revision("c", "rows", seed=42)))
    _wait_transition_started(story)
    story.delete_and_wait_gone()
    _assert_nothing_left(story)


def _owner_pids() -> list[int]:
    """PIDs of owner runtimes on this node (processes of containers are host processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"owner" in argv and b"--bundle-dir" in argv:
                pids.append(int(entry.name))
    return pids


def _settled(rm: dict) -> bool:
    status = rm.get("status", {})
    return not status.get("transition") and status.get("phase") in ("Ready", "Degraded")


def test_owner_killed_mid_in_place_transition_ends_on_one_identity(world, slow_url):
    cluster, server, revs, _, _ = world
    story = world.ready("e2e-owner-kill", revs.b)
    fresh = world.fresh_revision("b", "rows", seed=43)
    story.patch_spec({"bundle": {"source": slow_url, "digest": fresh}})
    _wait_transition_started(story)
    pids = _owner_pids()
    assert len(pids) == 1
    os.kill(pids[0], 9)
    # kubelet restarts the container; the operator retries, replaces or reports Degraded
    rm = story.wait("settled after the owner was killed", _settled, timeout=300)
    status = rm["status"]
    assert status["identity"]["bundle"] in (revs.b, fresh)
    if status["phase"] == "Ready":
        served = story.generate("hello", max_tokens=4)["identity"]
        assert served["bundle"] == status["identity"]["bundle"]  # never a mix
    story.delete_and_wait_gone()
    _assert_nothing_left(story)


def test_bridge_pod_deleted_mid_stage_keeps_leases_and_mounts(world):
    cluster, server, revs, installation, _ = world
    story = world.ready("e2e-bridge-kill", revs.c)
    story.patch_spec(whole_bundle_reload(server.url, revs.d))
    wait_for(lambda: story.custom.list_namespaced_custom_object(
        "resident.dev", "v1alpha1", story.namespace, "bundledeliveries")["items"], what="a BundleDelivery exists", every=0.1)
    bridges = story.core.list_namespaced_pod(installation.namespace,
                                             label_selector="app.kubernetes.io/component=bridge").items
    assert len(bridges) == 1
    story.core.delete_namespaced_pod(bridges[0].metadata.name, installation.namespace, grace_period_seconds=0)
    last = story.transition(whole_bundle_reload(server.url, revs.d))
    assert last["result"] == "succeeded"
    # the DaemonSet brought the bridge back; the owner's mount and leases survived it
    pod = _owner_pod(story)
    state = node_state(story.bridge_root)
    assert len([m for m in state["csiMounts"] if pod.metadata.uid in m]) == 1

    def leases():
        return {(h.split(":")[0], digest) for h, digest in node_state(story.bridge_root)["leases"]}
    # the volume's lease (on C, the revision it was published with) and the switch's
    # delivery lease on D survived; the only other lease there may be is a delivery of C,
    # kept staged for a rollback (keepPrevious, the default) by a pass after the switch
    survived = {("volume", revs.c), ("delivery", revs.d)}
    try:
        wait_for(lambda: survived <= leases() <= survived | {("delivery", revs.c)}, timeout=30,
                 what="the volume's and D's delivery lease, and C's kept one at most")
    except AssertionError:
        deliveries = story.custom.list_namespaced_custom_object(
            "resident.dev", "v1alpha1", story.namespace, "bundledeliveries")["items"]
        raise AssertionError(f"leases {node_state(story.bridge_root)['leases']} are not those; "
                             f"BundleDeliveries {[d['metadata']['name'] for d in deliveries]}")
    assert story.generate("hello", max_tokens=4)["identity"]["bundle"] == revs.d
    story.delete_and_wait_gone()
    _assert_nothing_left(story)


def test_bridge_pod_deleted_mid_publish_the_owner_still_starts(world):
    cluster, server, revs, installation, _ = world
    story = world.story("e2e-bridge-publish")
    story.apply(model_body(story.name, server.url, revs.a))
    wait_for(lambda: story.core.list_namespaced_pod(
        story.namespace, label_selector=f"resident.dev/model={story.name}").items, what="an owner Pod exists", every=0.1)
    bridges = story.core.list_namespaced_pod(installation.namespace,
                                             label_selector="app.kubernetes.io/component=bridge").items
    story.core.delete_namespaced_pod(bridges[0].metadata.name, installation.namespace, grace_period_seconds=0)
    story.wait_ready(revs.a)  # kubelet retried NodePublishVolume against the new bridge Pod
    pod = _owner_pod(story)
    state = node_state(story.bridge_root)
    assert len([m for m in state["csiMounts"] if pod.metadata.uid in m]) == 1
    assert [d for h, d in state["leases"] if h.startswith("volume:")] == [revs.a]
    story.delete_and_wait_gone()
    _assert_nothing_left(story)
