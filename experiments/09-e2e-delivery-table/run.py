"""The delivery table on the local single-node cluster: demand to first token, per path and strategy.

Resident is installed with its chart on a real node (kubelet, containerd, the bridge as a
DaemonSet Pod, owners in containers, cpu backend). One ResidentModel is driven through
transitions; every transition goes to a fresh revision derived from the live one, so
nothing is already on the node. Arms (n rounds, order alternating each round):

- ``graph_only``:  graph file changed; path GraphOnly; reload (a graph change cannot be in place)
- ``reconstruct``: 0.5% of rows changed; WholeBundle, rebase Never; reload
- ``rebase``:      0.5% of rows changed; WholeBundle, rebase Auto; reload
- ``in_place``:    0.5% of rows changed; Auto delivery (rebase); in place
- ``reload``:      0.5% of rows changed; Auto delivery (rebase); reload

The figure per sample is ``status.lastTransition.durations.totalSeconds`` (the operator's
wall clock from planning to the owner's first token on the new revision), with the bytes
and the other durations kept beside it. ``python run.py [--rounds N] [--size-mib M]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))  # the repository: charts/ (Helm) is not installed

import benchkit  # noqa: E402

ARMS = {
    "graph_only": ("graph", {"mode": "Auto", "rebase": "Auto"}, "Auto"),
    "reconstruct": ("rows", {"mode": "WholeBundle", "rebase": "Never"}, "Reload"),
    "rebase": ("rows", {"mode": "WholeBundle", "rebase": "Auto"}, "Reload"),
    "in_place": ("rows", {"mode": "Auto", "rebase": "Auto"}, "InPlace"),
    "reload": ("rows", {"mode": "Auto", "rebase": "Auto"}, "Reload"),
}
RATIOS = {
    "reconstruct_over_graph_only": ("reconstruct", "graph_only"),
    "reconstruct_over_rebase": ("reconstruct", "rebase"),
    "reload_over_in_place": ("reload", "in_place"),
}


def recompute(raw: dict) -> dict:
    summary = benchkit.summarize(raw["samples"], "total_seconds", RATIOS)
    for part in ("deliver_seconds", "apply_seconds", "first_token_seconds", "fetched", "written"):
        summary[part] = {arm: benchkit.stats([s[part] for s in raw["samples"] if s["arm"] == arm])["median"]
                         for arm in ARMS}
    summary["deliver_ratios"] = benchkit.summarize(raw["samples"], "deliver_seconds", RATIOS)["ratios"]
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=64)
    args = ap.parse_args(argv)

    from bundle.demo import make_revision
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import CHUNK, BundleServer, Story, make_bundles, model_body

    work = Path(tempfile.mkdtemp(prefix="resident-exp09-"))
    revs, dirs = make_bundles(work, args.size_mib * 2**20)
    with LocalCluster() as cluster, BundleServer(work / "served", work / "logs") as server:
        server.push(dirs["a"])
        installation = install(cluster)
        cluster.kubectl("create", "namespace", "bench")
        cluster.wait_for_service_account("bench")
        story = Story(cluster, "bench", "bench", installation.bridge_root)
        story.apply(model_body("bench", server.url, revs.a))
        story.wait_ready(revs.a)
        live = {"dir": dirs["a"], "n": 0}

        def arm(name: str):
            kind, delivery, strategy = ARMS[name]

            def once() -> dict:
                live["n"] += 1
                target = work / f"t{live['n']}"
                digest = make_revision(live["dir"], target, kind, fraction=0.005, seed=100 + live["n"],
                                       chunk_size=CHUNK).digest
                server.push(target)
                last = story.transition({"bundle": {"source": server.url, "digest": digest},
                                         "delivery": delivery, "transition": {"strategy": strategy}})
                live["dir"] = target
                d, b = last["durations"], last["bytes"]
                return {"total_seconds": d["totalSeconds"], "deliver_seconds": d["deliverSeconds"],
                        "apply_seconds": d["applySeconds"], "first_token_seconds": d["firstTokenSeconds"],
                        "fetched": b["fetched"], "reused": b["reused"], "written": b["written"],
                        "path": last["path"], "method": last["method"], "strategy": last["strategy"],
                        "result": last["result"]}
            return once

        samples = benchkit.run_rounds(args.rounds, {name: arm(name) for name in ARMS})
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "chunk_bytes": CHUNK,
                      "arms": {k: list(v[:1]) + [v[1], v[2]] for k, v in ARMS.items()}},
           "samples": samples}
    summary = recompute(raw)
    benchkit.write(HERE, raw, summary)
    for name, value in summary["ratios"].items():
        print(f"{name:<30} {value:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
