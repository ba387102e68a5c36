"""Peer delivery between node stores (issue 30): the bridge's peer server
(csi_bridge/peer_server.py) answering only the bridge's own ServiceAccount, checked by a
real TokenReview against the real API server, and a store taking a revision from peers in
front of the origin (bundle/sources/peers.py): real stores, real HTTP on 127.0.0.1, tokens
from the TokenRequest API, as kubelet projects them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import requests
from kubernetes import client
from prometheus_client import CollectorRegistry

from bundle.scan import build_manifest, write_manifest
from bundle.sources.file import FileSource
from bundle.sources.peers import PeeredSource, PeerSource
from bundle.plan import content_key
from bundle.store import Store
from csi_bridge.metrics import BridgeMetrics
from csi_bridge.peer_server import AUDIENCE, PeerServer, TokenReviewer
from polling import wait_for

pytestmark = pytest.mark.cluster
CHUNK = 64 * 1024
WEIGHTS = os.urandom(48 * CHUNK)     # 48 chunks
SEGMENT = 4 * CHUNK                  # 12 segments: one request each


class Peers:
    """Two nodes that hold revision A, each serving its store; the origin a file source.
    The servers review tokens as the chart's bridge account (its RBAC, peers enabled), and
    serve that account only."""

    def __init__(self, cluster, accounts, namespace: str, tmp: Path):
        from kubernetes import config
        self.core = client.CoreV1Api(cluster.api_client())
        self.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name="someone")))
        self.namespace, self.tmp = namespace, tmp
        self.bridge_namespace, self.bridge_name = accounts.namespace, "accounts-resident-bridge"
        self.account = f"system:serviceaccount:{self.bridge_namespace}:{self.bridge_name}"
        as_bridge = config.new_client_from_config(config_file=accounts.bridge)
        self.bundle = tmp / "origin"
        self.bundle.mkdir()
        (self.bundle / "model.safetensors").write_bytes(WEIGHTS)
        (self.bundle / "config.json").write_bytes(b'{"layers": 2}')
        self.manifest = build_manifest(self.bundle, chunk_size=CHUNK)
        write_manifest(self.bundle, self.manifest)
        self.servers, self.metrics = {}, {}
        for node in ("node-1", "node-2"):
            store = Store(tmp / node)
            store.materialize(self.manifest, FileSource(f"file://{self.bundle}"))
            self.metrics[node] = BridgeMetrics(CollectorRegistry())
            self.servers[node] = PeerServer(store, TokenReviewer(as_bridge, self.account),
                                            "127.0.0.1", 0, metrics=self.metrics[node]).start()

    def token(self, other: bool = False, audience: str = AUDIENCE) -> str:
        """A token as kubelet projects it: the bridge's, or with ``other`` one of an account
        of another namespace."""
        name, ns = ("someone", self.namespace) if other else (self.bridge_name, self.bridge_namespace)
        return self.core.create_namespaced_service_account_token(name, ns, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=600))).status.token

    def peers(self, token: str | None = None) -> list[PeerSource]:
        token = token or self.token()
        return [PeerSource(node, s.address, lambda: token) for node, s in self.servers.items()]

    def count(self, node: str, outcome: str) -> float:
        return self.metrics[node].registry.get_sample_value("resident_peer_requests_total", {"outcome": outcome}) or 0

    def served(self, node: str) -> float:
        return self.metrics[node].registry.get_sample_value("resident_peer_served_bytes_total") or 0

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()


@pytest.fixture
def peers(cluster, chart_accounts, namespace, tmp_path):
    p = Peers(cluster, chart_accounts, namespace, tmp_path)
    try:
        yield p
    finally:
        p.stop()


class CountingOrigin(FileSource):
    """The origin, counting what it was asked for (a file source: nothing to fake)."""

    def __init__(self, uri: str, down: bool = False):
        super().__init__(uri)
        self.asked, self.down = 0, down

    def read(self, entry, offset, length):
        if self.down:
            from bundle.errors import SourceUnavailable
            raise SourceUnavailable("the origin is down")
        self.asked += length
        return super().read(entry, offset, length)


def take(peers: Peers, origin, peer_list) -> tuple[Store, PeeredSource]:
    store = Store(peers.tmp / "node-3")
    source = PeeredSource(origin, peer_list, segment_bytes=SEGMENT)
    manifest = source.fetch_manifest(peers.manifest.digest)
    res = store.materialize(manifest, source, mode="WholeBundle")
    assert res.verified and store.has_revision(peers.manifest.digest)
    assert (store.revision_path(peers.manifest.digest) / "model.safetensors").read_bytes() == WEIGHTS
    return store, source


def test_a_revision_comes_from_both_peers_and_nothing_from_the_origin(peers):
    origin = CountingOrigin(f"file://{peers.bundle}", down=True)   # it could not serve anyway
    _, source = take(peers, origin, peers.peers())
    total = sum(f.size for f in peers.manifest.files)
    assert source.tally.origin == 0 and source.tally.from_peers == total
    # spread over both, by segment
    assert min(source.tally.peers.values()) >= total // 3, source.tally.peers
    # the peers served that, and the manifest (from the first peer, checked against the digest):
    # one request per segment of 4 chunks (12 of the weights, 1 of config.json), one for the manifest
    assert sum(peers.served(n) for n in peers.servers) == total + len(peers.manifest.canonical_json())
    assert sum(peers.count(n, "served") for n in peers.servers) == 12 + 1 + 1
    assert not source.tally.down


@pytest.mark.parametrize("who", ["no token", "the API server's audience", "another account"])
def test_a_request_without_the_bridges_own_token_for_the_peer_audience_is_refused_and_counted(peers, who):
    server = peers.servers["node-1"]
    key = content_key(peers.manifest.files[0], CHUNK) if peers.manifest.files[0].chunks else None
    url = f"http://{server.address}/v1/manifests/{peers.manifest.digest.replace(':', '-')}.json"
    headers = {"no token": {},
               "the API server's audience": {"Authorization": f"Bearer {peers.token(audience='https://kubernetes.default.svc')}"},
               "another account": {"Authorization": f"Bearer {peers.token(other=True)}"}}[who]
    answer = requests.get(url, headers=headers, timeout=10)
    outcome = {"no token": "no-token", "the API server's audience": "unauthenticated",
               "another account": "forbidden"}[who]
    assert answer.status_code == (403 if who == "another account" else 401), answer.text
    assert peers.count("node-1", outcome) == 1 and peers.served("node-1") == 0
    # the bridge's own token for the peer audience is served the manifest, whose bytes are the digest's
    good = requests.get(url, headers={"Authorization": f"Bearer {peers.token()}"}, timeout=10)
    assert good.status_code == 200
    wait_for(lambda: peers.count("node-1", "served") == 1, timeout=5, what="the answer counted")
    import hashlib
    assert "sha256:" + hashlib.sha256(good.content).hexdigest() == peers.manifest.digest
    assert key is None or requests.get(f"http://{server.address}/v1/blobs/{key}", headers=headers,
                                       timeout=10).status_code in (401, 403)


def test_a_peer_that_serves_a_corrupted_chunk_is_caught_and_not_used_again(peers):
    weights = next(f for f in peers.manifest.files if f.path == "model.safetensors")
    blob = peers.servers["node-2"].store.blob_path(content_key(weights, CHUNK))
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:      # one byte of chunk 5, in segment 1: node-2's turn
        f.seek(5 * CHUNK + 5)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    origin = CountingOrigin(f"file://{peers.bundle}")
    _, source = take(peers, origin, peers.peers())
    assert source.tally.corrupt == ["node-2"] and "wrong hash" in source.tally.down["node-2"]
    served_by_2 = peers.served("node-2")
    assert source.tally.peers.get("node-2", 0) <= served_by_2 - SEGMENT   # the bad segment not counted
    assert source.tally.origin == 0 and source.tally.peers["node-1"] > 0   # node-1 took over


def test_a_peer_that_dies_mid_transfer_costs_only_its_unfinished_chunks(peers):
    slow = peers.servers["node-1"]
    slow.rate.per_second = 8 * CHUNK          # ~6 s for its share: time to kill it mid-way
    killer = threading.Timer(1.0, slow.stop)
    killer.start()
    origin = CountingOrigin(f"file://{peers.bundle}")
    try:
        _, source = take(peers, origin, peers.peers())
    finally:
        killer.cancel()
    assert "node-1" in source.tally.down and not source.tally.corrupt
    total = sum(f.size for f in peers.manifest.files)
    assert source.tally.origin + source.tally.from_peers == total
    # node-1's finished chunks count; its unfinished ones went to node-2, still up: the origin
    # sent nothing, and node-1 sent less than its half
    assert source.tally.origin == 0
    assert source.tally.peers.get("node-1", 0) < total // 2 < source.tally.peers["node-2"]


def test_a_busy_peer_answers_503_and_its_chunk_goes_to_another_peer_or_waits_for_it(peers):
    busy = peers.servers["node-1"]
    busy.slots = threading.BoundedSemaphore(1)
    busy.slots.acquire()                       # one transfer already in flight
    origin = CountingOrigin(f"file://{peers.bundle}")
    _, source = take(peers, origin, peers.peers())
    assert peers.count("node-1", "busy") >= 1 and "node-1" not in source.tally.down
    assert source.tally.origin == 0 and source.tally.peers["node-2"] == sum(f.size for f in peers.manifest.files)
    # the only holder busy for a moment: the chunks wait for it, nothing from the origin
    peers.servers["node-2"].stop()
    store = Store(peers.tmp / "node-4")
    freed = threading.Timer(1.5, busy.slots.release)
    freed.start()
    source = PeeredSource(origin, peers.peers()[:1])
    store.materialize(source.fetch_manifest(peers.manifest.digest), source, mode="WholeBundle")
    freed.join()
    assert source.tally.origin == 0 and not source.tally.down
    assert source.tally.peers["node-1"] == sum(f.size for f in peers.manifest.files)


def test_a_blob_collected_mid_read_is_still_served_whole(peers):
    server = peers.servers["node-1"]
    server.rate.per_second = 16 * CHUNK        # 3 s for the 48 chunks
    weights = next(f for f in peers.manifest.files if f.path == "model.safetensors")
    key = content_key(weights, CHUNK)
    got: dict = {}

    def read():
        got["answer"] = requests.get(f"http://{server.address}/v1/blobs/{key}", timeout=30,
                                     headers={"Authorization": f"Bearer {peers.token()}"})
    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(1.0)
    os.unlink(server.store.blob_path(key))     # as GC removes an unleased blob
    for tree in (server.store.root / "revisions").iterdir():
        for f in tree.iterdir():
            if f.name == weights.path:
                os.chmod(tree, 0o755)
                f.unlink()
    reader.join(30)
    assert got["answer"].status_code == 200 and got["answer"].content == WEIGHTS
    again = requests.get(f"http://{server.address}/v1/blobs/{key}", timeout=10,
                         headers={"Authorization": f"Bearer {peers.token()}"})
    assert again.status_code == 404


def test_with_every_peer_gone_the_origin_serves_and_the_delivery_says_so(peers):
    peers.stop()
    origin = CountingOrigin(f"file://{peers.bundle}")
    _, source = take(peers, origin, peers.peers())
    total = sum(f.size for f in peers.manifest.files)
    assert source.tally.origin == total and source.tally.from_peers == 0
    assert set(source.tally.down) == {"node-1", "node-2"}


def test_a_peer_that_resets_its_connection_between_requests_leaves_no_traceback(peers, capfd):
    """A probe (``Peering.holders``) closes its keep-alive connection when done: the server
    takes that quietly; the bridge's log stays structured."""
    import socket
    import struct
    host, port = peers.servers["node-1"].address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET /v1/manifests/sha256-{peers.manifest.digest.split(':')[1]}.json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert s.recv(64).startswith(b"HTTP/1.1 401")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with RST
    time.sleep(0.5)   # the server's thread reads the reset
    assert peers.count("node-1", "no-token") == 1
    assert "Traceback" not in capfd.readouterr().err


