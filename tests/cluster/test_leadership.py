"""Leader election against the real API server: who may take a Lease held by a process
that has not renewed it (operator/resident_operator/leadership.py)."""

from __future__ import annotations

import pytest

from resident_operator.leadership import Leadership, default_identity, same_pod

pytestmark = pytest.mark.cluster


def elect(cluster, namespace, identity, **kw) -> Leadership:
    return Leadership(cluster.api_client(), namespace, "resident-operator", identity=identity, **kw)


def test_a_restarted_container_takes_its_pods_lease_at_once_and_no_one_else_does(cluster, namespace):
    killed = elect(cluster, namespace, "operator-abc@0b7e-uid-1_1111aaaa")
    assert killed.try_hold()           # then it dies without releasing
    # another replica (another Pod) and a process outside any Pod wait for the lease to expire
    standby = elect(cluster, namespace, "operator-xyz@5c2d-uid-2_2222bbbb")
    host = elect(cluster, namespace, "workstation_3333cccc")
    assert not standby.try_hold() and not host.try_hold()
    # the same Pod's next run (its container restarted by kubelet) takes it now
    restarted = elect(cluster, namespace, "operator-abc@0b7e-uid-1_4444dddd")
    assert restarted.try_hold()
    assert not standby.try_hold()   # the new holder renews: still alive to the others
    lease = restarted.api.read_namespaced_lease("resident-operator", namespace)
    assert lease.spec.holder_identity == "operator-abc@0b7e-uid-1_4444dddd"
    assert lease.spec.lease_transitions == 1


def test_two_processes_on_one_host_outside_a_pod_are_never_the_same_pod(monkeypatch):
    monkeypatch.delenv("POD_UID", raising=False)
    a, b = default_identity(), default_identity()
    assert a != b and not same_pod(a, b)
    monkeypatch.setenv("POD_UID", "0b7e-uid-1")
    c, d = default_identity(), default_identity()
    assert "@0b7e-uid-1_" in c and same_pod(c, d) and not same_pod(a, c)
