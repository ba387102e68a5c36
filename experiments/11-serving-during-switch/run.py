"""Application traffic through a model's Service while its revision switches.

Resident is installed with its chart on the local node (kubelet, containerd, owners in
containers, cpu backend). Two ResidentModels serve side by side: ``solo`` (1 replica) and
``pair`` (2 replicas, maxUnavailable 1). During every sample a closed loop of 4 clients
calls the model at its Service's ClusterIP, each request on a new connection, so the
node's kube-proxy picks a ready owner for each (``localcluster.traffic``). Arms (n rounds,
order alternating each round), each a switch to a fresh revision with 0.5% of rows changed:

- ``in_place``:  ``solo``, strategy InPlace;
- ``reload_pair``: ``pair``, strategy Reload (owners drain and leave the endpoints one at a time);
- ``reload_solo``: ``solo``, strategy Reload (nowhere to drain to: 503 + Retry-After in the gap).

Per sample: requests and failed requests in the switch window (from the spec patch until
every owner is Ready on the new revision), connection resets among them and connections
refused apart (kube-proxy refuses a connection to a Service with no ready endpoint), p99
latency in the window and in the steady 3 s before it, the unavailable window (from the
first request not answered 200, a 503 from the owner or a connection error, to the last
one) and the owners' own reload time (``lastTransition.durations.ownerSeconds``), and
whether each answer's revision is one of the two. A 503 or a connection error makes the
client wait 50 ms before its next try, as a client honouring ``Retry-After`` would, only
sooner. ``python run.py [--rounds N] [--size-mib M] [--out D]``; results in ``<size>mib/``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

import benchkit  # noqa: E402

ARMS = {"in_place": ("solo", "InPlace"), "reload_pair": ("pair", "Reload"),
        "reload_solo": ("solo", "Reload")}
MODELS = {"solo": (1, 8080, 8000), "pair": (2, 8180, 8100)}   # replicas, control port, serving port
STEADY_SECONDS = 3.0


def p99(latencies: list[float]) -> float:
    values = sorted(latencies)
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))] if values else 0.0


def recompute(raw: dict) -> dict:
    out: dict = {"arms": {}, "ratios": {}}
    for arm in ARMS:
        samples = [s for s in raw["samples"] if s["arm"] == arm]
        out["arms"][arm] = {
            "failed_total": sum(s["failed"] for s in samples),
            "resets_total": sum(s["resets"] for s in samples),
            "requests_total": sum(s["requests"] for s in samples),
            "mixed_total": sum(s["foreign_revision"] for s in samples),
            # counted apart from resets since the switch to the ClusterIP; earlier raw.json lack it
            **({"refused_total": sum(s["refused"] for s in samples)}
               if all("refused" in s for s in samples) else {}),
            **{key: benchkit.stats([s[key] for s in samples])
               for key in ("window_p99_over_steady_p99", "window_seconds", "unavailable_seconds",
                           "owner_seconds")}}
    arms = out["arms"]
    out["ratios"]["in_place_window_p99_over_steady_p99"] = \
        arms["in_place"]["window_p99_over_steady_p99"]["median"]
    out["ratios"]["reload_solo_503_window_over_owner_reload"] = (
        arms["reload_solo"]["unavailable_seconds"]["median"] / arms["reload_solo"]["owner_seconds"]["median"])
    return out


def wait_until(what: str, probe):
    return benchkit.wait_until(what, probe, timeout=300.0, every=0.05)


def ready_endpoints(discovery, namespace: str, service: str) -> int:
    """How many ready endpoints the Service's EndpointSlices list (what kube-proxy follows)."""
    slices = discovery.list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}").items
    return sum(1 for s in slices for e in (s.endpoints or []) if e.conditions.ready)


