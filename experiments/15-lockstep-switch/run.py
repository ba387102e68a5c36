"""Lockstep against rolling commits of a 3-replica switch on the local 3-node cluster (issue 26).

Resident is installed with its chart on a 3-node LocalCluster (as in experiment 13). One
ResidentModel, 3 replicas spread one owner per node (the chart's default spread; checked
before the first round and per sample from ``lastTransition.commits[].node``), cpu backend,
``spec.transition.keepPrevious: false``, switched in place (strategy InPlace) to a fresh
revision derived from the live one (0.5% of rows changed), Auto delivery. Arms (n rounds,
order alternating each round):

- ``lockstep``: ``spec.transition.commit: Lockstep``: every owner prepares (staged,
  verified, ready to apply), then all commit at one barrier;
- ``rolling``:  ``spec.transition.commit: Rolling``, maxUnavailable 1: owners one after
  another.

The commit mode is set in the same patch as the new bundle. During every sample a closed
loop of 6 clients calls the model at its Service's ClusterIP (``localcluster.traffic``):
from before the patch (at least 30 answers on the live revision) until 1 s after the
switch is recorded done and every owner is Ready and in the Service's endpoints again.
Every answer the loop recorded counts. Per sample:

- ``skew_seconds``: ``lastTransition.skewSeconds`` (last owner's commit minus the first,
  by the owners' wall clocks, which are this machine's);
- ``mixed_seconds``: from the clients' side, the end of the last answer from the old
  revision minus the end of the first answer from the new one; 0 when the last old answer
  ended before the first new one;
- ``failed_requests`` (answers not 200) of ``requests``;
- ``late_old_answers``: answers from the old revision that started more than 0.05 s after
  the last owner's commit (its ``committedAt`` brought to the monotonic clock with the
  offset ``time.time() - time.monotonic()`` taken just before the patch);
- ``spec_to_done_seconds`` and ``spec_to_first_token_seconds`` (14's ``switch``: polled
  every 20 ms), and ``lastTransition``'s result, strategy, commit, durations and bytes.

Every revision is removed (its directory and its blobs on the bundle server) once the
model has moved past it. ``python run.py [--rounds N] [--size-mib M] [--out D]``; results
go to ``<size>mib/raw.json``, ``summary.json`` and ``switch.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))  # the repository: charts/ (Helm) is not installed

import benchkit  # noqa: E402


exp11 = benchkit.sibling("11-serving-during-switch")   # ready_endpoints
exp14 = benchkit.sibling("14-prestaged-switch")   # switch, sample_of; its exp09.drop_revision

NODES = ["node-0", "node-1", "node-2"]
ARMS = {"lockstep": "Lockstep", "rolling": "Rolling"}     # arm: spec.transition.commit
STRATEGY = "InPlace"
TIMEOUT_SECONDS = 300      # spec.transition.timeoutSeconds, as model_body sets it
CLIENTS = 6
WARM_ANSWERS = 30          # answers on the live revision before the patch
TAIL_SECONDS = 1.0         # traffic kept after the switch is done and every owner is back
LATE_MARGIN_SECONDS = 0.05  # the clocks' conversion and the way from client to owner
FRACTION = 0.005
RATIOS = {"rolling_over_lockstep_skew": ("rolling", "lockstep")}
# issue 26's targets for a lockstep switch: stated, not claimed; summary.json says whether met
TARGETS = {"lockstep_skew_median_seconds": 0.050, "lockstep_failed_requests": 0, "lockstep_late_old_answers": 0}


def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    skew = benchkit.summarize(samples, "skew_seconds", RATIOS)
    mixed = benchkit.summarize(samples, "mixed_seconds", {})
    done = benchkit.summarize(samples, "spec_to_done_seconds", {})
    total = lambda key: {arm: sum(s[key] for s in samples if s["arm"] == arm) for arm in ARMS}  # noqa: E731
    summary = {"metric": "skew_seconds", "arms": skew["arms"], "ratios": skew["ratios"],
               "mixed_seconds": mixed["arms"], "spec_to_done_seconds": done["arms"],
               "failed_requests": total("failed_requests"), "requests": total("requests"),
               "late_old_answers": total("late_old_answers")}
    summary["late_old_answers_total"] = sum(summary["late_old_answers"].values())
    found = {"lockstep_skew_median_seconds": summary["arms"]["lockstep"]["median"],
             "lockstep_failed_requests": summary["failed_requests"]["lockstep"],
             "lockstep_late_old_answers": summary["late_old_answers"]["lockstep"]}
    summary["targets"] = {name: {"target": want, "value": found[name], "met": found[name] <= want}
                          for name, want in TARGETS.items()}
    return summary


def draw(raw: dict, folder: Path) -> list[Path]:
    """switch.png: per arm, the median and IQR of the commit skew, of the time both
    revisions answered the clients, and of spec change to done, from raw.json."""
    import plots
    summary = recompute(raw)
    arms = plots.arms_in_order(raw)
    n = min(st["n"] for st in summary["arms"].values())
    return [plots.medians(
        folder / "switch.png",
        f"15: a 3-replica switch in place on 3 nodes, lockstep or rolling ({raw['config']['size_mib']} MiB)",
        [("skew: last commit - first, s", {a: summary["arms"][a] for a in arms}),
         ("mixed: both revisions answer, s", {a: summary["mixed_seconds"][a] for a in arms}),
         ("spec change to done, s", {a: summary["spec_to_done_seconds"][a] for a in arms})],
        plots.footnote(raw, f"n = {n} per arm, alternating; bars: medians, whiskers: IQR; "
                            f"{raw['config']['clients']} clients on the Service"))]


def wall(stamp: str) -> float:
    """An RFC3339 time of lastTransition (UTC, microseconds) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def traffic_figures(answers: list, old: str, new: str, commits_mono: list[float], patched: float) -> dict:
    """What the clients saw of one switch: every answer the closed loop recorded."""
    ok = [a for a in answers if a.ok]
    old_answers = [a for a in ok if a.revision == old]
    new_answers = [a for a in ok if a.revision == new]
    last_old_end = max((a.end for a in old_answers), default=None)
    first_new_end = min((a.end for a in new_answers), default=None)
    mixed = (max(0.0, last_old_end - first_new_end)
             if last_old_end is not None and first_new_end is not None else 0.0)
    late = [a for a in old_answers if a.start > max(commits_mono) + LATE_MARGIN_SECONDS]
    since = lambda t: None if t is None else round(t - patched, 4)  # noqa: E731
    return {"mixed_seconds": round(mixed, 4), "requests": len(answers),
            "failed_requests": len(answers) - len(ok),
            "errors": sorted({f"{a.status} {a.error[:80]}" for a in answers if not a.ok})[:5],
            "old_answers": len(old_answers), "new_answers": len(new_answers),
            "foreign_answers": len(ok) - len(old_answers) - len(new_answers),
            "late_old_answers": len(late),
            "late_old_starts_after_last_commit": sorted(round(a.start - max(commits_mono), 4) for a in late)[:10],
            # on the monotonic clock, seconds after the patch was sent
            "commits_after_patch_seconds": sorted(round(c - patched, 4) for c in commits_mono),
            "first_new_end_after_patch_seconds": since(first_new_end),
            "last_old_end_after_patch_seconds": since(last_old_end)}


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
    from localcluster.scenario import CHUNK, BundleServer, Story, make_base, model_body
    from localcluster.traffic import ClosedLoop

    work = Path(tempfile.mkdtemp(prefix="resident-exp15-"))
    before = benchkit.machine()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)   # last, also when a round fails
        base, base_dir = make_base(work, args.size_mib * 2**20)   # every other revision derives from it
        cluster = stack.enter_context(LocalCluster(nodes=3))
        kubernetes_version = cluster.version
        server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
        server.push(base_dir)
        installation = install(cluster)
        cluster.kubectl("create", "namespace", "bench")
        cluster.wait_for_service_account("bench")
        story = Story(cluster, "bench", "bench", installation.bridge_root)
        body = model_body("bench", server.url, base)
        body["spec"]["replicas"] = 3
        body["spec"]["transition"].update(strategy=STRATEGY, keepPrevious=False)
        story.apply(body)
        story.wait_ready(base, timeout=600)
        discovery = client.DiscoveryV1Api(cluster.api_client())

        def ready(pod) -> bool:
            return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])

        def serving_everywhere() -> bool:
            """Three ready owners, one per node, all in the Service's endpoints."""
            owners = [p for p in story.owner_pods() if p.metadata.deletion_timestamp is None]
            return (sorted(p.spec.node_name for p in owners if ready(p)) == NODES
                    and story.get()["status"].get("ready") == "3/3"
                    and exp11.ready_endpoints(discovery, "bench", "bench") == 3)

        benchkit.wait_until("one ready owner per node", serving_everywhere, timeout=300, every=0.5)
        address = story.service_address()
        live = {"dir": base_dir, "digest": base, "n": 0}

        def arm(name: str):
            commit = ARMS[name]

            def once() -> dict:
                benchkit.wait_until("every owner serving", serving_everywhere, timeout=300, every=0.25)
                live["n"] += 1
                target = work / f"t{live['n']}"
                digest = make_revision(live["dir"], target, "rows", fraction=FRACTION, seed=100 + live["n"],
                                       chunk_size=CHUNK).digest
                server.push(target)
                old = live["digest"]
                spec = {"bundle": {"source": server.url, "digest": digest},
                        "delivery": exp14.AUTO,
                        # a merge patch keeps the transition keys it does not name; all are
                        # named anyway, so each sample's switch is fully stated here
                        "transition": {"commit": commit, "strategy": STRATEGY, "keepPrevious": False,
                                       "maxUnavailable": 1, "timeoutSeconds": TIMEOUT_SECONDS}}
                with ClosedLoop(address, story.name, clients=CLIENTS) as load:
                    benchkit.wait_until(f"{WARM_ANSWERS} answers on the live revision", lambda: sum(
                        a.ok and a.revision == old for a in load.between(0, time.monotonic())) >= WARM_ANSWERS,
                        timeout=120, every=0.1)
                    wall_minus_monotonic = time.time() - time.monotonic()   # the owners stamp by the wall clock
                    patched = time.monotonic()
                    first_token, done, last = exp14.switch(story, spec, digest)
                    if last.get("result") != "succeeded":
                        raise RuntimeError(f"{name}: the switch to {digest[:19]} did not succeed: {last}")
                    story.wait_ready(digest)
                    benchkit.wait_until("every owner serving the new revision", serving_everywhere,
                                        timeout=300, every=0.25)
                    time.sleep(TAIL_SECONDS)
                answers = load.between(0, time.monotonic())
                commits_mono = [wall(c["committedAt"]) - wall_minus_monotonic for c in last["commits"]]
                exp14.exp09.drop_revision(live["dir"], work / "served", keep=target)
                live.update(dir=target, digest=digest)
                return {**exp14.sample_of(last, first_token, done),
                        "commit": last.get("commit"), "skew_seconds": last["skewSeconds"],
                        "commit_nodes": sorted(c["node"] for c in last["commits"]),
                        "commits": last["commits"], "wall_minus_monotonic": round(wall_minus_monotonic, 6),
                        **traffic_figures(answers, old, digest, commits_mono, patched)}
            return once

        samples = benchkit.run_rounds(args.rounds, {name: arm(name) for name in ARMS})
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "chunk_bytes": CHUNK, "nodes": NODES,
                      "kubernetes": kubernetes_version, "arms": ARMS, "strategy": STRATEGY,
                      "keep_previous": False, "max_unavailable": 1, "timeout_seconds": TIMEOUT_SECONDS,
                      "fraction": FRACTION, "clients": CLIENTS, "warm_answers": WARM_ANSWERS,
                      "tail_seconds": TAIL_SECONDS, "late_margin_seconds": LATE_MARGIN_SECONDS,
                      "poll_seconds": 0.02, "traffic": "ClusterIP (kube-proxy), a new connection per request"},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples}
    summary = recompute(raw)
    out.mkdir(parents=True, exist_ok=True)
    benchkit.write(out, raw, summary, draw)
    for arm_name in ARMS:
        skew, mixed = summary["arms"][arm_name], summary["mixed_seconds"][arm_name]
        print(f"{arm_name:<9} skew {skew['median']:.4f} s (IQR {skew['iqr']:.4f}), mixed {mixed['median']:.4f} s "
              f"(IQR {mixed['iqr']:.4f}), failed {summary['failed_requests'][arm_name]}"
              f"/{summary['requests'][arm_name]}, late old answers {summary['late_old_answers'][arm_name]}")
    ratio = summary["ratios"]["rolling_over_lockstep_skew"]
    print(f"rolling / lockstep skew: {'n/a' if ratio is None else f'{ratio:.1f}x'}")
    for name, t in summary["targets"].items():
        print(f"  {name:<32} {t['value']:.4g} (target <= {t['target']}: {'met' if t['met'] else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
