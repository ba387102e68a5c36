"""``resident operator``: run the ResidentModel operator (kopf) until interrupted.

Equivalent to ``kopf run -m resident_operator`` plus JSON logs and a Prometheus endpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

# kopf ends the whole operator when a watch stream fails with an error it does not retry,
# e.g. a 404 from an API server that restarted and does not serve custom resources yet,
# and its shutdown can then hang (a watcher waits to re-authenticate after the
# authenticator stopped). The process therefore exits at most this long after kopf's
# cleanup, with status 1, and its supervisor (kubelet) starts it again: every model
# resumes from status.
EXIT_GRACE_SECONDS = 10.0

EPILOG = """\
The operator watches ResidentModels (resident.dev/v1alpha1) and, for each, keeps
spec.replicas one-card owner Pods with the bundle's CSI volume, reports status and
conditions, runs transitions when spec.bundle changes, and cleans up by UID.
It is event-driven: a model is looked at when its spec, one of its owner Pods, its token
Secret or one of its BundleDeliveries changes, or when an owner finishes a transition;
each step of a transition follows the previous one at once.

With --leader-elect, replicas elect one active operator through a Lease (docs/operator.md,
"High availability"); a standby takes over within about 17 s of the leader's death.

Installation settings come from the environment:
  RESIDENT_OWNER_IMAGE               owner image when spec.runtime.image is empty
  RESIDENT_OWNER_HOST                reach owners at this host instead of the Pod IP
  RESIDENT_OWNER_HOST_NETWORK        true: owner Pods use hostNetwork (local clusters)
  RESIDENT_OWNER_TIMEOUT_SECONDS     timeout of each call to an owner (default 2); an
                                     owner without an answer is OwnerUnresponsive
  RESIDENT_OWNER_CALLS               owner calls of passes in flight at once (default
                                     32); the probes of unresponsive owners have as
                                     many of their own
  RESIDENT_OWNER_CALLS_PER_MODEL     of them for one model (default 4)
  RESIDENT_OWNER_RECHECK_SECONDS     an owner that did not answer is asked again this
                                     often (default 5)
  RESIDENT_NODE_LOSS_TOLERATION_SECONDS
                                     owners tolerate their node's unreachable and
                                     not-ready NoExecute taints this long (default 10)
  RESIDENT_OWNER_SPREAD_TOPOLOGY_KEY default spread of a model's owners when it sets
                                     none (default kubernetes.io/hostname; empty: none)
  RESIDENT_OWNER_SPREAD_MAX_SKEW     its maxSkew (default 1)
  RESIDENT_OWNER_SPREAD_WHEN_UNSATISFIABLE
                                     ScheduleAnyway (default) or DoNotSchedule
  RESIDENT_RESYNC_SECONDS            safety resync of a settled model (default 300)
  RESIDENT_RESYNC_PASSES_PER_SECOND  the resyncs of all models together pass at most
                                     this many models a second; a due resync waits its
                                     turn (default 3)
  RESIDENT_SWEEP_SECONDS             cluster-wide sweep of labelled orphans (default 60)
  RESIDENT_SWEEP_SHARE               the share of the time the sweep may take: after a
                                     sweep of t seconds the next waits at least
                                     t / share (default 0.02)
  RESIDENT_SWEEP_BUDGET_SECONDS      the longest one sweep runs (default 20)
  RESIDENT_READINESS_PERIOD_SECONDS  owner readiness probe period (default 5)
  RESIDENT_OWNER_START_LIMIT_SECONDS the owner's startup probe asks every second, this
                                     long at most, before kubelet restarts it (default
                                     3600)
  RESIDENT_DELETE_GRACE_SECONDS      a deleted model stops waiting for a child this long
                                     after the child's deletion (default 300)
  RESIDENT_OWNER_NETWORK_POLICY      true: a NetworkPolicy per model admits its owners'
                                     control port only from the operator's Pods (default
                                     false; the chart turns it on) and needs:
  RESIDENT_OPERATOR_POD_LABELS       the operator's Pod labels, k=v,k=v
  RESIDENT_OPERATOR_NAMESPACE        the operator's namespace, or
  RESIDENT_OPERATOR_NAMESPACE_LABELS labels selecting it, k=v,k=v
Kubernetes credentials: KUBECONFIG / ~/.kube/config, else the in-cluster service account.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="resident operator", description=__doc__.splitlines()[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="watch this namespace (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="serve Prometheus /metrics on this port; 0 disables (default 9090)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the metrics server (default 127.0.0.1; 0.0.0.0 in a Pod)")
    p.add_argument("--liveness", default=None, metavar="URL",
                   help="kopf liveness endpoint, e.g. http://127.0.0.1:8081/healthz")
    p.add_argument("--leader-elect", action="store_true",
                   help="run kopf only while holding a coordination.k8s.io Lease, so that "
                        "several replicas can run with one active (the others wait as standbys)")
    p.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                   help="namespace of the Lease (default $POD_NAMESPACE, else default)")
    p.add_argument("--leader-election-id", default="resident-operator",
                   help="name of the Lease (default resident-operator)")
    p.add_argument("--log-format", choices=("json", "plain"), default="json",
                   help="json lines (default) or plain text")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from .settings import SettingsError, settings_from_env
    from .structured_logs import setup

    setup(logging.DEBUG if args.verbose else logging.INFO, args.log_format == "json")
    try:
        settings_from_env()
    except SettingsError as e:
        print(f"resident operator: {e}", file=sys.stderr)
        return 2
    import kopf
    from prometheus_client import start_http_server

    from . import handlers  # registers the handlers
    from .metrics import REGISTRY

    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host, registry=REGISTRY)
    handlers.EXIT_AFTER_CLEANUP_SECONDS = EXIT_GRACE_SECONDS
    leadership = None
    if args.leader_elect:
        from .kube import load_config
        from .leadership import Leadership, standby_liveness
        leadership = Leadership(load_config(), args.leader_election_namespace, args.leader_election_id)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        with standby_liveness(args.liveness, leadership.waiting_alive):
            if not leadership.acquire(stop):
                return 0   # stopped while waiting as a standby
        leadership.keep(stop)
        for sig in (signal.SIGTERM, signal.SIGINT):   # kopf installs its own handlers
            signal.signal(sig, signal.SIG_DFL)
    try:
        kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
                 liveness_endpoint=args.liveness)
    except Exception as e:  # noqa: BLE001 - reported, then the supervisor restarts us
        logging.getLogger("resident.operator").error(
            "the operator stopped on an error; exiting so that it is started again",
            exc_info=True, extra={"error": f"{type(e).__name__}: {e}"})
        return 1
    finally:
        if leadership is not None:
            stop.set()              # no renewal after the release
            leadership.release()
    return 0   # stopped by a signal


if __name__ == "__main__":
    sys.exit(main())
