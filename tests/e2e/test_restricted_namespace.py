"""Owners in a namespace that enforces the ``restricted`` Pod Security Standard, on a real
node: admitted, started by kubelet, Ready; the one-owner model gets no PodDisruptionBudget
(it would bound nothing: ``disruption.py``; the budget itself is in the several-nodes drain).

Owners are restricted-compatible only without host networking (docs/security.md), so
this needs a node with a Pod network.
"""

from __future__ import annotations

import json

from localcluster.scenario import model_body


def test_owners_run_where_restricted_is_enforced(world):
    namespace = "e2e-restricted"
    story = world.story(namespace)
    world.cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    body = model_body(story.name, world.server.url, world.revs.a)
    story.apply(body)
    story.wait_ready(world.revs.a)

    pods = story.owner_pods()
    assert len(pods) == 1 and not pods[0].spec.host_network
    assert pods[0].status.phase == "Running"
    assert all(c.ready for c in pods[0].status.container_statuses)
    budgets = json.loads(world.cluster.kubectl(
        "get", "poddisruptionbudgets.v1.policy", "-n", namespace, "-o", "json").stdout)
    assert budgets["items"] == []
    story.delete_and_wait_gone()
