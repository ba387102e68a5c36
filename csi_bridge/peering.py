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
- **A rollout** (stagings only): when several nodes stage the same revision at once
  (BundleDeliveries of that digest not yet staged on several nodes) and none holds it,
  the first of those nodes by name is the *seed*: it fetches from the origin, and the
  others wait for it to hold the revision, then take it from it (and from each other as
  they finish). A node stops waiting, and asks the origin, when the seed's delivery
  failed or went away, when the seed's bridge is not Ready, or after
  ``SEED_WAIT_SECONDS``: waiting is never worse than the seed's own fetch.

The token the bridge presents is its projected ServiceAccount token with the peer
audience (``token_file``), read for every request: kubelet rotates it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bundle.sources.peers import PeeredSource, PeerSource
from bundle.sources.source import Source, verify_manifest

from .peer_server import AUDIENCE, PeerServer, TokenReviewer

log = logging.getLogger("resident.bridge.peers")
ASK_SECONDS = 2.0     # a peer that does not answer within this is not asked for the revision
SEED_POLL_SECONDS = 1.0
SEED_WAIT_SECONDS = 900.0   # the longest a node of a rollout waits for the seed


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
        self.core, self.custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
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
        """(node, host:port) of every other bridge that is Ready, by node name."""
        pods = self.core.list_namespaced_pod(self.settings.namespace, label_selector=self.settings.selector,
                                             _request_timeout=10).items
        return sorted((p.spec.node_name, f"{p.status.pod_ip}:{self.port}") for p in pods
                      if p.spec.node_name and p.spec.node_name != self.node_id and p.status.pod_ip
                      and p.metadata.deletion_timestamp is None and any(
                          c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))

    def rollout_seed(self, digest: str) -> str | None:
        """The node that fetches ``digest`` from the origin for the others of a rollout, when
        that is not this node: of the nodes whose BundleDelivery of ``digest`` is not staged
        yet (nor failed), the first by name. None when this node stages it alone or is the seed."""
        from .deliveries import GROUP, PLURAL, VERSION
        items = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=10)["items"]
        wanting = set()
        for bd in items:
            spec, meta, st = bd.get("spec") or {}, bd["metadata"], bd.get("status") or {}
            answered = st.get("observedGeneration") == meta.get("generation")
            if (spec.get("bundle") or {}).get("digest") != digest or meta.get("deletionTimestamp") \
                    or (answered and st.get("phase") in ("Staged", "Failed")) or not spec.get("nodeName"):
                continue
            wanting.add(spec["nodeName"])
        if self.node_id not in wanting or len(wanting) < 2:
            return None
        seed = min(wanting)
        return None if seed == self.node_id else seed

    def await_seed(self, seed: str, digest: str) -> list[PeerSource]:
        """Wait for ``seed`` to hold ``digest``; the holders then, or [] when waiting ended."""
        deadline = time.monotonic() + SEED_WAIT_SECONDS
        while time.monotonic() < deadline:
            others = self.others()
            # whether the seed still leads, read before asking who holds the revision: a seed
            # that finishes in between leads no more (its delivery is Staged) but holds it
            leads = self.rollout_seed(digest) == seed and seed in {n for n, _ in others}
            holders = self.holders(digest, others)
            if holders:
                return holders
            if not leads:
                log.info("the rollout's seed stopped; fetching from the origin", extra={"digest": digest,
                                                                                       "seed": seed})
                return []
            time.sleep(SEED_POLL_SECONDS)
        return []

    def holders(self, digest: str, others: list[tuple[str, str]] | None = None,
                say_why: bool = False) -> list[PeerSource]:
        """The other bridges (``others``, listed now when not given) that hold revision
        ``digest`` now; with ``say_why``, when none does, why each asked is not a holder is logged."""
        from bundle.sources.ranged import RetryPolicy
        quick = RetryPolicy(attempts=1, connect_timeout_seconds=ASK_SECONDS, read_timeout_seconds=ASK_SECONDS)
        asked = [(PeerSource(node, address, self.token, policy=quick), PeerSource(node, address, self.token))
                 for node, address in (self.others() if others is None else others)]

        def why_not(pair) -> str | None:
            """None when the peer holds the revision, else why it is not a holder this time."""
            try:
                verify_manifest(pair[0].manifest_bytes(digest), digest, f"peer {pair[0].node}")
                return None
            except Exception as e:   # not held, refused, away: not a holder this time
                return f"{type(e).__name__}: {e}"[:200]
            finally:
                pair[0].close()
        if not asked:
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(asked)), thread_name_prefix="peer-ask") as pool:
            answers = list(pool.map(why_not, asked))
        found = [pair[1] for pair, reason in zip(asked, answers) if reason is None]
        if say_why and not found:   # a delivery that goes to the origin says why its peers did not count
            log.info("no peer holds the revision", extra={
                "digest": digest, "peers": {pair[0].node: reason for pair, reason in zip(asked, answers)}})
        return found

    def around(self, origin: Source, digest: str, rollout: bool = False) -> Source:
        """``origin`` with the peers that hold ``digest`` in front of it, or ``origin`` alone.
        With ``rollout`` (a staging), a node that is not the rollout's seed waits for it."""
        try:
            # the seed is read before the holders, as in await_seed: a seed that finishes in
            # between no longer wants the revision (its delivery is Staged), so a node that
            # read the seed after the holders would lead a rollout of its own, from the origin
            seed = self.rollout_seed(digest) if rollout else None
            holders = self.holders(digest, say_why=True)
            if seed is not None and not holders:
                log.info("waiting for the rollout's seed to fetch the revision", extra={"digest": digest,
                                                                                        "seed": seed})
                holders = self.await_seed(seed, digest)
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
