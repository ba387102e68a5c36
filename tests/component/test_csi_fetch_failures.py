"""A publish says why a mount waits: real gRPC, a real HTTP bundle server on 127.0.0.1.

ABORTED with progress only while bytes arrive; a fetch that fails (404, refused, wrong
bytes) answers with the source's own error; a stalled fetch says it is stalled; while a
retry after a failure runs, the answer is still that failure; a success forgets it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc
import pytest

from bundle.sources import RetryPolicy, open_source, push
from bundle.sources.httpserve import BundleRequestHandler, BundleServer
from csi_bridge import mountinfo
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request
from localcluster.processes import free_port

FAST = RetryPolicy(attempts=2, backoff_seconds=0.01, connect_timeout_seconds=2, read_timeout_seconds=20)
WEIGHTS = os.urandom(256 * 1024)


class StallingHandler(BundleRequestHandler):
    """The real handler; blob bodies wait for ``server.flowing`` while it is clear."""

    def send_body(self, f, length):
        self.server.flowing.wait(15)
        super().send_body(f, length)


@pytest.fixture
def env(tmp_path):
    srv = BundleServer(tmp_path / "srv", handler=StallingHandler)
    srv.flowing = threading.Event()
    srv.flowing.set()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    digest = make_bundle(tmp_path / "bundle", {"w.safetensors": WEIGHTS, "config.json": b"{}"})
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                 root=tmp_path / "data", authorize="allow-any", private_metrics=True,
                                 publish_wait_seconds=0.6)).start()
    bridge.publisher.open_source = lambda uri, **kw: open_source(uri, FAST, **kw)  # give up after 2 tries
    client = CsiClient(tmp_path / "csi.sock")
    try:
        yield type("Env", (), dict(tmp=tmp_path, srv=srv, uri=srv.url + "/models/m", digest=digest,
                                   bridge=bridge, node=client.node))
    finally:
        srv.flowing.set()
        client.close()
        bridge.stop()
        srv.shutdown()
        srv.server_close()
        thread.join(5)
        cleanup_mounts(tmp_path)


def publish(env, source: str, pod: str = "p1") -> Path:
    target = env.tmp / pod / "mount"
    env.node.NodePublishVolume(publish_request("vol-" + pod, target, env.digest, source))
    return target


def refusal(env, source: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        publish(env, source)
    return e.value


def assert_nothing_published(env):
    assert mountinfo.mount_at(env.tmp / "p1" / "mount") is None
    assert env.bridge.store.revisions() == [] and env.bridge.store.leases() == []
    assert env.bridge.state.publications() == []


def test_a_missing_manifest_answers_unavailable_naming_the_404(env):
    e = refusal(env, env.uri)           # nothing pushed: the server answers 404
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    assert f"delivering {env.digest} from {env.uri}" in e.details()
    assert "not found (HTTP 404)" in e.details()
    failure = env.bridge.state.fetch_failure(env.digest)
    assert (failure.code, failure.source, failure.failures) == ("UNAVAILABLE", env.uri, 1)
    assert_nothing_published(env)
    refusal(env, env.uri)
    assert env.bridge.state.fetch_failure(env.digest).failures == 2
    assert env.bridge.metrics.registry.get_sample_value(
        "resident_fetch_failures_total", {"code": "UNAVAILABLE"}) == 2


def test_a_refused_connection_answers_unavailable_naming_it(env):
    down = f"http://127.0.0.1:{free_port()}/models/m"
    e = refusal(env, down)
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    assert down in e.details() and "refused" in e.details().lower()
    assert_nothing_published(env)


def test_wrong_bytes_answer_data_loss_naming_the_file(env):
    push(env.tmp / "bundle", env.uri)
    for blob in (env.srv.root / "models" / "m" / "blobs").iterdir():
        if blob.stat().st_size == len(WEIGHTS):
            blob.chmod(0o644)
            blob.write_bytes(os.urandom(len(WEIGHTS)))   # same size, other bytes
    e = refusal(env, env.uri)
    assert e.code() == grpc.StatusCode.DATA_LOSS
    assert "integrity mismatch in w.safetensors" in e.details()
    assert_nothing_published(env)


def test_a_stalled_fetch_says_so_and_a_retry_after_a_failure_keeps_naming_it(env):
    refusal(env, env.uri)                                # 404 first: recorded
    push(env.tmp / "bundle", env.uri)                    # the bundle arrives...
    env.srv.flowing.clear()                              # ...but its bytes do not flow
    e = refusal(env, env.uri)                            # a new fetch runs; the last failure stays the answer
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    assert "HTTP 404" in e.details() and "(failed 1 times); retrying: fetching" in e.details()
    env.bridge.state.clear_fetch_failure(env.digest)     # as after an older success: progress only
    e = refusal(env, env.uri)
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    assert "stalled, no byte arrived for" in e.details() and "0 of" in e.details()
    env.srv.flowing.set()
    for _ in range(50):                                  # kubelet's retries
        try:
            target = publish(env, env.uri)
            break
        except grpc.RpcError as again:
            assert again.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE)
    assert (target / "current" / "w.safetensors").read_bytes() == WEIGHTS
    assert env.bridge.state.fetch_failure(env.digest) is None
