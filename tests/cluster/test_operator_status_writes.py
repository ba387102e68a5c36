"""Safe status writes against a real kube-apiserver: two writers of one model lose nothing.

A ResidentModel's status is the operator's database (children by UID, slot counters,
transition progress). At a leader handover two operators can both be active for a
moment. These tests overlap two writers and show that every record survives:

- two ``resident operator`` processes with leader election off (both active, as in a
  handover where the old leader has not stopped yet) place the same models; every child
  the API server holds for a model is in its ``status.children``, and each child was
  created once (watched from the start: one ADDED per name, no DELETED);
- two writers' ModelStates computed from the same read record a child each: the second
  write meets a 409, is retried from the fresh status, and both records are kept.

No node: owner Pods stay Pending, which is all placement looks at.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import kubernetes
import pytest
from kubernetes import client, watch

from bundle.cpu_model import make_demo
from conftest_operator import OPERATOR_ENV, Api, operator_process
from polling import wait_for
from resident_operator.cleanup import ORPHAN_MIN_AGE_SECONDS
from resident_operator.context import ModelContext
from resident_operator.kube import Kube, StatusConflict
from resident_operator.reconcile import state_of

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)

MODELS = [f"m{i}" for i in range(6)]
REPLICAS = 2
CHILDREN = REPLICAS + 4   # owner Pods, the token Secret, Service, PodDisruptionBudget, NetworkPolicy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    digest = make_demo(root / "tiny", 256 * 1024, seed=1).digest
    return {"bundle": {"source": f"file://{root / 'tiny'}", "digest": digest}, "replicas": REPLICAS}


class Births:
    """Every ADDED and DELETED of the core kinds the operator creates in ``namespace``, and
    every version of every model's ``status.children``, seen by watches that start before
    anything is created. ``lost`` lists each record that one version of a model had and a
    later one dropped (nothing is deleted in these tests, so no record may go)."""

    def __init__(self, cluster, namespace: str) -> None:
        self.core = client.CoreV1Api(cluster.api_client())
        self.ns = namespace
        self.added: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.deleted: list[tuple[str, str, str]] = []
        self.custom = client.CustomObjectsApi(cluster.api_client())
        self.records: dict[str, set[str]] = defaultdict(set)
        self.lost: list[tuple[str, str, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(kind, lister), daemon=True)
                         for kind, lister in (("Pod", self.core.list_namespaced_pod),
                                              ("Secret", self.core.list_namespaced_secret),
                                              ("Service", self.core.list_namespaced_service))]
        self._threads.append(threading.Thread(target=self._watch_models, daemon=True))

    def _watch_models(self) -> None:
        def lister(*args: Any, **kw: Any) -> Any:
            return self.custom.list_namespaced_custom_object("resident.dev", "v1alpha1", self.ns,
                                                             "residentmodels", *args, **kw)
        rv = lister()["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            for ev in watch.Watch().stream(lister, resource_version=rv, timeout_seconds=2):
                model = ev["object"]
                rv, name = model["metadata"]["resourceVersion"], model["metadata"]["name"]
                now = set(recorded(model))
                for uid in sorted(self.records[name] - now):
                    self.lost.append((name, uid, rv))
                self.records[name] |= now

    def _watch(self, kind: str, lister: Any) -> None:
        rv = lister(self.ns).metadata.resource_version
        while not self._stop.is_set():
            for ev in watch.Watch().stream(lister, self.ns, resource_version=rv, timeout_seconds=2):
                obj = ev["object"]
                rv = obj.metadata.resource_version
                if (obj.metadata.labels or {}).get("resident.dev/model-uid") is None:
                    continue
                if ev["type"] == "ADDED":
                    self.added[(kind, obj.metadata.name)].append(obj.metadata.uid)
                elif ev["type"] == "DELETED":
                    self.deleted.append((kind, obj.metadata.name, obj.metadata.uid))

    def __enter__(self) -> "Births":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


def labelled(cluster, namespace: str, model_uid: str) -> dict[str, tuple[str, str]]:
    """uid -> (kind, name) of every live object labelled for the model, from the API server."""
    api = cluster.api_client()
    core, policy, net = client.CoreV1Api(api), client.PolicyV1Api(api), client.NetworkingV1Api(api)
    selector = f"resident.dev/model-uid={model_uid}"
    out = {}
    for kind, lister in (("Pod", core.list_namespaced_pod), ("Secret", core.list_namespaced_secret),
                         ("Service", core.list_namespaced_service),
                         ("PodDisruptionBudget", policy.list_namespaced_pod_disruption_budget),
                         ("NetworkPolicy", net.list_namespaced_network_policy)):
        for obj in lister(namespace, label_selector=selector).items:
            if not obj.metadata.deletion_timestamp:
                out[obj.metadata.uid] = (kind, obj.metadata.name)
    return out


def recorded(model: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    return {c["uid"]: (c["kind"], c["name"])
            for c in ((model or {}).get("status") or {}).get("children") or []}


def test_two_active_operators_lose_no_record_and_orphan_no_child(cluster, namespace, tiny, tmp_path):
    api = Api(cluster, namespace)
    with Births(cluster, namespace) as births, \
            operator_process(namespace, tmp_path / "a.log") as a, \
            operator_process(namespace, tmp_path / "b.log") as b:
        uids = {name: api.create_model(name, tiny)["metadata"]["uid"] for name in MODELS}

        def settled():
            for name in MODELS:
                rec = recorded(api.model(name))
                if len(rec) != CHILDREN or rec != labelled(cluster, namespace, uids[name]):
                    return False
            return True
        wait_for(settled, timeout=120, what="every model's children recorded, and nothing else labelled")
        # a lost record shows once the sweep (every 2 s) finds the child ORPHAN_MIN_AGE_SECONDS
        # old and unrecorded: it deletes it and a pass creates it again. Give it that time.
        deadline_wait = ORPHAN_MIN_AGE_SECONDS + 3 * float(OPERATOR_ENV["RESIDENT_SWEEP_SECONDS"])
        threading.Event().wait(deadline_wait)
        assert a.poll() is None and b.poll() is None, "both operators still run"
        for name in MODELS:
            model = api.model(name)
            rec, held = recorded(model), labelled(cluster, namespace, uids[name])
            assert rec == held, f"{name}: recorded {rec} but the API server holds {held}"
            assert len(rec) == CHILDREN
            assert "OrphanDeleted" not in api.reasons(name)
    assert births.lost == [], f"records dropped by a later status version: {births.lost}"
    assert births.deleted == [], f"children deleted while both ran: {births.deleted}"
    twice = {k: v for k, v in births.added.items() if len(v) != 1}
    assert twice == {}, f"children created more than once: {twice}"
    assert len(births.added) == len(MODELS) * (REPLICAS + 2)   # Pods, Secret, Service watched


def test_a_write_computed_from_a_stale_read_is_retried_and_keeps_both_records(cluster, namespace):
    api = Api(cluster, namespace)
    uid = api.create_model("shared", {"bundle": {"source": "file:///nowhere",
                                                 "digest": "sha256:" + "0" * 64}})["metadata"]["uid"]
    conflicts = []

    class CountingKube(Kube):
        def patch_model_status(self, *args: Any, **kw: Any) -> dict[str, Any]:
            try:
                return super().patch_model_status(*args, **kw)
            except StatusConflict:
                conflicts.append(args[1])
                raise

    # both writers run as the operator's ServiceAccount (its RBAC on models/status)
    kube = CountingKube(kubernetes.config.new_client_from_config(config_file=OPERATOR_ENV["KUBECONFIG"]))

    def writer() -> Any:   # each builds its state from the same read, as two leaders would
        body = kube.get_model(namespace, "shared")
        return state_of(ModelContext(kube=kube, settings=None, namespace=namespace, name="shared",
                                     uid=uid, body=body))
    first, second = writer(), writer()

    def child(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "uid": f"uid-{name}"}}
    first.record_child(child("first"))
    second.record_child(child("second"))    # computed before the first write: meets a 409
    first.bump_incarnation(0)
    second.bump_incarnation(0)              # the slot counter moves on, never back
    status = api.model("shared")["status"]
    assert sorted(c["name"] for c in status["children"]) == ["first", "second"]
    assert status["incarnations"] == {"0": 1}
    # the second's record, the first's counter, the second's counter: each was computed
    # from a version the other writer had moved on from, and each was retried
    assert conflicts == ["shared"] * 3
    assert sorted(c["name"] for c in first.children) == ["first", "second"]   # each sees both


def test_a_new_models_children_are_recorded_in_one_status_write(cluster, namespace, tiny, tmp_path):
    """Issue 27, point 5: the first pass creates every child (token Secret, owner Pods,
    Service, PodDisruptionBudget, NetworkPolicy) and records them together, not one write
    per child. Counted from a watch that starts before the model exists."""
    custom = client.CustomObjectsApi(cluster.api_client())
    lister = lambda **kw: custom.list_namespaced_custom_object(  # noqa: E731
        "resident.dev", "v1alpha1", namespace, "residentmodels", **kw)
    rv, versions = lister()["metadata"]["resourceVersion"], []
    api = Api(cluster, namespace)
    with operator_process(namespace, tmp_path / "op.log"):
        api.create_model("solo", tiny)
        deadline = threading.Event()
        while not deadline.is_set() and len(recorded(versions[-1] if versions else None)) < CHILDREN:
            for ev in watch.Watch().stream(lister, resource_version=rv, timeout_seconds=2):
                rv = ev["object"]["metadata"]["resourceVersion"]
                versions.append(ev["object"])
                if len(recorded(ev["object"])) >= CHILDREN:
                    break
            deadline.wait(0) if len(versions) < 500 else deadline.set()
    counts = [len(recorded(v)) for v in versions]
    growth = [b for a, b in zip([0] + counts, counts) if b != a]
    assert counts and counts[-1] == CHILDREN, counts
    assert growth == [CHILDREN], f"the records grew by write: {growth}"
