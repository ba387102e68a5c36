"""Debian's Prometheus on 127.0.0.1 (testkit.prometheus_server) runs the scrape
configuration of docs/metrics.md on Pods that testkit.pod_discovery serves, without a
cluster: the Pods here are made up and their "Pod IP" is 127.0.0.1, where a small server
answers /metrics. It keeps the owner's annotated port (one target, though the Pod declares
two ports), names the job and copies the Pod's model and node, and leaves an unannotated
Pod alone; the server listens on 127.0.0.1 only and stops with no process left."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubernetes import client

from localcluster.processes import free_ports
from polling import wait_for
from scrape_config import documented_scrape_configs, with_pod_discovery
from testkit.pod_discovery import PodDiscovery
from testkit.prometheus_server import running_prometheus


def serve_metrics(port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"resident_owner_ready 1\n" if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def pod(name: str, labels: dict, annotations: dict, ports: list[tuple[str, int]]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="team", uid=name, labels=labels, annotations=annotations),
        spec=client.V1PodSpec(node_name="node-0", containers=[client.V1Container(
            name="main", image="resident:dev",
            ports=[client.V1ContainerPort(name=n, container_port=p) for n, p in ports])]),
        status=client.V1PodStatus(pod_ip="127.0.0.1", host_ip="127.0.0.1", phase="Running"))


def test_the_documented_relabelling_makes_one_owner_target_with_its_model_and_node(tmp_path):
    http, control = free_ports(2)
    metrics = serve_metrics(http)
    owner = pod("story-0-0", {"resident.dev/component": "owner", "resident.dev/model": "story"},
                {"prometheus.io/scrape": "true", "prometheus.io/port": str(http), "prometheus.io/path": "/metrics"},
                [("control", control), ("http", http)])
    unannotated = pod("other", {"resident.dev/component": "owner"}, {}, [("http", http)])
    try:
        with PodDiscovery(lambda: [owner, unannotated]) as discovery:
            config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                      "scrape_configs": with_pod_discovery(documented_scrape_configs(), discovery.url)}
            with running_prometheus(tmp_path / "prometheus", config) as prom:
                found = wait_for(lambda: [t for t in prom.targets() if t["health"] == "up"], timeout=30,
                                 what="a target up")
                assert len(prom.targets()) == 1
                labels = found[0]["labels"]
                assert (labels["job"], labels["model"], labels["node"], labels["namespace"], labels["pod"]) == (
                    "resident-owner", "story", "node-0", "team", "story-0-0")
                assert found[0]["scrapeUrl"] == f"http://127.0.0.1:{http}/metrics"
                sample = wait_for(lambda: prom.query('resident_owner_ready{job="resident-owner"}'), timeout=30,
                                  what="the owner's sample")
                assert sample[0]["metric"]["model"] == "story" and sample[0]["value"][1] == "1"
                pid = _prometheus_pid(tmp_path)
                assert _listening(pid) == [prom.url.removeprefix("http://")]   # loopback only
                pid_file = Path(f"/proc/{pid}")
            assert not pid_file.exists(), "Prometheus is still running after the block"
    finally:
        metrics.shutdown()
        metrics.server_close()


def _listening(pid: int) -> list[str]:
    """The addresses the process listens on (TCP)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def _prometheus_pid(work: Path) -> int:
    """The PID of the Prometheus whose configuration is under ``work``."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"prometheus") and any(str(work).encode() in a for a in argv):
                return int(proc.name)
    raise AssertionError(f"no Prometheus process runs with {work}")
