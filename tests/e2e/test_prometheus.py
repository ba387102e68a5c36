"""A real Prometheus scraping the local cluster: the chart's targets are up, the dashboard's
queries return data, and the alert rules fire on their fault and resolve after the fix.

Prometheus is Debian's (testkit.prometheus_server), on 127.0.0.1, scraping every second
and evaluating every second. It scrapes with the configuration docs/metrics.md gives for
annotation discovery (the local cluster has no prometheus-operator CRDs, so the chart
renders annotations), read from the page. That Prometheus has no Kubernetes discovery,
so Pods reach it through testkit.pod_discovery, which lists them with the token of a
ServiceAccount that may only read Pods and labels them as ``kubernetes_sd_configs`` does;
the relabelling is the documented one. Pod IPs are routed from this machine to the node.

The rules are charts/resident/files/alerts.yaml with every ``for:`` cut to
:data:`FOR`, so that a fault shows within seconds: the durations themselves are covered
by promtool's tests (tests/unit/test_alert_rules.py). Every test restores what it
changed, in ``finally``, for the tests that share the cluster after it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client

from localcluster.faults import container_id, frozen, restarts
from localcluster.install import local_values
from localcluster.scenario import BundleServer, condition
from polling import wait_for
from scrape_config import documented_scrape_configs, with_pod_discovery
from testkit.pod_discovery import PodDiscovery, pods_of
from testkit.prometheus_server import running_prometheus

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "resident" / "files" / "alerts.yaml"
DASHBOARD = REPO / "charts" / "resident" / "files" / "dashboards" / "resident.json"
FOR = "2s"
# Grafana's variables in the dashboard's queries, as Grafana would fill them for a panel
# that shows the last few minutes (the whole life of this module's Prometheus)
VARIABLES = {"$__rate_interval": "1m", "$__range": "5m"}
READER_NAMESPACE = "e2e-prometheus"
# Prometheus' own ServiceAccount: Pod discovery needs get, list and watch on Pods, nothing else
READER = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {READER_NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: prometheus, namespace: {READER_NAMESPACE}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: e2e-prometheus}}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: e2e-prometheus}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-prometheus}}
subjects: [{{kind: ServiceAccount, name: prometheus, namespace: {READER_NAMESPACE}}}]
"""


def quick_rules(path: Path) -> Path:
    """A copy of the alert rules with every ``for:`` set to :data:`FOR`."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def prometheus(world, tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus")
    cluster = world.cluster
    cluster.kubectl("apply", "-f", "-", input=READER)
    try:
        cluster.wait_for_service_account(READER_NAMESPACE, "prometheus")
        token = cluster.kubectl("create", "token", "prometheus", "-n", READER_NAMESPACE,
                                "--duration=1h").stdout.strip()
        kubeconfig = work / "kubeconfig"
        cluster.write_kubeconfig(str(kubeconfig), token, "prometheus")
        with PodDiscovery(pods_of(str(kubeconfig))) as discovery:
            config = {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(quick_rules(work / "alerts.yaml"))],
                "scrape_configs": with_pod_discovery(documented_scrape_configs(), discovery.url),
            }
            with running_prometheus(work, config) as prom:
                yield prom
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found", input=READER, check=False)


# -- reading Prometheus ----------------------------------------------------------------
def targets(prom, job: str, **labels: str) -> list[dict]:
    return [t for t in prom.targets() if t["labels"].get("job") == job
            and all(t["labels"].get(k) == v for k, v in labels.items())]


def all_up(prom, job: str, count: int, **labels: str) -> list[dict] | None:
    """The ``count`` targets of ``job`` with ``labels`` once every one is up; else None."""
    found = targets(prom, job, **labels)
    return found if len(found) == count and all(t["health"] == "up" for t in found) else None


def alert_state(prom, name: str, **labels: str) -> str | None:
    """``pending`` or ``firing`` for the active alert ``name`` with ``labels``; None if none is."""
    states = [a["state"] for a in prom.alerts() if a["labels"]["alertname"] == name
              and all(a["labels"].get(k) == v for k, v in labels.items())]
    return "firing" if "firing" in states else states[0] if states else None


def wait_firing(prom, name: str, timeout: float = 60.0, **labels: str) -> None:
    wait_for(lambda: alert_state(prom, name, **labels) == "firing" or None, timeout=timeout, every=0.5,
             what=f"{name} {labels} firing (active alerts: {_active(prom)})")


def wait_resolved(prom, name: str, timeout: float = 60.0, **labels: str) -> None:
    wait_for(lambda: alert_state(prom, name, **labels) is None, timeout=timeout, every=0.5,
             what=f"{name} {labels} resolved (active alerts: {_active(prom)})")


def _active(prom) -> list[tuple[str, str]]:
    return [(a["labels"]["alertname"], a["state"]) for a in prom.alerts()]


def bridge_pod(world) -> client.V1Pod:
    core = client.CoreV1Api(world.cluster.api_client())
    pods = core.list_namespaced_pod(world.installation.namespace,
                                    label_selector="app.kubernetes.io/component=bridge").items
    return next(p for p in pods if p.spec.node_name == world.cluster.node_name)


def upgrade_bridge(world, **bridge: object) -> None:
    """``helm upgrade`` with the local values plus ``bridge`` settings (none: the values
    the cluster was installed with), and wait for the bridges to roll."""
    inst, cluster = world.installation, world.cluster
    values = local_values(inst.image, inst.bridge_root)
    values["bridge"].update(bridge)
    inst.helm.upgrade(inst.release, values=values)
    for daemonset in cluster.kubectl("get", "daemonsets", "-n", inst.namespace, "-o", "name").stdout.split():
        cluster.kubectl("rollout", "status", daemonset, "-n", inst.namespace, "--timeout=120s")


# -- dashboard -------------------------------------------------------------------------
def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every panel, Grafana's variables filled in."""
    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    found = []
    for panel in panels(json.loads(DASHBOARD.read_text())["panels"]):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"a dashboard variable this test does not fill: {expr}"
            found.append((panel["title"], expr))
    return found


