"""The cache of owner Pods and BundleDeliveries the passes read (child_cache.py): it answers
only when it can know, follows versions, and the sweep's LIST repairs a missed event."""

from __future__ import annotations

import pytest

from resident_operator import metrics
from resident_operator.child_cache import ChildCache
from resident_operator.kube import Kube

pytestmark = pytest.mark.unit
NS = "team"


def pod(uid: str, version: int, model: str = "lm", **meta) -> dict:
    return {"metadata": {"uid": uid, "name": f"{model}-owner-{uid}", "namespace": NS,
                         "resourceVersion": str(version), "labels": {"resident.dev/model": model},
                         **meta}}


def ready(cache: ChildCache, *objs: dict, version: int = 100) -> ChildCache:
    cache.refresh(NS, "Pod", list(objs), str(version))
    return cache


def names(objs) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_it_cannot_say_before_the_sweep_listed_the_namespace():
    cache = ChildCache()
    cache.observe("Pod", "ADDED", pod("a", 5))
    assert cache.children(NS, "Pod", "lm", []) is None
    ready(cache, pod("a", 5))
    assert names(cache.children(NS, "Pod", "lm", [])) == ["lm-owner-a"]
    assert cache.children("elsewhere", "Pod", "lm", []) is None
    assert cache.children(NS, "BundleDelivery", "lm", []) is None


def test_once_kopfs_indexes_are_whole_it_answers_everywhere():
    cache = ChildCache()
    cache.observe("BundleDelivery", None, pod("d", 5))    # as the index function hands it over
    assert cache.children(NS, "BundleDelivery", "lm", []) is None
    cache.mark_ready()
    assert names(cache.children(NS, "BundleDelivery", "lm", ["d"])) == ["lm-owner-d"]
    assert cache.children("elsewhere", "Pod", "lm", []) == []


def test_children_are_held_without_managed_fields_and_handed_out_as_copies():
    fields = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    listed = pod("a", 5, managedFields=fields)
    cache = ready(ChildCache(), listed)
    cache.mark_ready()
    cache.observe("Pod", "MODIFIED", pod("a", 101, managedFields=fields))
    cache.wrote("BundleDelivery", pod("d", 102, managedFields=fields))
    cache.refresh_events(NS, [{"metadata": {"uid": "e", "resourceVersion": "7", "managedFields": fields},
                               "involvedObject": {"uid": "a"}, "reason": "FailedMount"}])
    held, = cache.children(NS, "Pod", "lm", ["a"])
    assert held["metadata"]["resourceVersion"] == "101" and "managedFields" not in held["metadata"]
    delivery, = cache.children(NS, "BundleDelivery", "lm", ["d"])
    assert "managedFields" not in delivery["metadata"]
    event, = cache.mount_events(NS, "a")
    assert "managedFields" not in event["metadata"] and event["reason"] == "FailedMount"
    assert listed["metadata"]["managedFields"] == fields       # what was handed in is untouched
    held["metadata"]["labels"]["resident.dev/model"] = "changed"
    assert names(cache.children(NS, "Pod", "lm", ["a"])) == ["lm-owner-a"]   # a copy came out


def test_only_the_models_own_children_come_back():
    cache = ready(ChildCache(), pod("a", 5), pod("b", 6, model="other"))
    assert names(cache.children(NS, "Pod", "lm", ["a"])) == ["lm-owner-a"]
    assert names(cache.children(NS, "Pod", "other", [])) == ["other-owner-b"]


def test_a_recorded_child_it_has_not_seen_sends_the_pass_to_the_api_server():
    cache = ready(ChildCache(), pod("a", 5))
    assert cache.children(NS, "Pod", "lm", ["a", "b"]) is None      # b: on its way, or missed
    cache.observe("Pod", "ADDED", pod("b", 101))
    assert names(cache.children(NS, "Pod", "lm", ["a", "b"])) == ["lm-owner-a", "lm-owner-b"]
    cache.observe("Pod", "DELETED", pod("b", 102))
    assert names(cache.children(NS, "Pod", "lm", ["a", "b"])) == ["lm-owner-a"]   # seen gone


