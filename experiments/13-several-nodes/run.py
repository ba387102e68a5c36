"""Three nodes against one, and a lost node, on the local 3-node cluster (#25).

Resident is installed with its chart on a 3-node LocalCluster. Two 3-replica models of the
same size serve side by side: ``spread`` (one owner per node, the chart's default spread)
and ``packed`` (all three owners on node-0, by a nodeSelector). Arms, n rounds, order
alternating each round:

- ``spread_switch``: ``spread`` switches to a fresh revision (0.5% of rows changed) as a
  whole bundle with a reload: every node's bridge rebases on what it holds and fetches
  what it lacks from the origin;
- ``packed_switch``: the same switch for ``packed``: one bridge, three owners;
- ``node_loss``: a node that runs a ``spread`` owner and not the operator is powered off;
  measured until ``spread`` has three ready owners on the other nodes again and answers
  through its Service (full strength), then the node is powered on, the old owner's Pod
  is gone, and ``spread`` is rebalanced (the owner doubled up on one node is replaced, so
  the spread puts it back on the returned node) for the next round.

Per switch sample: wall time from the spec patch to every owner Ready on the new revision,
``lastTransition.totalSeconds``, and the bytes fetched from the origin, reused and written
per node (``lastTransition.nodes``). Per loss sample: seconds to full strength, to the
model naming the lost node, and the node lifecycle controller's part (seconds to the Node's
Ready turning Unknown). ``python run.py [--rounds N] [--size-mib M] [--out D]``; results
in ``<size>mib/``. Generated bundles are removed at the end (and as each revision is
superseded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

import benchkit  # noqa: E402

NODES = ["node-0", "node-1", "node-2"]
MODELS = {"spread": (8080, 8000), "packed": (8180, 8100)}   # control port, serving port
SWITCH_ARMS = {"spread_switch": "spread", "packed_switch": "packed"}


def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    out: dict = {"arms": {}, "ratios": {}}
    for arm in SWITCH_ARMS:
        mine = [s for s in samples if s["arm"] == arm]
        out["arms"][arm] = {key: benchkit.stats([s[key] for s in mine])
                            for key in ("wall_seconds", "fetched_mib_total", "fetched_mib_per_node_max")}
    loss = [s for s in samples if s["arm"] == "node_loss"]
    out["arms"]["node_loss"] = {key: benchkit.stats([s[key] for s in loss])
                                for key in ("full_strength_seconds", "named_seconds", "node_unknown_seconds")}
    arms = out["arms"]
    out["ratios"]["spread_over_packed_wall"] = (arms["spread_switch"]["wall_seconds"]["median"]
                                                / arms["packed_switch"]["wall_seconds"]["median"])
    packed_fetched = arms["packed_switch"]["fetched_mib_total"]["median"]
    out["ratios"]["spread_over_packed_fetched_total"] = (
        arms["spread_switch"]["fetched_mib_total"]["median"] / packed_fetched if packed_fetched else None)
    return out


# A lost node's recovery, per sample, as consecutive stretches that add up to full strength.
LOSS_STRETCHES = {
    "until the Node turns Unknown": lambda s: s["node_unknown_seconds"],
    "until the model names the node": lambda s: s["named_seconds"] - s["node_unknown_seconds"],
    "until 3 owners serve elsewhere": lambda s: s["full_strength_seconds"] - s["named_seconds"],
}


def draw(raw: dict, folder: Path) -> list[Path]:
    """switch.png (spread against packed: time and bytes from the origin), bytes.png
    (what each node's bridge fetched and reused) and node-loss.png, from raw.json."""
    import plots
    samples, arms = raw["samples"], recompute(raw)["arms"]
    size = f"{raw['config']['size_mib']} MiB"
    n = arms["spread_switch"]["wall_seconds"]["n"]
    median = lambda values: benchkit.stats(list(values))["median"]  # noqa: E731
    switch = plots.medians(
        folder / "switch.png", f"13: a 3-replica model switches ({size}): 3 nodes (spread) or 1 (packed)",
        [("spec patch to every owner Ready, s", {a: arms[a]["wall_seconds"] for a in SWITCH_ARMS}),
         ("fetched from the origin, all nodes, MiB", {a: arms[a]["fetched_mib_total"] for a in SWITCH_ARMS})],
        plots.footnote(raw, f"n = {n} per arm, alternating; bars: medians, whiskers: IQR"))
    rows = {}
    for arm in SWITCH_ARMS:
        mine = [s for s in samples if s["arm"] == arm]
        for node in sorted({row["node"] for s in mine for row in s["nodes"]}):
            here = [row for s in mine for row in s["nodes"] if row["node"] == node]
            rows[f"{arm} {node} ({here[0]['owners']} owner{'s' if here[0]['owners'] > 1 else ''})"] = (
                median(r["fetched"] for r in here), median(r["reused"] for r in here))
    moved = plots.fetched_reused(
        folder / "bytes.png", f"13: bytes each node's bridge moved per switch ({size})", rows,
        plots.footnote(raw, f"n = {n} per arm, medians; reused: bytes the node's store already held"))
    loss = [s for s in samples if s["arm"] == "node_loss"]
    recovery = plots.phases(
        folder / "node-loss.png", f"13: a node running an owner is powered off ({size})", ["node_loss"],
        {label: [median(map(value, loss))] for label, value in LOSS_STRETCHES.items()},
        [arms["node_loss"]["full_strength_seconds"]],
        plots.footnote(raw, f"n = {len(loss)}; segments: median of each stretch; dot and whisker: "
                            "median and IQR of the time to full strength"))
    return [switch, moved, recovery]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None, help="default: <size>mib/ next to this script")
    args = ap.parse_args(argv)
    out = args.out or HERE / f"{args.size_mib}mib"

    from kubernetes import client

    from bundle.cpu_model import make_revision
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import CHUNK, BundleServer, Story, make_base, model_body, whole_bundle_reload

    work = Path(tempfile.mkdtemp(prefix="resident-exp13-"))
    before = benchkit.machine()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)   # last, also when a round fails
        base, base_dir = make_base(work, args.size_mib * 2**20)   # every other revision derives from it
        cluster = stack.enter_context(LocalCluster(nodes=3))
        server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
        server.push(base_dir)
        installation = install(cluster)
        core = client.CoreV1Api(cluster.api_client())
        cluster.kubectl("create", "namespace", "bench")
        cluster.wait_for_service_account("bench")
        stories = {}
        for name, (control, http) in MODELS.items():
            body = model_body(name, server.url, base, port=control)
            body["spec"].update(replicas=3, serving={"port": http})
            if name == "packed":
                body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-0"}
            stories[name] = Story(cluster, "bench", name, installation.bridge_root)
            stories[name].apply(body)
        for story in stories.values():
            story.wait_ready(base, timeout=600)
        live = {name: {"dir": base_dir, "digest": base} for name in MODELS}
        counter = {"n": 0}

        def owners(name: str) -> list:
            return [p for p in stories[name].owner_pods() if p.metadata.deletion_timestamp is None]

        def ready(pod) -> bool:
            return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

        def switch(name: str):
            def once() -> dict:
                counter["n"] += 1
                target = work / f"t{counter['n']}"
                digest = make_revision(live[name]["dir"], target, "rows", fraction=0.005, seed=100 + counter["n"],
                                       chunk_size=CHUNK).digest
                server.push(target)
                story = stories[name]
                t0 = time.monotonic()
                story.patch_spec(whole_bundle_reload(server.url, digest))
                rm = story.wait_ready(digest, timeout=600)
                benchkit.wait_until("every owner Ready", lambda: story.get()["status"]["ready"] == "3/3",
                                    timeout=300, every=0.1)
                wall = time.monotonic() - t0
                if live[name]["dir"] != base_dir:
                    shutil.rmtree(live[name]["dir"], ignore_errors=True)   # superseded: free the disk
                live[name] = {"dir": target, "digest": digest}
                last = rm["status"]["lastTransition"]
                per_node = {n["node"]: n for n in last.get("nodes") or []}
                mib = 2**20
                return {"model": name, "result": last["result"], "strategy": last["strategy"],
                        "method": last["method"], "wall_seconds": round(wall, 3),
                        "total_seconds": last["durations"]["totalSeconds"], "nodes": last.get("nodes"),
                        "fetched_mib_total": round(sum(n["fetched"] for n in per_node.values()) / mib, 3),
                        "fetched_mib_per_node_max": round(max((n["fetched"] for n in per_node.values()),
                                                              default=0) / mib, 3)}
            return once

        def node_loss() -> dict:
            story = stories["spread"]
            operator_nodes = {p.spec.node_name for p in core.list_namespaced_pod(
                installation.namespace, label_selector="app.kubernetes.io/component=operator").items}
            candidates = sorted({p.spec.node_name for p in owners("spread") if ready(p)} - operator_nodes - {"node-0"})
            lost = candidates[-1]
            victim = next(p for p in owners("spread") if p.spec.node_name == lost)
            t0 = time.monotonic()
            cluster.power_off(lost)
            marks: dict[str, float] = {}

            def watch() -> bool:
                now = time.monotonic() - t0
                if "unknown" not in marks:
                    cond = {c.type: c.status for c in core.read_node(lost).status.conditions or []}
                    if cond.get("Ready") == "Unknown":
                        marks["unknown"] = now
                if "named" not in marks and lost in json.dumps(story.get().get("status", {}).get("conditions")):
                    marks["named"] = now
                elsewhere = [p for p in owners("spread") if ready(p) and p.spec.node_name != lost]
                return len(elsewhere) == 3 and "named" in marks and "unknown" in marks
            benchkit.wait_until("spread at full strength elsewhere", watch, timeout=300, every=0.25)
            story.complete("after the loss")
            full = time.monotonic() - t0
            cluster.power_on(lost)
            benchkit.wait_until("the lost owner's Pod gone", lambda: not [
                p for p in story.owner_pods() if p.metadata.uid == victim.metadata.uid], timeout=300, every=0.5)
            # rebalance for the next round: the owner doubled up on one node goes, and the
            # spread places its replacement on the returned node
            by_node: dict[str, list] = {}
            for p in owners("spread"):
                by_node.setdefault(p.spec.node_name, []).append(p)
            doubled = next(ps for ps in by_node.values() if len(ps) > 1)
            core.delete_namespaced_pod(doubled[-1].metadata.name, "bench")
            benchkit.wait_until("spread one owner per node again", lambda: sorted(
                p.spec.node_name for p in owners("spread") if ready(p)) == NODES, timeout=300, every=0.5)
            return {"lost": lost, "full_strength_seconds": round(full, 3),
                    "named_seconds": round(marks["named"], 3), "node_unknown_seconds": round(marks["unknown"], 3)}

        arms = {arm: switch(model) for arm, model in SWITCH_ARMS.items()}
        arms["node_loss"] = node_loss
        samples = benchkit.run_rounds(args.rounds, arms)
        kubernetes_version = cluster.version
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "nodes": NODES, "models": MODELS,
                      "kubernetes": kubernetes_version, "node_monitor_grace_seconds": 20,
                      "node_loss_toleration_seconds": 10, "switch": "whole bundle, Reload, 0.5% rows"},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples}
    summary = recompute(raw)
    out.mkdir(parents=True, exist_ok=True)
    benchkit.write(out, raw, summary, draw)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
