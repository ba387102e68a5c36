"""Owners cannot stall the operator: owners that accept connections and never answer.

Real API server, the real operator (KopfRunner, the chart's ServiceAccount) and, for the
healthy models, the real owner runtime on a played node (conftest_operator.PlayedNode).
The hung models' Pods are reported Running and Ready by the played kubelet, but their
control port is a socket server that accepts every connection and never answers, as an
owner stuck in a driver call would. The test measures, in the same run, the transitions
of healthy models without hung owners and then with twelve hung models (24 hung owners,
three times the operator's pass threads), and checks that the hung owners are reported
``OwnerUnresponsive``, are not asked again on every pass, and that an owner that stops
hanging is seen again.
"""

from __future__ import annotations

import socket
import threading
import time

from bundle.cpu_model import make_demo, make_revision
from localcluster.processes import free_port
from resident_operator import naming

from conftest_operator import Api, PlayedNode, condition, running_operator
from polling import wait_for

HUNG, HEALTHY = 12, 3
TIMEOUT, RECHECK = 2, 5   # the operator's owner-call timeout and recheck (the defaults)


class HangServer:
    """Accepts every connection on ``port`` and never answers; counts the connections."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_server((host, port), backlog=128)
        self.accepted: list[tuple[float, socket.socket]] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append((time.monotonic(), conn))   # kept open, never read

    def connections_since(self, t: float) -> int:
        return sum(1 for at, _ in self.accepted if at >= t)

    def close(self) -> None:
        """Stop hanging: new connections are refused, held ones reset."""
        self.closed = True
        self.sock.close()
        for _, conn in self.accepted:
            conn.close()


class NodeWithHungOwners(PlayedNode):
    """A played node on which the owners of the models in ``hung`` hang (HangServer)."""

    def __init__(self, *args, hung: set[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hung = hung
        self.servers: dict[int, HangServer] = {}

    def _sync_pod(self, pod) -> None:
        if pod.metadata.labels.get(naming.LABEL_MODEL) not in self.hung or pod.metadata.deletion_timestamp:
            return super()._sync_pod(pod)
        port = pod.spec.containers[0].ports[0].container_port
        if port not in self.servers:
            self.servers[port] = HangServer(self.ip, port)
        if pod.status.phase != "Running":   # kubelet says Running and Ready: only the owner hangs
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.api.core.patch_namespaced_pod_status(pod.metadata.name, self.ns, {"status": {
                "phase": "Running", "podIP": self.ip, "podIPs": [{"ip": self.ip}],
                "hostIP": "127.0.0.1", "startTime": now,
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}})

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for server in self.servers.values():
                server.close()


def status(api, name):
    return (api.model(name) or {}).get("status") or {}


def transitions_take(api, names, target):
    """Seconds from patching every model in ``names`` to ``target`` until all succeeded."""
    t0 = time.monotonic()
    for name in names:
        api.patch_spec(name, {"bundle": target})
    wait_for(lambda: all((status(api, n).get("lastTransition") or {}).get("result") == "succeeded"
                         and (status(api, n).get("identity") or {}).get("bundle") == target["digest"]
                         for n in names), timeout=180, what=f"transitions of {names}", every=0.1)
    return time.monotonic() - t0


def reported_unresponsive(api, name):
    s = status(api, name)
    owners = s.get("owners") or []
    degraded = condition({"status": s}, "Degraded")
    return (len(owners) == 2 and all(o.get("reason") == "OwnerUnresponsive" and not o["ready"] for o in owners)
            and degraded.get("reason") == "OwnerUnresponsive" and s.get("ready") == "0/2"
            and condition({"status": s}, "Ready").get("status") == "False" and s)


def test_hung_owners_are_reported_and_never_delay_other_models(cluster, namespace, tmp_path):
    api = Api(cluster, namespace)
    base = make_demo(tmp_path / "base", 256 * 1024, seed=3).digest
    rows = make_revision(tmp_path / "base", tmp_path / "rows", "rows", seed=4, fraction=0.05).digest
    source = {"source": f"file://{tmp_path / 'base'}", "digest": base}
    target = {"source": f"file://{tmp_path / 'rows'}", "digest": rows}
    before, after = [f"before-{i}" for i in range(HEALTHY)], [f"after-{i}" for i in range(HEALTHY)]
    hung = [f"hung-{i}" for i in range(HUNG)]
    capacity = {"pods": "60", "cpu": "64", "memory": "64Gi"}
    with NodeWithHungOwners(cluster, namespace, tmp_path / "node", capacity=capacity, hung=set(hung)) as node, \
            running_operator(namespace, RESIDENT_OWNER_TIMEOUT_SECONDS=str(TIMEOUT),
                             RESIDENT_OWNER_RECHECK_SECONDS=str(RECHECK)):
        for name in before + after:
            api.create_model(name, {"bundle": source, "runtime": {"port": free_port()},
                                    "transition": {"timeoutSeconds": 120}})
        wait_for(lambda: all(status(api, n).get("phase") == "Ready" for n in before + after),
                 timeout=120, what="the healthy models Ready")

        baseline = transitions_take(api, before, target)    # no hung owner anywhere yet

        for name in hung:
            api.create_model(name, {"bundle": source, "replicas": 2,
                                    "runtime": {"port": free_port()}})
        hung_status = {n: wait_for(lambda n=n: reported_unresponsive(api, n), timeout=120,
                                   what=f"{n} reported OwnerUnresponsive") for n in hung}
        owner = hung_status["hung-0"]["owners"][0]
        assert "no answer within" in owner["message"] and owner["pod"] in \
            condition({"status": hung_status["hung-0"]}, "Degraded")["message"]
        assert hung_status["hung-0"]["phase"] == "Degraded"

        t0 = time.monotonic()
        with_hung = transitions_take(api, after, target)   # 24 hung owners, 8 pass threads
        window = time.monotonic() - t0
        print(f"\nbaseline {baseline:.2f}s with hung owners {with_hung:.2f}s")
        assert with_hung <= max(1.5 * baseline, baseline + 3.0), (baseline, with_hung)

        # a hung owner is not asked on every pass: once per recheck at most (plus the
        # pass that found it hanging and the Pod's own events)
        asked = max(s.connections_since(t0) for s in node.servers.values())
        print(f"hung owner connections {asked} in {window:.1f}s")
        assert asked <= 2 * (window / RECHECK + 2), (asked, window)
        assert all(reported_unresponsive(api, n) for n in hung)   # still reported

        # an owner that stops hanging (its port now refuses) is seen again by its probe
        server = node.servers[next(p for p in node.servers
                                   if p == api.model("hung-0")["spec"]["runtime"]["port"])]
        server.close()
        wait_for(lambda: all(o.get("reason") != "OwnerUnresponsive"
                             for o in status(api, "hung-0").get("owners") or [{}]),
                 timeout=RECHECK + 3 * TIMEOUT + 5, what="hung-0 answers again (refused, not hung)")
        assert condition({"status": status(api, "hung-0")}, "Degraded")["reason"] != "OwnerUnresponsive"
        for name in hung:
            api.delete_model(name)
        wait_for(lambda: not any(api.model(n) for n in hung), timeout=120, what="hung models deleted")