def test_an_older_version_never_replaces_a_newer_one():
    cache = ready(ChildCache(), pod("a", 5, annotations={"v": "new"}))
    cache.observe("Pod", "MODIFIED", pod("a", 4, annotations={"v": "old"}))
    assert cache.children(NS, "Pod", "lm", [])[0]["metadata"]["annotations"] == {"v": "new"}
    cache.observe("Pod", "MODIFIED", pod("a", 7, annotations={"v": "newer"}))
    assert cache.children(NS, "Pod", "lm", [])[0]["metadata"]["annotations"] == {"v": "newer"}


def test_a_deleted_child_is_not_brought_back_by_a_late_event_or_an_older_list():
    cache = ready(ChildCache(), pod("a", 5))
    cache.observe("Pod", "DELETED", pod("a", 9))
    cache.observe("Pod", "MODIFIED", pod("a", 8))       # an event from before the delete
    ready(cache, pod("a", 5), version=8)               # a LIST made before it
    assert cache.children(NS, "Pod", "lm", ["a"]) == []


def test_the_sweeps_list_drops_what_a_missed_delete_left_and_keeps_what_came_after_it():
    cache = ready(ChildCache(), pod("ghost", 5), pod("kept", 6), version=10)
    cache.observe("Pod", "ADDED", pod("young", 12))    # created after the next LIST was made
    ready(cache, pod("kept", 6), version=11)            # the ghost's DELETED event was missed
    # the ghost is gone, known so: a pass whose status still records it needs no LIST
    assert names(cache.children(NS, "Pod", "lm", ["ghost"])) == ["lm-owner-kept", "lm-owner-young"]


def test_the_sweeps_list_brings_a_missed_change():
    cache = ready(ChildCache(), pod("a", 5), version=10)
    ready(cache, pod("a", 11, annotations={"ready": "yes"}), version=12)
    assert cache.children(NS, "Pod", "lm", ["a"])[0]["metadata"]["annotations"] == {"ready": "yes"}


def test_it_agrees_with_a_list_of_the_same_objects_at_the_same_versions_only():
    """The sweep LISTs only metadata and reads whole objects where the cache disagrees."""
    meta = lambda o: {"metadata": o["metadata"]}   # noqa: E731 - what a metadata-only LIST holds
    assert not ChildCache().agrees(NS, "Pod", [])                        # it answers for nothing yet
    cache = ready(ChildCache(), pod("a", 5), pod("b", 6, model="other"), version=10)
    assert cache.agrees(NS, "Pod", [meta(pod("a", 5)), meta(pod("b", 6, model="other"))])
    assert not cache.agrees(NS, "Pod", [meta(pod("a", 7)), meta(pod("b", 6, model="other"))])   # a missed change
    assert not cache.agrees(NS, "Pod", [meta(pod("a", 5))])                        # a missed delete
    assert not cache.agrees(NS, "Pod", [meta(pod("a", 5)), meta(pod("b", 6, model="other")),
                                        meta(pod("c", 8))])                        # a missed create
    assert not cache.agrees("elsewhere", "Pod", [])


def test_its_own_writes_show_before_their_events():
    cache = ready(ChildCache())
    cache.wrote("Pod", pod("new", 101))
    assert names(cache.children(NS, "Pod", "lm", ["new"])) == ["lm-owner-new"]
    cache.deleting("new", "2026-12-04T15:00:00Z")
    [marked] = cache.children(NS, "Pod", "lm", ["new"])
    assert marked["metadata"]["deletionTimestamp"] == "2026-12-04T15:00:00Z"
    cache.observe("Pod", "ADDED", pod("new", 101))      # the create's own event, late
    assert cache.children(NS, "Pod", "lm", ["new"])[0]["metadata"]["deletionTimestamp"]
    cache.observe("Pod", "MODIFIED", pod("new", 102, deletionTimestamp="2026-12-04T15:00:01Z"))
    [seen] = cache.children(NS, "Pod", "lm", ["new"])
    assert seen["metadata"]["deletionTimestamp"] == "2026-12-04T15:00:01Z"
    cache.wrote("Secret", pod("s", 103))               # only Pods and deliveries are kept
    assert cache.children(NS, "Pod", "lm", ["s"]) is None


