"""The bridge process: one object that owns the store, the state, the servers and the watch.

``Bridge(config)`` opens the node store (``<root>/store``), the bridge database
(``<root>/bridge.db``) and the volume directories (``<root>/volumes``), all on one
filesystem so revision trees can be hardlinks. ``start()`` serves kubelet's sockets
(:mod:`.sockets`, unless the caller already does: the process entry point serves them
before it imports the rest), reconciles, then hands the sockets the Node service; then
``/metrics`` and ``/healthz`` (:mod:`.endpoints`, on 127.0.0.1 unless told otherwise).
``connect(api_client)`` then adds what needs the API server: namespace authorization,
the orphan sweep, peers and the BundleDelivery watch. ``start()`` calls it itself with
the config's client (None: no API access); with ``connect_later`` the caller does, after kubelet could
already register the driver (importing the Kubernetes client takes seconds, and a mount
kubelet tries before the driver is registered fails and doubles its wait). ``stop()``
stops everything in reverse order; mounts stay (they belong to the Pods).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import endpoints
from .authorization import Authorizer, AwaitedPolicy, make_authorizer
from .collection import Collector
from .liveness import LivenessCheck
from .locks import VolumeLocks
from .metrics import BridgeMetrics
from .node import NodeServicer
from .peering import PeerSettings, Peering
from .publisher import Publisher
from .reconcile import Report, reconcile
from .sockets import Sockets
from .state import BridgeState

log = logging.getLogger("resident.bridge")


@dataclass
class BridgeConfig:
    endpoint: str                       # unix:///path/csi.sock
    node_id: str
    root: Path                          # store, volumes and bridge.db live here
    authorize: str = "api"              # api | deny | static | allow-any
    authorize_file: Path | None = None
    api_client: object = None           # kubernetes ApiClient, for authorize=api and deliveries
    connect_later: bool = False         # serve first; the client comes through connect()
    metrics_port: int | None = None     # None: no /metrics server; 0: any free port
    metrics_address: str = "127.0.0.1"  # /metrics and /healthz bind it
    healthz_port: int | None = None     # None: no /healthz; the same port as metrics shares it
    registration_dir: Path | None = None  # serve <dir>/<driver>-<run>-reg.sock when set
    kubelet_endpoint: str | None = None   # the CSI path kubelet should dial (GetInfo)
    publish_wait_seconds: float = 100.0
    deliveries: bool = False            # watch BundleDeliveries (needs api_client)
    private_metrics: bool = False       # own registry (several bridges in one process)
    workers: int = 8
    gc_high_water_bytes: int | None = None  # None (and no percent): no GC
    gc_low_water_bytes: int | None = None   # default 80% of high
    gc_high_water_percent: float | None = None  # of the store filesystem's size; bytes win
    gc_low_water_percent: float | None = None
    gc_interval_seconds: float = 300.0
    orphan_grace_seconds: float = 600.0   # half-publishes of deleted Pods (needs api_client)
    delivery_retry_seconds: float = 5.0   # first wait before a Failed delivery is staged again
    delivery_retry_max_seconds: float = 300.0  # the doubling waits stop growing here
    pods_dir: Path | None = None          # targets must lie under it (kubelet's pods dir); None: anywhere
    peers: PeerSettings | None = None     # serve the store to peers and take revisions from them
    source_proxy: str | None = None       # http(s) and OCI sources go through this HTTP proxy
    extra: dict = field(default_factory=dict)


class Bridge:
    def __init__(self, config: BridgeConfig, sockets: Sockets | None = None):
        from functools import partial

        from bundle.sources import open_source
        from bundle.store import Store
        from prometheus_client import REGISTRY, CollectorRegistry

        self.config = c = config
        self.sockets = sockets or Sockets(c.endpoint, c.node_id, c.registration_dir, c.kubelet_endpoint,
                                          c.workers)
        self.socket = self.sockets.socket
        c.root = Path(c.root)
        c.root.mkdir(parents=True, exist_ok=True)
        self.store = Store(c.root / "store")
        self.state = BridgeState(c.root / "bridge.db")
        self.volumes_root = c.root / "volumes"
        self.volumes_root.mkdir(exist_ok=True)
        self.metrics = BridgeMetrics(CollectorRegistry() if c.private_metrics else REGISTRY)
        self.metrics.watch(lambda: len(self.store.leases()),
                           lambda: len(self.state.publications("state='published'")))
        self.authorizer: Authorizer = (
            AwaitedPolicy(c.authorize) if c.connect_later and c.authorize == "api"
            else make_authorizer(c.authorize, api_client=c.api_client, static_file=c.authorize_file))
        self.locks = VolumeLocks()
        self.publisher = Publisher(self.store, self.state, self.volumes_root, self.authorizer,
                                   self.metrics, self.locks, partial(open_source, proxy=c.source_proxy),
                                   protected_dirs=(c.root, c.pods_dir))
        self.collector = Collector(self.store, c.gc_high_water_bytes, c.gc_low_water_bytes,
                                   c.gc_interval_seconds, c.gc_high_water_percent,
                                   c.gc_low_water_percent,
                                   on_failure=self.metrics.gc_failures.inc)
        self.publisher.gc_guard = self.collector.guard
        self.publisher.collect = self.collector.collect
        self.metrics.watch_store(self.store, self.collector)
        self.node = NodeServicer(self.publisher, c.publish_wait_seconds, c.pods_dir)
        self.reconciled: Report | None = None
        self.liveness: LivenessCheck | None = None
        self.listeners: dict[str, endpoints.Listener] = {}  # path → its HTTP listener
        self.watcher = None
        self.sweeper = None
        self.peering: Peering | None = None

    @property
    def metrics_port(self) -> int | None:
        return self.listeners["/metrics"].port if "/metrics" in self.listeners else None

    @property
    def healthz_port(self) -> int | None:
        return self.listeners["/healthz"].port if "/healthz" in self.listeners else None

    def health(self) -> str | None:
        """None when usable; otherwise why not (store or database unusable)."""
        root = self.store.root
        if not root.is_dir() or not os.access(root, os.W_OK | os.X_OK):
            return f"store {root} is missing or not writable"
        if not (root / "blobs").is_dir() or not (root / "revisions").is_dir():
            return f"store {root} is missing its blobs/ or revisions/ directory"
        try:
            self.state.ping()
        except Exception as e:
            return f"bridge database unusable: {e}"
        return None

    def start(self) -> "Bridge":
        c = self.config
        if not self.sockets.serving:
            self.sockets.start()
        self.reconciled = reconcile(self.publisher, self.state, self.volumes_root)
        self.sockets.attach(self.node, self.health, self.metrics)
        http: dict[str, tuple[int, endpoints.App]] = {}
        if c.metrics_port is not None:
            from prometheus_client import make_wsgi_app
            http["/metrics"] = (c.metrics_port, make_wsgi_app(self.metrics.registry))
        if c.healthz_port is not None:
            self.liveness = LivenessCheck(self.socket)
            http["/healthz"] = (c.healthz_port, self.liveness.app)
        self.listeners = endpoints.serve(c.metrics_address, http)
        self.collector.start()
        log.info("bridge serving", extra={"target": str(self.socket), "phase": "started",
                                          "gc_watermarks_bytes": self.collector.watermarks(),
                                          "gc_high_water_percent": self.collector.high_percent})
        if not c.connect_later:
            self.connect(c.api_client)
        return self

    def connect(self, api_client) -> None:
        """Start what needs the API server; None: no access (authorization fails closed)."""
        c = self.config
        if c.peers is not None and api_client is None:
            raise ValueError("peer delivery needs API access (a kubeconfig)")
        if c.deliveries and api_client is None:
            raise ValueError("watching BundleDeliveries needs API access (a kubeconfig)")
        if api_client is not None:
            from .sweep import OrphanSweeper
            self.sweeper = OrphanSweeper(self.publisher, self.state, self.locks, api_client,
                                         grace_seconds=c.orphan_grace_seconds)
            self.sweeper.start()
        if c.peers is not None:
            self.peering = self.publisher.peering = Peering(self.store, api_client, c.node_id, c.peers,
                                                            self.metrics).start()
        if c.deliveries:
            from .deliveries import DeliveryWatcher
            from .retries import Backoff
            self.watcher = DeliveryWatcher(self, api_client, backoff=Backoff(
                c.delivery_retry_seconds, c.delivery_retry_max_seconds))
            self.watcher.start()
        if isinstance(self.authorizer, AwaitedPolicy):   # last: a waiting publish finds peers
            if api_client is None:
                log.warning("namespace authorization falls back to deny: every publish is refused")
            self.authorizer.arrive(make_authorizer("api", api_client=api_client))
        if c.connect_later:
            log.info("bridge connected", extra={"phase": "connected", "api": api_client is not None})

    def stop(self, grace: float = 2.0) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.peering is not None:
            self.peering.stop()
        self.collector.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
        for listener in set(self.listeners.values()):
            listener.close()
        self.listeners = {}
        if self.liveness is not None:
            self.liveness.close()
        self.sockets.stop(grace)
        self.state.close()

    def __enter__(self) -> "Bridge":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