def grouping_labels(expr: str) -> set[str]:
    """The labels the query's ``by (...)`` clauses keep (``le`` is consumed by the quantile)."""
    return {l.strip() for clause in re.findall(r"\bby \(([^)]*)\)", expr) for l in clause.split(",")} - {"le", ""}


def answered(prom, expr: str) -> bool:
    """The query returns samples, each carrying the labels it groups by."""
    found = prom.query(expr)
    keep = grouping_labels(expr)
    return bool(found) and all(s["metric"].get(l) for s in found for l in keep)


# -- tests -----------------------------------------------------------------------------
def test_every_target_of_the_chart_is_up_and_every_dashboard_query_returns_data(world, prometheus):
    story = world.ready("e2e-prom-board", world.revs.a)
    node = story.owner_pods()[0].spec.node_name
    operator = wait_for(lambda: all_up(prometheus, "resident-operator", 1), timeout=30,
                        what="one operator target up")
    assert operator[0]["labels"]["namespace"] == world.installation.namespace
    bridges = wait_for(lambda: all_up(prometheus, "resident-bridge", len(world.cluster.nodes)), timeout=30,
                       what="a bridge target up per node")
    assert {t["labels"]["node"] for t in bridges} == {n.name for n in world.cluster.nodes}
    # the owner, found by the annotations the operator gave its Pod: one target, not one
    # per declared port
    owners = wait_for(lambda: all_up(prometheus, "resident-owner", 1, namespace=story.namespace), timeout=30,
                      what="the owner's target up")
    assert (owners[0]["labels"]["model"], owners[0]["labels"]["node"]) == (story.name, node)
    assert owners[0]["scrapeUrl"].endswith(":8000/metrics")     # the inference port

    # a transition, an answer and an error on the inference port, each scraped before and after
    fresh = world.fresh_revision("a", "rows", seed=71)
    story.transition({"bundle": {"source": world.server.url, "digest": fresh}})
    story.complete("Resident keeps", max_tokens=3)
    assert requests.get(f"http://{story.service_address()}/v1/models/absent", timeout=10).status_code == 404

    queries = dashboard_queries()
    assert len(queries) >= 10
    wait_for(lambda: all(answered(prometheus, expr) for _, expr in queries), timeout=30, every=1,
             what="every dashboard query to return data: "
                  f"{[title for title, expr in queries if not answered(prometheus, expr)]}")
    store = prometheus.query('max by (node) (resident_store_bytes{job="resident-bridge"})')
    assert {s["metric"]["node"] for s in store} == {node} and float(store[0]["value"][1]) > 0
    ttft = prometheus.query(dict(queries)["Time to first token (p95)"])
    assert [s["metric"]["model"] for s in ttft] == [story.name] and math.isfinite(float(ttft[0]["value"][1]))
    story.delete_and_wait_gone()


