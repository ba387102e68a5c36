"""Owners cannot stall the operator: owners that accept connections and never answer.

Real API server, the real operator (KopfRunner, the chart's ServiceAccount) and a played
node (conftest_operator.PlayedNode) whose kubelet reports the hung models' Pods Running
and Ready, while their control port is a socket server that accepts every connection and
never answers, as an owner stuck in a driver call would.

The hung owners are reported ``OwnerUnresponsive`` (their ``owners[]`` entries and the
model's ``Degraded`` condition) and not ready. Their models are then woken for passes
again and again (a change of their Pods, as kubelet's updates of a hung owner's Pod
would): no pass asks a hung owner again, so none waits on it, and only its background
probe connects, once per recheck. A pass that waited on a hung owner would hold a pass
thread for the owner-call timeout, and enough of them would hold every thread and delay
every other model (issue 27); the component test
(tests/component/test_operator_owner_calls.py) shows that a healthy owner asked in the
same batch as a hung one is not delayed. An owner that stops hanging is seen again by its
probe while the others stay reported, and models with hung owners are deleted.

It fails with the feature broken: without the mark (or with the calls made on the pass
thread as before) every pass connects to the hung owner again.
"""

from __future__ import annotations

import socket
import threading
import time

from bundle.cpu_model import make_demo
from localcluster.processes import free_port
from resident_operator import naming
from resident_operator.metrics import REGISTRY

from conftest_operator import Api, PlayedNode, condition, running_operator
from polling import wait_for

HUNG, ROUNDS = 2, 3
TIMEOUT, RECHECK = 2, 2   # the operator's owner-call timeout (the default) and recheck


class HangServer:
    """Accepts every connection on ``port`` and never answers; counts the connections."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_server((host, port), backlog=128)
        self.accepted: list[tuple[float, socket.socket]] = []
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


def reported_unresponsive(api, name):
    s = status(api, name)
    owners = s.get("owners") or []
    degraded = condition({"status": s}, "Degraded")
    return (len(owners) == 1 and owners[0].get("reason") == "OwnerUnresponsive" and not owners[0]["ready"]
            and degraded.get("reason") == "OwnerUnresponsive" and s.get("ready") == "0/1"
            and condition({"status": s}, "Ready").get("status") == "False" and s)


def passes():
    """The operator's passes so far (it runs in this process)."""
    return REGISTRY.get_sample_value("resident_operator_pass_duration_seconds_count") or 0


def test_hung_owners_are_reported_not_asked_again_and_seen_when_they_answer(cluster, namespace, tmp_path):
    api = Api(cluster, namespace)
    digest = make_demo(tmp_path / "bundle", 256 * 1024, seed=3).digest
    source = {"source": f"file://{tmp_path / 'bundle'}", "digest": digest}
    hung = [f"hung-{i}" for i in range(HUNG)]
    with NodeWithHungOwners(cluster, namespace, tmp_path / "node", hung=set(hung)) as node, \
            running_operator(namespace, RESIDENT_OWNER_TIMEOUT_SECONDS=str(TIMEOUT),
                             RESIDENT_OWNER_RECHECK_SECONDS=str(RECHECK)):
        for name in hung:
            api.create_model(name, {"bundle": source, "runtime": {"port": free_port()}})
        reported = {n: wait_for(lambda n=n: reported_unresponsive(api, n), what=f"{n} reported OwnerUnresponsive")
                    for n in hung}
        owner = reported["hung-0"]["owners"][0]
        assert "no answer within" in owner["message"] and owner["pod"] in \
            condition({"status": reported["hung-0"]}, "Degraded")["message"]
        assert reported["hung-0"]["phase"] == "Degraded"

        # passes, again and again: none connects to a hung owner; only its probe does
        t0 = time.monotonic()
        for round_ in range(ROUNDS):
            before = passes()
            for name in hung:
                pod, = api.pods(f"{naming.LABEL_MODEL}={name}")
                api.core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"annotations": {
                    "test.resident.dev/wake": str(round_)}}})
            wait_for(lambda: passes() >= before + HUNG, every=0.05, what="a pass of every hung model")
        window = time.monotonic() - t0
        probes = window // (RECHECK + TIMEOUT) + 1   # each probe waits RECHECK, then TIMEOUT in vain
        asked = {port: server.connections_since(t0) for port, server in node.servers.items()}
        assert all(n <= probes for n in asked.values()), (asked, window)
        assert all(reported_unresponsive(api, n) for n in hung)

        # an owner that stops hanging (its port now refuses) is seen again by its probe;
        # the others stay reported
        node.servers[api.model("hung-0")["spec"]["runtime"]["port"]].close()
        wait_for(lambda: all(o.get("reason") != "OwnerUnresponsive"
                             for o in status(api, "hung-0").get("owners") or [{}]),
                 timeout=RECHECK + 2 * TIMEOUT + 5, what="hung-0 answers again (refused, not hung)")
        assert condition({"status": status(api, "hung-0")}, "Degraded")["reason"] != "OwnerUnresponsive"
        assert all(reported_unresponsive(api, n) for n in hung[1:])

        for name in hung:
            api.delete_model(name)
        wait_for(lambda: not any(api.model(n) for n in hung), what="models with hung owners deleted")
    assert not node.errors, node.errors[-1]
