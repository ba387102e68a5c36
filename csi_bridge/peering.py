"""This node's part in peer delivery (issue 30): serve the store to the other bridges, and
take a revision from the bridges that hold it before asking the origin.

- **Serving**: :class:`csi_bridge.peer_server.PeerServer` on the bridge Pod's address and
  the chart's peer port, to the bridge's own ServiceAccount only.
- **Finding peers**, through the API server: the other bridges are the Pods of the
  bridge DaemonSet (``selector`` in the bridge's namespace), Running, with an address, on
  another node. Which of them holds revision D is asked of them, all at once: a peer that
  answers D's manifest holds it whole (a store keeps whole revisions only). Nothing is
  kept between deliveries, so a collected revision or a restarted node is never trusted
  from a stale record.
- **Taking**: :meth:`Peering.around` puts the holders in front of the origin
  (:class:`bundle.sources.peers.PeeredSource`); with no holder, or when the peers cannot
  even be listed, the origin is used as before and the delivery says so.

The token the bridge presents is its projected ServiceAccount token with the peer
audience (``token_file``), read for every request: kubelet rotates it.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bundle.sources.peers import PeeredSource, PeerSource
from bundle.sources.source import Source, verify_manifest

from .peer_server import AUDIENCE, PeerServer, TokenReviewer

log = logging.getLogger("resident.bridge.peers")
ASK_SECONDS = 2.0     # a peer that does not answer within this is not asked for the revision


@dataclass(frozen=True)
class PeerSettings:
    """How a bridge takes part in peer delivery (the chart's ``bridge.peers``)."""

    address: str            # where the peer server listens: the bridge Pod's IP
    port: int               # the peer port, the same on every node (0: any, for tests)
    namespace: str          # the bridge DaemonSet's namespace
    selector: str           # the label selector of its Pods
    account: str            # system:serviceaccount:<namespace>:<name>, the only one served
    token_file: Path        # this bridge's projected token with ``audience``
    audience: str = AUDIENCE
    max_transfers: int = 4  # answers at once; more get 503
    rate: float = 0.0       # bytes per second over all answers (0: no limit)


class Peering:
    def __init__(self, store, api_client, node_id: str, settings: PeerSettings, metrics=None):
        from kubernetes import client
        self.core = client.CoreV1Api(api_client)
        self.node_id, self.settings = node_id, settings
        self.server = PeerServer(store, TokenReviewer(api_client, settings.account, settings.audience),
                                 settings.address, settings.port, metrics=metrics,
                                 max_transfers=settings.max_transfers, rate=settings.rate)
        self.port = int(self.server.address.rsplit(":", 1)[1])

    def start(self) -> "Peering":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def token(self) -> str:
        return Path(self.settings.token_file).read_text().strip()

    def others(self) -> list[tuple[str, str]]:
        """(node, host:port) of every other running bridge, by node name."""
        pods = self.core.list_namespaced_pod(self.settings.namespace, label_selector=self.settings.selector,
                                             _request_timeout=10).items
        return sorted((p.spec.node_name, f"{p.status.pod_ip}:{self.port}") for p in pods
                      if p.spec.node_name and p.spec.node_name != self.node_id and p.status.pod_ip
                      and p.status.phase == "Running" and p.metadata.deletion_timestamp is None)

    def holders(self, digest: str) -> list[PeerSource]:
        """The other bridges that hold revision ``digest`` now."""
        from bundle.sources.ranged import RetryPolicy
        quick = RetryPolicy(attempts=1, connect_timeout_seconds=ASK_SECONDS, read_timeout_seconds=ASK_SECONDS)
        asked = [(PeerSource(node, address, self.token, policy=quick), PeerSource(node, address, self.token))
                 for node, address in self.others()]

        def holds(pair) -> bool:
            try:
                verify_manifest(pair[0].manifest_bytes(digest), digest, f"peer {pair[0].node}")
                return True
            except Exception:   # not held, refused, away: not a holder this time
                return False
            finally:
                pair[0].close()
        if not asked:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(asked)), thread_name_prefix="peer-ask") as pool:
            answers = list(pool.map(holds, asked))
        return [pair[1] for pair, held in zip(asked, answers) if held]

    def around(self, origin: Source, digest: str) -> Source:
        """``origin`` with the peers that hold ``digest`` in front of it, or ``origin`` alone."""
        try:
            holders = self.holders(digest)
        except Exception as e:   # the API server away: the origin, as without peers
            log.warning("peers not found; fetching from the origin", extra={
                "digest": digest, "error": f"{type(e).__name__}: {e}"[:300]})
            return origin
        if not holders:
            return origin
        log.info("revision held by peers", extra={"digest": digest, "peers": [p.node for p in holders]})
        return PeeredSource(origin, holders)


def peer_bytes(source: Source) -> dict:
    """What a delivery says of its peers: bytes from the origin and from each peer, and the
    peers it dropped and why ({} when it had no peers)."""
    tally = getattr(source, "tally", None)
    if tally is None:
        return {}
    return {"bytes_from_origin": tally.origin, "bytes_from_peers": tally.from_peers,
            "peers": dict(sorted(tally.peers.items())), "peers_dropped": dict(sorted(tally.down.items()))}
