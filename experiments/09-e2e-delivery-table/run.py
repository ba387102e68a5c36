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
and the other durations kept beside it: ``stagingSeconds`` (the bridge's own time),
``ownerSeconds`` (the owner's own transition, first token included) and
``overheadSeconds`` (the rest: the operator's share). ``spec_to_done_seconds`` is measured
by this script: from the spec patch until ``lastTransition`` names the new revision
(polled every 20 ms). After the arms, ``--lag-trials`` times an owner Pod is deleted and
the time until ``status.ready`` stops counting it is measured the same way.

Every revision is made from the live one and removed (its directory and its blobs on the
bundle server) once the model has moved past it, so the disk holds at most two
revisions besides the node's store, and the work directory goes also when a run fails.
The chart's default GC watermarks keep the node's store itself bounded. ``python run.py [--rounds N] [--size-mib M] [--out D]``;
results go to ``<size>mib/raw.json`` and ``summary.json``.
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


PARTS = ("deliver_seconds", "apply_seconds", "first_token_seconds", "staging_seconds",
         "owner_seconds", "overhead_seconds", "spec_to_done_seconds", "fetched", "written")


def recompute(raw: dict) -> dict:
    summary = benchkit.summarize(raw["samples"], "total_seconds", RATIOS)
    for part in PARTS:
        if all(part in s for s in raw["samples"]):
            summary[part] = {arm: benchkit.stats([s[part] for s in raw["samples"] if s["arm"] == arm])["median"]
                             for arm in ARMS}
    summary["deliver_ratios"] = benchkit.summarize(raw["samples"], "deliver_seconds", RATIOS)["ratios"]
    if all("staging_seconds" in s for s in raw["samples"]):
        summary["staging_ratios"] = benchkit.summarize(raw["samples"], "staging_seconds", RATIOS)["ratios"]
    lags = sorted(raw.get("status_lag_seconds") or [])
    if lags:
        summary["status_lag"] = {"n": len(lags), "median": benchkit.stats(lags)["median"],
                                 "p95": lags[min(len(lags) - 1, round(0.95 * (len(lags) - 1)))],
                                 "max": lags[-1]}
    return summary


# Where a transition's time goes, per sample; the four add up to total_seconds exactly
# (the operator's share is defined as the rest: transition_summary.py).
PHASES = {
    "bridge stages the revision": lambda s: s["staging_seconds"],
    "owner applies it": lambda s: s["owner_seconds"] - s["first_token_seconds"],
    "owner's first token": lambda s: s["first_token_seconds"],
    "operator's share": lambda s: s["overhead_seconds"],
}


def draw(raw: dict, folder: Path) -> list[Path]:
    """phases.png (each arm's time, stacked by phase) and bytes.png (fetched against reused)
    from raw.json; a run from before the phases were recorded gets its totals instead."""
    import plots
    samples, summary = raw["samples"], recompute(raw)
    arms = list(ARMS)
    config = raw["config"]
    where = f"{config['size_mib']} MiB, {'XFS' if config.get('store_fs') == 'xfs' else 'ext4'} store"
    n = min(st["n"] for st in summary["arms"].values())
    median = lambda arm, value: benchkit.stats([value(s) for s in samples if s["arm"] == arm])["median"]  # noqa: E731
    if all("staging_seconds" in s for s in samples):
        timing = plots.phases(
            folder / "phases.png", f"09: spec change to first token, by phase ({where})", arms,
            {label: [median(arm, value) for arm in arms] for label, value in PHASES.items()},
            [summary["arms"][arm] for arm in arms],
            plots.footnote(raw, f"n = {n} per arm, alternating; segments: median of each phase; "
                                "dot and whisker: median and IQR of the total"))
    else:
        timing = plots.medians(
            folder / "totals.png", f"09: spec change to first token ({where}, 1 s tick operator)",
            [("seconds", {arm: summary["arms"][arm] for arm in arms})],
            plots.footnote(raw, f"n = {n} per arm, alternating; bars: medians, whiskers: IQR"))
    moved = plots.fetched_reused(
        folder / "bytes.png", f"09: bytes per switch ({where})",
        {arm: (median(arm, lambda s: s["fetched"]), median(arm, lambda s: s["reused"])) for arm in arms},
        plots.footnote(raw, f"n = {n} per arm, medians; reused: bytes the node's store already held"))
    return [timing, moved]


def wait_until(what: str, probe):
    return benchkit.wait_until(what, probe, timeout=600.0, every=0.02)


def drop_revision(directory: Path, served_root: Path, keep: Path) -> None:
    """Remove a revision's directory and the blobs on the bundle server only it used."""
    from bundle.scan import read_manifest
    kept = {f.sha256 for f in read_manifest(keep).files}
    for f in read_manifest(directory).files:
        if f.sha256 not in kept:
            (served_root / "blobs" / f"sha256-{f.sha256}").unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def status_lag(story, trials: int) -> list[float]:
    """Delete the owner Pod; seconds until status.ready stops counting it. Ready again between."""
    lags = []
    for _ in range(trials):
        rm = story.wait("Ready", lambda rm: rm.get("status", {}).get("phase") == "Ready")
        pod = story.core.list_namespaced_pod(story.namespace, label_selector=f"resident.dev/model={story.name}").items
        live = [p for p in pod if not p.metadata.deletion_timestamp]
        t0 = time.monotonic()
        story.core.delete_namespaced_pod(live[0].metadata.name, story.namespace)
        wait_until("ready 0/1", lambda: story.get()["status"].get("ready") == "0/1")
        lags.append(round(time.monotonic() - t0, 4))
        story.wait_ready(rm["status"]["identity"]["bundle"])
    return lags


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--lag-trials", type=int, default=10)
    ap.add_argument("--store-fs", choices=("root", "xfs"), default="root",
                    help="the bridge's node store: on the root filesystem, or on an XFS loop "
                         "filesystem with reflink (sized for the run, removed at the end)")
    ap.add_argument("--out", type=Path, default=None, help="default: <size>mib/ next to this script")
    args = ap.parse_args(argv)
    out = args.out or HERE / (f"{args.size_mib}mib" + ("-xfs" if args.store_fs == "xfs" else ""))

    from bundle.cpu_model import make_revision
    from bundle.loopfs import loop_filesystem
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import CHUNK, BundleServer, Story, make_base, model_body

    work = Path(tempfile.mkdtemp(prefix="resident-exp09-"))
    machine_before = benchkit.machine()
    try:  # the revisions it generates are large: removed also when a run fails
        base, base_dir = make_base(work, args.size_mib * 2**20)   # every other revision derives from it
        store_size = (8 * args.rounds + 4) * args.size_mib * 2**20   # reconstructs write whole revisions
        with contextlib.ExitStack() as stack:
            store = (stack.enter_context(loop_filesystem("xfs", store_size)) if args.store_fs == "xfs"
                     else None)
            cluster = stack.enter_context(LocalCluster())
            kubernetes_version = cluster.version
            # the bundle server listens on this machine's loopback; the bridge's Pod reaches it
            # at the address the cluster knows it by (server.url), pushes go to local_url
            server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
            server.push(base_dir)
            installation = install(cluster, bridge_root=store)
            cluster.kubectl("create", "namespace", "bench")
            cluster.wait_for_service_account("bench")
            story = Story(cluster, "bench", "bench", installation.bridge_root)
            story.apply(model_body("bench", server.url, base))
            story.wait_ready(base)
            live = {"dir": base_dir, "n": 0}

            def arm(name: str):
                kind, delivery, strategy = ARMS[name]

                def once() -> dict:
                    live["n"] += 1
                    target = work / f"t{live['n']}"
                    digest = make_revision(live["dir"], target, kind, fraction=0.005, seed=100 + live["n"],
                                           chunk_size=CHUNK).digest
                    server.push(target)
                    t0 = time.monotonic()
                    story.patch_spec({"bundle": {"source": server.url, "digest": digest},
                                      "delivery": delivery, "transition": {"strategy": strategy}})
                    last = wait_until("done", lambda: (
                        (story.get()["status"].get("lastTransition") or {}).get("to") == digest
                        and story.get()["status"]["lastTransition"]))
                    spec_to_done = time.monotonic() - t0
                    story.wait_ready(digest)
                    drop_revision(live["dir"], work / "served", keep=target)
                    live["dir"] = target
                    d, b = last["durations"], last["bytes"]
                    return {"total_seconds": d["totalSeconds"], "deliver_seconds": d["deliverSeconds"],
                            "apply_seconds": d["applySeconds"], "first_token_seconds": d["firstTokenSeconds"],
                            "staging_seconds": d["stagingSeconds"], "owner_seconds": d["ownerSeconds"],
                            "overhead_seconds": d["overheadSeconds"], "spec_to_done_seconds": round(spec_to_done, 4),
                            "fetched": b["fetched"], "reused": b["reused"], "written": b["written"],
                            "path": last["path"], "method": last["method"], "strategy": last["strategy"],
                            "result": last["result"]}
                return once

            samples = benchkit.run_rounds(args.rounds, {name: arm(name) for name in ARMS})
            lags = status_lag(story, args.lag_trials)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "chunk_bytes": CHUNK,
                      "store_fs": args.store_fs, "kubernetes": kubernetes_version,
                      "arms": {k: list(v[:1]) + [v[1], v[2]] for k, v in ARMS.items()}},
           **benchkit.provenance(machine_before, benchkit.machine()),
           "samples": samples, "status_lag_seconds": lags}
    summary = recompute(raw)
    out.mkdir(parents=True, exist_ok=True)
    benchkit.write(out, raw, summary, draw)
    for name, value in summary["ratios"].items():
        print(f"{name:<30} {value:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