def refused(answer) -> bool:
    """A connection refused: kube-proxy's answer for a Service with no ready endpoint (or
    an endpoint whose port is not open)."""
    return answer.status == 0 and "refused" in answer.error.lower()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None, help="default: <size>mib/ next to this script")
    args = ap.parse_args(argv)
    out = args.out or HERE / f"{args.size_mib}mib"

    from kubernetes import client

    from bundle.cpu_model import make_revision
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import CHUNK, BundleServer, Story, make_base, model_body
    from localcluster.traffic import ClosedLoop

    work = Path(tempfile.mkdtemp(prefix="resident-exp11-"))
    before = benchkit.machine()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)   # last, also when a round fails
        base, base_dir = make_base(work, args.size_mib * 2**20)   # every other revision derives from it
        cluster = stack.enter_context(LocalCluster())
        kubernetes_version = cluster.version
        # on this machine's loopback; the bridge's Pod reaches it at server.url, pushes use local_url
        server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
        server.push(base_dir)
        installation = install(cluster)
        cluster.kubectl("create", "namespace", "bench")
        cluster.wait_for_service_account("bench")
        stories, loads = {}, {}
        for name, (replicas, control, http) in MODELS.items():
            body = model_body(name, server.url, base, port=control)
            body["spec"].update(replicas=replicas, serving={"port": http})
            story = stories[name] = Story(cluster, "bench", name, installation.bridge_root)
            story.apply(body)
        discovery = client.DiscoveryV1Api(cluster.api_client())
        for name, story in stories.items():
            story.wait_ready(base)
            wait_until(f"{name} in its EndpointSlices",
                       lambda n=name: ready_endpoints(discovery, "bench", n) == MODELS[n][0])
            loads[name] = stack.enter_context(ClosedLoop(story.service_address(), name))
        live = {"dir": base_dir, "n": 0, "digest": base}

        def arm(name: str):
            model, strategy = ARMS[name]

            def once() -> dict:
                live["n"] += 1
                target = work / f"t{live['n']}"
                digest = make_revision(live["dir"], target, "rows", fraction=0.005, seed=100 + live["n"],
                                       chunk_size=CHUNK).digest
                server.push(target)
                story, load = stories[model], loads[model]
                old = story.get()["status"]["identity"]["bundle"]
                time.sleep(STEADY_SECONDS)
                t0 = time.monotonic()
                story.patch_spec({"bundle": {"source": server.url, "digest": digest},
                                  "transition": {"strategy": strategy}})
                rm = story.wait_ready(digest)
                wait_until("every owner Ready", lambda: story.get()["status"]["ready"]
                           == f"{MODELS[model][0]}/{MODELS[model][0]}")
                t1 = time.monotonic()
                time.sleep(0.5)   # let requests in flight at t1 finish
                window, steady = load.between(t0, t1), load.between(t0 - STEADY_SECONDS, t0)
                unavailable = [a for a in window if not a.ok]
                last = rm["status"]["lastTransition"]
                return {
                    "model": model, "strategy": last["strategy"], "result": last["result"],
                    "requests": len(window), "failed": sum(1 for a in window if not a.ok),
                    "errors": sorted({f"{a.status} {a.error[:80]}" for a in window if not a.ok})[:5],
                    "resets": sum(1 for a in window if a.status == 0 and not refused(a)),
                    "refused": sum(1 for a in window if refused(a)),
                    "retry_after_on_every_503": all(a.retry_after for a in window if a.status == 503),
                    "foreign_revision": sum(1 for a in window if a.ok and a.revision not in (old, digest)),
                    "window_seconds": round(t1 - t0, 4),
                    "window_p99_seconds": round(p99([a.end - a.start for a in window if a.ok]), 4),
                    "steady_p99_seconds": round(p99([a.end - a.start for a in steady if a.ok]), 4),
                    "window_p99_over_steady_p99": round(
                        p99([a.end - a.start for a in window if a.ok])
                        / max(p99([a.end - a.start for a in steady if a.ok]), 1e-6), 4),
                    "unavailable_seconds": round(max((a.end for a in unavailable), default=0.0)
                                                 - min((a.start for a in unavailable), default=0.0), 4),
                    "owner_seconds": last["durations"]["ownerSeconds"],
                }
            return once

        samples = benchkit.run_rounds(args.rounds, {name: arm(name) for name in ARMS})
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "clients": 4,
                      "kubernetes": kubernetes_version, "traffic": "ClusterIP (kube-proxy)",
                      "models": MODELS, "arms": ARMS, "steady_seconds": STEADY_SECONDS},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples}
    summary = recompute(raw)
    out.mkdir(parents=True, exist_ok=True)
    benchkit.write(out, raw, summary)
    for arm_name, figures in summary["arms"].items():
        print(f"{arm_name:<12} failed {figures['failed_total']}/{figures['requests_total']}, "
              f"resets {figures['resets_total']}, refused {figures.get('refused_total', '-')}")
    for name, value in summary["ratios"].items():
        print(f"{name:<45} {value:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