def test_a_revision_cut_at_tensors_comes_from_the_peers_chunk_by_chunk(peers):
    """Chunks of unequal lengths (``--chunking tensors``): each segment a peer is asked for
    starts where a chunk does, and every chunk is checked before it is handed on."""
    import numpy as np
    from safetensors.numpy import save

    cut = peers.tmp / "cut"
    cut.mkdir()
    (cut / "model.safetensors").write_bytes(save({f"t{i}": np.arange(n, dtype=np.float32)
                                                  for i, n in enumerate((70_001, 150_003, 33_333, 300_007))}))
    manifest = build_manifest(cut, chunk_size=CHUNK, chunking="tensors")
    write_manifest(cut, manifest)
    assert manifest.files[0].offsets and len(set(np.diff(manifest.files[0].offsets))) > 2
    for server in peers.servers.values():
        server.store.materialize(manifest, FileSource(f"file://{cut}"))
    source = PeeredSource(CountingOrigin(f"file://{cut}", down=True), peers.peers(), segment_bytes=SEGMENT)
    store = Store(peers.tmp / "node-3")
    res = store.materialize(source.fetch_manifest(manifest.digest), source, mode="WholeBundle")
    assert res.verified and source.tally.origin == 0 and source.tally.from_peers == manifest.total_bytes
    assert min(source.tally.peers.values()) > 0 and not source.tally.down
    assert (res.path / "model.safetensors").read_bytes() == (cut / "model.safetensors").read_bytes()
