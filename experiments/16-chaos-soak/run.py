"""A chaos soak on the local 3-node cluster (issue 31): models under load, switches at
random and a fault every 10-30 s from a seeded schedule, then figures and leak checks.

Resident is installed with its chart on a 3-node LocalCluster. Four models (cpu backend,
16 MiB demo revisions A-D on the bundle server), in four namespaces, two with one replica
and two with two; one client per model calls its Service all the time. Everything the
soak does is :class:`localcluster.chaos.Soak`: the driver's switches (Auto, whole-bundle
reload, lockstep, staged, rollback, scale), the faults (owner deleted or hung, bridge or
operator killed, source down, a node powered off or cut off and back, a node store filled
beyond the GC's high watermark, which the bridges collect against, 192 MiB), and the checks.

``python run.py [--minutes 10|60] [--seed N] [--isolated] [--out D]``; ``--isolated``
makes each fault wait until the one before has recovered (then its gap), so each recovery
time is one fault's alone; ``--replay FOLDER/raw.json`` runs the soak of that record again
(its seed, duration, mode and fault kinds: the same faults in the same order). Results go to
``<minutes>min-seed<N>[-isolated]/raw.json`` and ``summary.json``;
``verify.py`` recomputes the summary from raw.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))  # the repository: charts/ (Helm) is not installed

import benchkit  # noqa: E402

SIZE_MIB = 16
NODES = 3
MODELS = 4
# the bridges collect against this budget (every 10 s), so a store-filled fault can fill a
# node store beyond it: the revisions live on a node lease at most 4 x 16 MiB of it
STORE_HIGH_BYTES = 192 << 20
# a leader and a standby (leader election is the chart's default): the operator
# faults kill either; with one replica, kubelet's doubling crash-loop back-off decides when
# an operator killed again and again comes back (up to 80 s in the fourth hour)
OPERATOR_REPLICAS = 2
# issue 31's targets for the full (60-minute) form: stated, not claimed; summary.json says whether met.
# The recovery target is for every fault kind but the API server's and etcd's (reported only).
TARGETS = {"stuck_switches": 0, "leaks": 0, "defect_requests": 0, "recovery_p95_seconds": 30.0}


def recompute(raw: dict) -> dict:
    from localcluster.chaos import CONTROL_PLANE_FAULTS, summarize
    summary = summarize(raw)
    p95 = max((v["p95"] for kind, v in summary["recovery_seconds"].items()
               if v["p95"] is not None and kind not in CONTROL_PLANE_FAULTS), default=0.0)
    found = {"stuck_switches": summary["switches"]["stuck"], "leaks": summary["leaks"],
             "defect_requests": summary["requests"]["defect"], "recovery_p95_seconds": p95}
    summary["targets"] = {name: {"target": want, "value": found[name], "met": found[name] <= want}
                          for name, want in TARGETS.items()}
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10, help="how long faults are made (10 quick, 60 full)")
    ap.add_argument("--seed", type=int, default=31, help="the schedule's and the driver's seed")
    ap.add_argument("--isolated", action="store_true",
                    help="each fault waits until the one before has recovered, then its gap")
    ap.add_argument("--kinds", help="only these fault kinds, comma-separated (e.g. store-filled,kubelet-killed): "
                                    "to look at one kind; default every kind")
    ap.add_argument("--replay", type=Path, help="a raw.json whose seed, duration and mode to run again")
    ap.add_argument("--out", type=Path, default=None, help="default: <minutes>min-seed<seed>/ next to this script")
    args = ap.parse_args(argv)
    kinds = tuple(args.kinds.split(",")) if args.kinds else None   # None: every kind the cluster allows
    if args.replay:
        old = json.loads(args.replay.read_text())
        args.seed, args.minutes = old["seed"], old["duration_seconds"] / 60
        args.isolated, kinds = old.get("isolated", False), tuple(old["kinds"])
    out = args.out or HERE / f"{args.minutes:g}min-seed{args.seed}{'-isolated' if args.isolated else ''}"

    from localcluster.chaos import Soak
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import BundleServer, make_bundles

    work = Path(tempfile.mkdtemp(prefix="resident-exp16-"))
    before = benchkit.machine()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        revs, dirs = make_bundles(work, SIZE_MIB * 2**20)
        cluster = stack.enter_context(LocalCluster(nodes=NODES))
        server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
        for d in dirs.values():
            server.push(d)
        installation = install(cluster, bridge_values={
            "gc": {"enabled": True, "highWaterBytes": STORE_HIGH_BYTES, "intervalSeconds": 10}},
            operator_values={"replicas": OPERATOR_REPLICAS})
        soak = Soak(cluster, installation, server, [revs.a, revs.b, revs.c, revs.d], seed=args.seed,
                    duration=args.minutes * 60, models=MODELS, isolated=args.isolated, kinds=kinds,
                    store_high_bytes=STORE_HIGH_BYTES)
        record = soak.run()
        kubernetes_version = cluster.version
    raw = {"config": {"minutes": args.minutes, "size_mib": SIZE_MIB, "nodes": NODES, "models": MODELS,
                      "store_high_mib": STORE_HIGH_BYTES >> 20, "operator_replicas": OPERATOR_REPLICAS,
                      "kubernetes": kubernetes_version},
           **benchkit.provenance(before, benchkit.machine()), **record}
    summary = recompute(raw)
    out.mkdir(parents=True, exist_ok=True)
    benchkit.write(out, raw, summary)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
