"""``resident bridge``: run the CSI node plugin that delivers bundles to Pods.

Every flag has an environment variable, so the DaemonSet can configure it either way.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

DESCRIPTION = """\
Serve the CSI v1 Identity and Node services for driver bundles.resident.dev on a unix
socket. Pods mount bundles as inline ephemeral CSI volumes (volumeAttributes digest,
source, model; readOnly: true); the bridge fetches each revision into the node store
under --root, hardlinks it into a per-volume directory and bind-mounts that read-only
at kubelet's target. Leases and volume records live in SQLite under --root and survive
restarts: on start the bridge reconciles them with /proc/self/mountinfo.

With --deliveries it also watches BundleDelivery objects for --node-id and stages the
requested revisions into live volumes. With --registration-dir it serves kubelet's
plugin-registration socket itself (for clusters without node-driver-registrar), and with
--healthz-port an HTTP /healthz for kubelet's liveness probe that makes a CSI Probe call
to the bridge's own socket (for clusters without the livenessprobe sidecar).
"""


def env(name: str, default=None):
    return os.environ.get(name, default)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="resident bridge", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default=env("CSI_ENDPOINT", "unix:///csi/csi.sock"),
                   help="CSI socket, unix:///abs/path (env CSI_ENDPOINT; a stale socket file "
                        "is removed first)")
    p.add_argument("--node-id", default=env("NODE_NAME", env("KUBE_NODE_NAME")),
                   help="this node's name, returned by NodeGetInfo and used to pick "
                        "BundleDeliveries (env NODE_NAME)")
    p.add_argument("--root", type=Path,
                   default=Path(env("RESIDENT_BRIDGE_ROOT", "/var/lib/resident-bridge")),
                   help="directory for the store, volumes and bridge.db; one filesystem "
                        "(env RESIDENT_BRIDGE_ROOT)")
    p.add_argument("--metrics-port", type=int, default=int(env("RESIDENT_METRICS_PORT", "9810")),
                   help="port of /metrics on --metrics-address; -1 disables (env RESIDENT_METRICS_PORT)")
    p.add_argument("--metrics-address", default=env("RESIDENT_METRICS_ADDRESS", "127.0.0.1"),
                   help="address /metrics and /healthz bind (default 127.0.0.1)")
    p.add_argument("--healthz-port", type=int, default=int(env("RESIDENT_HEALTHZ_PORT", "-1")),
                   help="port of /healthz on --metrics-address, for kubelet's liveness probe: "
                        "each request makes a CSI Probe call to --endpoint with a 1 s deadline "
                        "and answers 200 when the bridge says ready, 500 with the reason when "
                        "it is not, fails or does not answer in time; the same port as "
                        "--metrics-port shares its listener; -1 (default) disables "
                        "(env RESIDENT_HEALTHZ_PORT)")
    p.add_argument("--authorize", choices=("api", "deny", "static", "allow-any"),
                   default=env("RESIDENT_BRIDGE_AUTHORIZE", "api"),
                   help="namespace authorization: 'api' reads ResidentModels (falls back to "
                        "'deny' without API access), 'static' reads --authorize-file, "
                        "'allow-any' is for conformance suites only")
    p.add_argument("--authorize-file", type=Path, default=env("RESIDENT_BRIDGE_AUTHORIZE_FILE"),
                   help='JSON {"namespace": ["sha256:...", ...]} for --authorize=static')
    p.add_argument("--pods-dir", type=Path,
                   default=Path(env("RESIDENT_BRIDGE_PODS_DIR", "/var/lib/kubelet/pods")),
                   help="kubelet's pods directory: publish and unpublish targets outside it are "
                        "refused (env RESIDENT_BRIDGE_PODS_DIR; set it for a non-default kubelet root)")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                   help="kubeconfig for API access (default: in-cluster service account)")
    p.add_argument("--deliveries", action="store_true",
                   default=env("RESIDENT_BRIDGE_DELIVERIES", "") in ("1", "true"),
                   help="watch BundleDeliveries for this node and stage them into live volumes")
    p.add_argument("--registration-dir", type=Path, default=env("RESIDENT_BRIDGE_REGISTRATION_DIR"),
                   help="serve kubelet plugin registration in DIR (e.g. /var/lib/kubelet/plugins_registry) "
                        "at bundles.resident.dev-<run>-reg.sock, a new name each run; earlier runs' "
                        "sockets are removed first, and this run's when it stops")
    p.add_argument("--kubelet-endpoint", default=env("RESIDENT_BRIDGE_KUBELET_ENDPOINT"),
                   help="CSI socket path as kubelet sees it, for registration (default --endpoint)")
    p.add_argument("--publish-wait", type=float, default=100.0,
                   help="seconds a publish waits for a fetch before answering ABORTED with "
                        "progress (kubelet's call lasts 120 s)")
    p.add_argument("--gc-high-water-percent", type=float,
                   default=float(env("RESIDENT_GC_HIGH_WATER_PERCENT", "0")) or None,
                   help="run store GC when the store's content exceeds this share (0-100) of its "
                        "filesystem's size: unleased revisions go, least recently used first "
                        "(the chart sets 70); with neither this nor --gc-high-water-bytes: no GC")
    p.add_argument("--gc-low-water-percent", type=float,
                   default=float(env("RESIDENT_GC_LOW_WATER_PERCENT", "0")) or None,
                   help="GC removes content until the store holds at most this share of the "
                        "filesystem (default 80%% of the high watermark)")
    p.add_argument("--gc-high-water-bytes", type=int,
                   default=int(env("RESIDENT_GC_HIGH_WATER_BYTES", "0")) or None,
                   help="the high watermark in bytes; overrides --gc-high-water-percent")
    p.add_argument("--gc-low-water-bytes", type=int,
                   default=int(env("RESIDENT_GC_LOW_WATER_BYTES", "0")) or None,
                   help="the low watermark in bytes; overrides --gc-low-water-percent")
    p.add_argument("--gc-interval", type=float, default=300.0,
                   help="seconds between GC passes (GC also runs after each unpublish, each new "
                        "revision published or staged, and a delivery that ran out of space)")
    p.add_argument("--delivery-retry-seconds", type=float, default=5.0,
                   help="seconds before a Failed BundleDelivery is staged again; doubled after "
                        "each failed attempt (a spec that cannot be staged is not retried)")
    p.add_argument("--delivery-retry-max-seconds", type=float, default=300.0,
                   help="the longest wait between two attempts of a Failed BundleDelivery")
    p.add_argument("--orphan-grace", type=float, default=600.0,
                   help="seconds after which a publish interrupted by a crash, whose Pod has "
                        "since been deleted, is released (needs API access)")
    p.add_argument("--source-proxy", default=env("RESIDENT_SOURCE_PROXY"),
                   help="http://host:port of an HTTP proxy the http(s) and OCI sources go through, "
                        "e.g. a pull-through cache (a Dragonfly dfdaemon) in front of the origin; the "
                        "API server and peers are reached directly (env RESIDENT_SOURCE_PROXY)")
    peers = p.add_argument_group(
        "peer delivery", "Serve this node's store to the other nodes' bridges and take a revision "
        "from the bridges that hold it before asking the origin; every chunk is checked against the "
        "manifest (docs/peer-delivery.md). On with --peer-port.")
    peers.add_argument("--peer-port", type=int, default=int(env("RESIDENT_PEER_PORT", "-1")),
                       help="port of the peer server, the same on every node; -1 (default) turns peer "
                            "delivery off (env RESIDENT_PEER_PORT)")
    peers.add_argument("--peer-address", default=env("POD_IP", "127.0.0.1"),
                       help="address the peer server binds: the bridge Pod's IP (env POD_IP)")
    peers.add_argument("--peer-namespace", default=env("POD_NAMESPACE"),
                       help="namespace of the bridge DaemonSet, where the other bridges are found "
                            "(env POD_NAMESPACE)")
    peers.add_argument("--peer-selector", default=env("RESIDENT_PEER_SELECTOR"),
                       help="label selector of the bridge Pods, e.g. app.kubernetes.io/component=bridge,"
                            "app.kubernetes.io/instance=RELEASE")
    peers.add_argument("--peer-account", default=env("RESIDENT_PEER_ACCOUNT"),
                       help="the only ServiceAccount served, system:serviceaccount:NAMESPACE:NAME: the "
                            "bridges' own (checked with a TokenReview)")
    peers.add_argument("--peer-token-file", type=Path,
                       default=Path(env("RESIDENT_PEER_TOKEN_FILE", "/var/run/secrets/resident/peer/token")),
                       help="this bridge's projected ServiceAccount token with audience "
                            "--peer-audience, presented to peers (read for each request: kubelet rotates it)")
    peers.add_argument("--peer-audience", default=env("RESIDENT_PEER_AUDIENCE", "peers.resident.dev"),
                       help="the audience of the tokens bridges present to each other")
    peers.add_argument("--peer-max-transfers", type=int, default=4,
                       help="answers to peers at once; more are told 503 (busy) and ask elsewhere")
    peers.add_argument("--peer-rate", type=float, default=0.0,
                       help="bytes per second sent to peers, over all answers (0: no limit)")
    p.add_argument("--log-level", default=env("RESIDENT_LOG_LEVEL", "INFO"),
                   help="DEBUG, INFO, WARNING or ERROR; logs are JSON lines on stderr")
    return p


def api_client(kubeconfig: str | None):
    """A kubernetes ApiClient, or None when no credentials are available."""
    from kubernetes import client, config
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        config.load_incluster_config()
        return client.ApiClient()
    except Exception as e:
        logging.getLogger("resident.bridge").warning(
            "no Kubernetes API access", extra={"error": str(e)})
        return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from bundle import jsonlog
    from bundle.stop_signals import StopSignals

    jsonlog.configure(args.log_level)
    log = logging.getLogger("resident.bridge")
    log.info("bridge starting", extra={"phase": "starting", "node": args.node_id})
    if not args.node_id:
        print("resident bridge: --node-id (or NODE_NAME) is required", file=sys.stderr)
        return 2
    if args.peer_port >= 0:
        missing = [f for f in ("peer_namespace", "peer_selector", "peer_account") if not getattr(args, f)]
        if missing:
            print(f"resident bridge: peer delivery (--peer-port) needs {', '.join('--' + m.replace('_', '-') for m in missing)}",
                  file=sys.stderr)
            return 2
    stop = StopSignals()
    sockets = bridge = None
    try:
        # First what kubelet dials, with only gRPC loaded: it can register the driver now,
        # and the volume calls it makes meanwhile wait for the bridge (sockets.py).
        from .sockets import Sockets
        sockets = Sockets(args.endpoint, args.node_id, args.registration_dir, args.kubelet_endpoint).start()
        from .peering import PeerSettings
        from .server import Bridge, BridgeConfig
        peers = None if args.peer_port < 0 else PeerSettings(
            address=args.peer_address, port=args.peer_port, namespace=args.peer_namespace,
            selector=args.peer_selector, account=args.peer_account, token_file=args.peer_token_file,
            audience=args.peer_audience, max_transfers=args.peer_max_transfers, rate=args.peer_rate)
        bridge = Bridge(BridgeConfig(
            endpoint=args.endpoint, node_id=args.node_id, root=args.root,
            authorize=args.authorize, authorize_file=args.authorize_file, connect_later=True,
            metrics_port=None if args.metrics_port < 0 else args.metrics_port,
            metrics_address=args.metrics_address,
            healthz_port=None if args.healthz_port < 0 else args.healthz_port,
            registration_dir=args.registration_dir,
            kubelet_endpoint=args.kubelet_endpoint, publish_wait_seconds=args.publish_wait,
            deliveries=args.deliveries, gc_high_water_bytes=args.gc_high_water_bytes,
            gc_low_water_bytes=args.gc_low_water_bytes, gc_interval_seconds=args.gc_interval,
            gc_high_water_percent=args.gc_high_water_percent,
            gc_low_water_percent=args.gc_low_water_percent,
            orphan_grace_seconds=args.orphan_grace,
            delivery_retry_seconds=args.delivery_retry_seconds,
            delivery_retry_max_seconds=args.delivery_retry_max_seconds,
            pods_dir=args.pods_dir, peers=peers, source_proxy=args.source_proxy or None), sockets=sockets)
        bridge.start()
        # Only now the Kubernetes client (seconds of imports); a publish waits for it.
        needs_api = args.authorize == "api" or args.deliveries or peers is not None
        bridge.connect(api_client(args.kubeconfig) if needs_api else None)
    except ValueError as e:
        print(f"resident bridge: {e}", file=sys.stderr)
        if bridge is not None:
            bridge.stop(grace=0)
        elif sockets is not None:
            sockets.stop(grace=0)
        return 2
    if bridge.metrics_port is not None:
        log.info("metrics", extra={"target": f"http://{args.metrics_address}:{bridge.metrics_port}/metrics"})
    if bridge.healthz_port is not None:
        log.info("liveness", extra={"target": f"http://{args.metrics_address}:{bridge.healthz_port}/healthz"})
    stop.wait()
    bridge.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