def test_the_event_of_its_own_write_is_known_as_its_own_and_anyone_elses_is_not():
    cache = ChildCache()
    secret = {"metadata": {"uid": "s", "name": "lm-owner-token", "namespace": NS, "resourceVersion": "7"}}
    cache.wrote("Secret", secret)                          # every child kind, not only the cached ones
    assert cache.is_own_write(secret)                      # its ADDED: nothing new for the model
    assert not cache.is_own_write(dict(secret, metadata=dict(secret["metadata"], resourceVersion="8")))
    cache.wrote("Pod", pod("p", 3))
    assert cache.is_own_write(pod("p", 3)) and not cache.is_own_write(pod("p", 4))
    held = pod("q", 9)
    cache.wrote("Pod", held, own=False)                    # a create's 409: what held the name
    assert not cache.is_own_write(held)


def test_what_a_pass_gets_is_a_copy():
    cache = ready(ChildCache(), pod("a", 5))
    cache.children(NS, "Pod", "lm", [])[0]["metadata"]["labels"]["x"] = "y"
    assert "x" not in cache.children(NS, "Pod", "lm", [])[0]["metadata"]["labels"]


class Listing(Kube):
    """A Kube whose LIST is counted (no API server: the cache is what is tested)."""

    def __init__(self, cache: ChildCache, listed: list[dict]) -> None:
        self.cache, self.listed, self.lists = cache, listed, []

    def list(self, namespace, kind, selector):
        self.lists.append((namespace, kind, selector))
        return self.listed


def reads(source: str) -> float:
    return metrics.REGISTRY.get_sample_value("resident_operator_child_reads_total",
                                             {"kind": "Pod", "source": source}) or 0.0


def test_kube_lists_only_when_the_cache_cannot_say_and_counts_where_each_read_went():
    cache = ChildCache()
    kube = Listing(cache, [pod("a", 5)])
    api, cached = reads("api"), reads("cache")
    assert names(kube.children(NS, "Pod", "lm", ["a"])) == ["lm-owner-a"]
    assert kube.lists == [(NS, "Pod", "resident.dev/model=lm")]            # not ready: a LIST
    ready(cache, pod("a", 5))
    got = kube.children(NS, "Pod", "lm", ["a"])
    assert names(got) == ["lm-owner-a"] and got[0]["apiVersion"] == "v1" and len(kube.lists) == 1
    assert (reads("api") - api, reads("cache") - cached) == (1, 1)


def failed_mount(uid: str, pod_uid: str, version: int, message: str = "rpc error: code = NotFound desc = x") -> dict:
    return {"metadata": {"uid": uid, "namespace": NS, "resourceVersion": str(version)},
            "involvedObject": {"kind": "Pod", "uid": pod_uid}, "reason": "FailedMount", "message": message}


def test_failed_mounts_are_known_once_the_namespace_was_listed_and_follow_the_watch():
    cache = ChildCache()
    cache.observe("Event", None, failed_mount("e1", "p1", 5))
    assert cache.mount_events(NS, "p1") is None                 # not listed here yet
    cache.refresh_events(NS, [failed_mount("e0", "p1", 4)])
    assert sorted(e["metadata"]["uid"] for e in cache.mount_events(NS, "p1")) == ["e0", "e1"]
    assert cache.mount_events(NS, "p2") == []                   # known: none
    cache.observe("Event", "DELETED", failed_mount("e0", "p1", 6))
    assert [e["metadata"]["uid"] for e in cache.mount_events(NS, "p1")] == ["e1"]
    cache.observe("Pod", "ADDED", pod("p1", 7, labels={"resident.dev/model": "lm",
                                                      "resident.dev/model-uid": "model-1"}))
    assert cache.model_uid_of("p1") == "model-1" and cache.model_uid_of("p9") is None
    cache.observe("Pod", "DELETED", pod("p1", 8))
    assert cache.mount_events(NS, "p1") == []                   # a Pod's Events go with it


