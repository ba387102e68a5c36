"""The scrape configuration in docs/metrics.md (annotation discovery): Prometheus' own
checker accepts it, and it names the jobs the alert rules and the dashboard select, with
honor_labels on the operator's only. tests/e2e/test_prometheus.py runs it against a cluster.

Debian's promtool, like its Prometheus, knows no ``kubernetes_sd_configs``; it checks the
configuration with the discovery the e2e test uses in its place (tests/scrape_config.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from scrape_config import documented_scrape_configs, with_pod_discovery  # noqa: E402


def test_promtool_accepts_the_documented_scrape_configuration(tmp_path):
    config = tmp_path / "prometheus.yml"
    configs = with_pod_discovery(documented_scrape_configs(), "http://127.0.0.1:1/")
    config.write_text(yaml.safe_dump({"scrape_configs": configs}))
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: apt-get install prometheus (scripts/bootstrap installs it)"
    done = subprocess.run([tool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_names_the_jobs_the_rules_select_and_keeps_only_the_operators_labels():
    jobs = {j["job_name"]: j for j in documented_scrape_configs()}
    assert set(jobs) == {"resident-operator", "resident-bridge", "resident-owner"}
    assert [name for name, j in jobs.items() if j.get("honor_labels")] == ["resident-operator"]
    for name, job in jobs.items():
        assert job["kubernetes_sd_configs"] == [{"role": "pod"}], name
        targets = {r.get("target_label") for r in job["relabel_configs"]}
        assert {"__address__", "namespace", "pod"} <= targets, name
    assert "node" in {r.get("target_label") for r in jobs["resident-bridge"]["relabel_configs"]}
    assert {"node", "model"} <= {r.get("target_label") for r in jobs["resident-owner"]["relabel_configs"]}


def test_the_stand_in_discovery_replaces_only_the_kubernetes_discovery():
    inside = documented_scrape_configs()
    swapped = with_pod_discovery(inside, "http://127.0.0.1:1/")
    assert [j["http_sd_configs"] for j in swapped] == [[{"url": "http://127.0.0.1:1/", "refresh_interval": "1s"}]] * 3
    assert [{k: v for k, v in j.items() if k != "http_sd_configs"} for j in swapped] == \
        [{k: v for k, v in j.items() if k != "kubernetes_sd_configs"} for j in inside]
    assert inside == documented_scrape_configs()   # the documented block is left alone


def test_the_stand_in_labels_each_container_port_of_a_pod_as_kubernetes_discovery_does():
    from kubernetes import client

    from testkit.pod_discovery import pod_target_groups

    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="story-0-0", namespace="team", uid="u1",
                                     labels={"resident.dev/component": "owner", "resident.dev/model": "story"},
                                     annotations={"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}),
        spec=client.V1PodSpec(node_name="node-0", containers=[client.V1Container(
            name="owner", image="resident:dev", ports=[client.V1ContainerPort(name="control", container_port=8080),
                                                       client.V1ContainerPort(name="http", container_port=8000)])]),
        status=client.V1PodStatus(pod_ip="10.244.0.7", host_ip="10.200.0.2", phase="Running",
                                  conditions=[client.V1PodCondition(type="Ready", status="True")]))
    groups = pod_target_groups(pod)
    assert [g["targets"] for g in groups] == [["10.244.0.7:8080"], ["10.244.0.7:8000"]]
    labels = groups[1]["labels"]
    assert labels["__meta_kubernetes_pod_label_resident_dev_model"] == "story"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8000"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "http"
    assert (labels["__meta_kubernetes_namespace"], labels["__meta_kubernetes_pod_node_name"],
            labels["__meta_kubernetes_pod_phase"], labels["__meta_kubernetes_pod_ready"]) == (
        "team", "node-0", "Running", "true")
    pod.status.pod_ip = None
    assert pod_target_groups(pod) == []       # no address yet: no target