def test_a_stopped_bridge_fires_bridge_down_and_it_resolves_when_the_bridge_runs_again(world, prometheus):
    pod = bridge_pod(world)
    node = pod.spec.node_name
    wait_for(lambda: all_up(prometheus, "resident-bridge", 1, node=node), timeout=30, what="the bridge up")
    assert alert_state(prometheus, "ResidentBridgeDown", node=node) is None
    # stopped for seconds: kubelet's liveness probe restarts it only after 5 failures 10 s apart
    with frozen(container_id(pod, "bridge")):
        wait_firing(prometheus, "ResidentBridgeDown", timeout=30, node=node)
    wait_resolved(prometheus, "ResidentBridgeDown", timeout=30, node=node)
    after = bridge_pod(world)
    assert after.metadata.uid == pod.metadata.uid and restarts(after, "bridge") == restarts(pod, "bridge")


def test_a_stopped_operator_fires_operator_down_and_it_resolves_when_the_operator_runs_again(world, prometheus):
    core = client.CoreV1Api(world.cluster.api_client())
    pod, = core.list_namespaced_pod(world.installation.namespace,
                                    label_selector="app.kubernetes.io/component=operator").items
    wait_for(lambda: all_up(prometheus, "resident-operator", 1), timeout=30, what="the operator up")
    assert alert_state(prometheus, "ResidentOperatorDown") is None
    # stopped for seconds: kubelet's liveness probe restarts it only after 4 failures 15 s apart
    with frozen(container_id(pod, "operator")):
        wait_firing(prometheus, "ResidentOperatorDown", timeout=30)
    wait_resolved(prometheus, "ResidentOperatorDown", timeout=30)
    after = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    assert restarts(after, "operator") == restarts(pod, "operator")   # the same process went on


def test_a_source_that_is_down_fires_model_degraded_and_it_resolves_when_the_source_is_back(world, prometheus,
                                                                                            tmp_path):
    # a second server on the same bundles, started only for the fix: until then its port refuses
    source = BundleServer(world.server.root, tmp_path / "source-logs", cluster=world.cluster)
    story = world.ready("e2e-prom-source", world.revs.a)
    model = {"namespace": story.namespace, "model": story.name}
    assert alert_state(prometheus, "ResidentModelDegraded", **model) is None
    fresh = world.fresh_revision("a", "rows", seed=72)
    story.patch_spec({"bundle": {"source": source.url, "digest": fresh}})
    story.wait("Degraded SourceUnavailable",
               lambda rm: condition(rm, "Degraded").get("reason") == "SourceUnavailable", timeout=60)
    wait_firing(prometheus, "ResidentModelDegraded", **model)
    with source:
        story.wait_ready(fresh, timeout=90)     # the operator's probe of the source answered
        wait_resolved(prometheus, "ResidentModelDegraded", **model)
        story.delete_and_wait_gone()


def test_a_hung_owner_fires_owner_unresponsive_and_it_resolves_when_the_owner_answers(world, prometheus):
    story = world.ready("e2e-prom-owner", world.revs.a)
    pod = story.owner_pods()[0]
    assert alert_state(prometheus, "ResidentOwnerUnresponsive") is None
    # the owner's liveness probe restarts it only after 6 failures 10 s apart
    with frozen(container_id(pod, pod.spec.containers[0].name)):
        story.wait("Degraded OwnerUnresponsive",
                   lambda rm: condition(rm, "Degraded").get("reason") == "OwnerUnresponsive", timeout=60)
        wait_firing(prometheus, "ResidentOwnerUnresponsive", timeout=30)
    wait_resolved(prometheus, "ResidentOwnerUnresponsive", timeout=30)
    story.wait_ready(world.revs.a, timeout=60)
    after, = story.owner_pods()
    assert after.metadata.uid == pod.metadata.uid and restarts(after, pod.spec.containers[0].name) == 0
    story.delete_and_wait_gone()


def test_a_store_above_its_high_watermark_fires_and_it_resolves_when_the_watermark_is_raised(world, prometheus):
    story = world.ready("e2e-prom-store", world.revs.a)
    node = story.owner_pods()[0].spec.node_name
    assert alert_state(prometheus, "ResidentStoreAboveHighWatermark", node=node) is None
    try:
        # 1 MiB: below the 16 MiB revision the owner's volume leases, which GC may not remove
        upgrade_bridge(world, gc={"highWaterBytes": 1 << 20})
        wait_firing(prometheus, "ResidentStoreAboveHighWatermark", timeout=60, node=node)
    finally:
        upgrade_bridge(world)
    wait_resolved(prometheus, "ResidentStoreAboveHighWatermark", timeout=60, node=node)
    story.delete_and_wait_gone()