class EventListing(Kube):
    def __init__(self, cache: ChildCache | None, listed: list[dict]) -> None:
        self.cache, self.listed, self.selectors = cache, listed, []

    def _events(self, namespace, selector):
        self.selectors.append(selector)
        return self.listed


def test_a_pod_waiting_for_its_volume_is_not_polled_once_its_namespaces_events_are_known():
    kube = EventListing(ChildCache(), [failed_mount("e1", "p1", 5)])
    events, watched = kube.failed_mounts(NS, "p1")
    assert watched and [e["metadata"]["uid"] for e in events] == ["e1"]
    assert kube.failed_mounts(NS, "p2") == ([], True)
    assert kube.selectors == ["reason=FailedMount,involvedObject.kind=Pod"]     # one LIST
    bare = EventListing(None, [failed_mount("e1", "p1", 5)])                   # no cache: asked each time
    assert bare.failed_mounts(NS, "p1")[1] is False
    assert bare.selectors == ["involvedObject.uid=p1,reason=FailedMount"]


def model(uid: str, version: int | str, **status) -> dict:
    return {"apiVersion": "resident.dev/v1alpha1", "kind": "ResidentModel",
            "metadata": {"uid": uid, "name": "lm", "namespace": NS, "resourceVersion": str(version),
                         "managedFields": [{"manager": "resident-operator"}]},
            "spec": {"replicas": 1}, "status": status}


def test_a_model_is_served_at_the_newest_version_the_watch_or_this_operators_writes_gave():
    cache = ChildCache()
    assert cache.model("m") is None                                  # never seen: the pass GETs
    cache.observe_model("ADDED", model("m", 10))
    cache.observe_model(None, model("m", 12, phase="Loading"))        # the answer to its status write
    cache.observe_model("MODIFIED", model("m", 11))                   # the watch catching up: older
    held = cache.model("m")
    assert held["metadata"]["resourceVersion"] == "12" and held["status"] == {"phase": "Loading"}
    assert "managedFields" not in held["metadata"]
    held["status"]["phase"] = "changed by a pass"
    assert cache.model("m")["status"] == {"phase": "Loading"}         # a copy
    cache.observe_model("MODIFIED", model("m", 12, phase="Loading"))  # its own write's event
    cache.observe_model("MODIFIED", model("m", 13, phase="Ready"))    # someone else's, later
    assert cache.model("m")["status"] == {"phase": "Ready"}


def test_a_deleted_model_is_not_brought_back_and_unordered_versions_are_not_served():
    cache = ChildCache()
    cache.observe_model("ADDED", model("m", 10))
    cache.observe_model("DELETED", model("m", 11))
    cache.observe_model(None, model("m", 11))     # a late answer to a write
    assert cache.model("m") is None
    cache.observe_model("ADDED", model("n", "not-a-number"))
    assert cache.model("n") is None


class ModelReading(Kube):
    """A Kube whose model GET is counted (no API server: the cache is what is tested)."""

    def __init__(self, cache: ChildCache, stored: dict) -> None:
        self.cache, self.stored, self.gets = cache, stored, 0

    def get_model(self, namespace, name):
        self.gets += 1
        return self._read_model(dict(self.stored))


def model_reads(source: str) -> float:
    return metrics.REGISTRY.get_sample_value("resident_operator_model_reads_total", {"source": source}) or 0.0


def test_kube_gets_a_model_only_when_the_cache_has_none_and_keeps_what_it_read():
    kube = ModelReading(ChildCache(), model("m", 20, phase="Ready"))
    api, cached = model_reads("api"), model_reads("cache")
    assert kube.model(NS, "lm", "m")["metadata"]["resourceVersion"] == "20" and kube.gets == 1
    assert kube.model(NS, "lm", "m")["status"] == {"phase": "Ready"} and kube.gets == 1
    kube.stored = model("m", 21, phase="Ready")                  # a change whose event was missed
    assert kube.model(NS, "lm", "m", fresh=True)["metadata"]["resourceVersion"] == "21"   # a resync's
    assert kube.model(NS, "lm", "m")["metadata"]["resourceVersion"] == "21" and kube.gets == 2
    assert (model_reads("api") - api, model_reads("cache") - cached) == (2, 2)
