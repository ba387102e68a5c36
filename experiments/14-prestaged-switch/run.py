"""Pre-staged switches on the local single-node cluster (issue 26): a switch to a revision
staged ahead through ``spec.stage`` against the same switch delivered inside the transition.

Resident is installed with its chart on a real node (kubelet, containerd, the bridge as a
DaemonSet Pod, owners in containers, cpu backend), as in experiment 09. One ResidentModel
(``spec.transition.keepPrevious: false``, so no revision left behind stays staged) is
driven through transitions, each to a fresh revision derived from the live one (0.5% of
rows changed), with Auto delivery. Arms (n rounds, order alternating each round):

- ``in_place``:           not staged; switched in place (strategy InPlace)
- ``in_place_prestaged``: staged first through ``spec.stage`` (untimed: until
  ``status.stage.ready`` is 1/1 and the ``Staged`` condition is True), then switched in place
- ``reload``:             not staged; switched by a reload (strategy Reload)
- ``reload_prestaged``:   staged first, then switched by a reload
- ``reload_prepared``:    staged first, then switched by a reload with ``commit: Lockstep``:
  the owner prepares (loads the new revision beside the live one, which serves on) after
  the spec change, and its commit is a swap
- ``reload_preloaded``:   staged first with ``spec.stage.preload`` (untimed: until the owner
  has also loaded it beside the live revision, ``status.stage.nodes[].preload`` loaded),
  then switched by a reload, which swaps it in

Before an un-staged arm ``spec.stage`` is removed and the script waits until nothing is
staged beside the live revision (no ``status.stage``, no ``status.previousBundle``, no
BundleDelivery with ``activate: false``); after a pre-staged arm's switch ``spec.stage``
is removed again. The figure per sample is ``spec_to_first_token_seconds``: from the spec patch
to the owner's first token on the new revision (``lastTransition.commits[].firstTokenAt``,
stamped by the owner with the wall clock of this machine); beside it 09's
``spec_to_done_seconds`` (until ``lastTransition`` names the new revision, polled every
20 ms, so it also holds the release after the first token), ``commit_to_first_token_seconds``
(from the owner's commit, when it began to change its live revision, to its first token
on the new one, both by the owner's clock: how long the switch itself interrupted the
live revision), ``status.lastTransition``'s durations, bytes, ``prestaged`` flag, path,
method, strategy, commit mode, ``loadedBeside`` and result, for the pre-staged arms
what staging ahead cost (``status.stage.nodes``), and the bridge's message on the
revision's delivery (``delivery_message``: on ext4 it says why the store rebased or
reconstructed, from the copy and fetch rates it measured).

Every revision is removed (its directory and its blobs on the bundle server) once the
model has moved past it. ``python run.py [--rounds N] [--size-mib M] [--out D]``; results
go to ``<size>mib/raw.json`` and ``summary.json`` and ``phases.png``.
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

# 09's run.py: its 20 ms wait_until, drop_revision and PHASES are reused here
exp09 = benchkit.sibling("09-e2e-delivery-table")

AUTO = {"mode": "Auto", "rebase": "Auto"}
# arm: (revision kind, delivery, strategy, staged ahead, commit, preloaded ahead)
ARMS = {
    "in_place": ("rows", AUTO, "InPlace", False, "Rolling", False),
    "in_place_prestaged": ("rows", AUTO, "InPlace", True, "Rolling", False),
    "reload": ("rows", AUTO, "Reload", False, "Rolling", False),
    "reload_prestaged": ("rows", AUTO, "Reload", True, "Rolling", False),
    "reload_prepared": ("rows", AUTO, "Reload", True, "Lockstep", False),
    "reload_preloaded": ("rows", AUTO, "Reload", True, "Rolling", True),
}
RATIOS = {
    "in_place_over_in_place_prestaged": ("in_place", "in_place_prestaged"),
    "reload_over_reload_prestaged": ("reload", "reload_prestaged"),
    "reload_over_reload_prepared": ("reload", "reload_prepared"),
    "reload_over_reload_preloaded": ("reload", "reload_preloaded"),
}
# issue 26's targets, of the main figure: stated, not claimed; summary.json says whether met.
# "a reload whose owner prepared (the new revision loaded beside the old one)" on a revision
# staged ahead: the owner that preloaded at the stage; the lockstep reload prepares only
# after the spec change, so its ratio is reported beside it, without a target
TARGETS = {"in_place_over_in_place_prestaged": 4.0, "reload_over_reload_prestaged": 2.5,
           "reload_over_reload_preloaded": 4.0}

METRIC = "spec_to_first_token_seconds"
INTERRUPTION = "commit_to_first_token_seconds"
PARTS = ("spec_to_done_seconds", INTERRUPTION, "total_seconds", "deliver_seconds", "apply_seconds",
         "first_token_seconds", "staging_seconds", "owner_seconds", "overhead_seconds", "fetched", "reused",
         "written")


def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    summary = benchkit.summarize(samples, METRIC, RATIOS)
    total = benchkit.summarize(samples, "total_seconds", RATIOS)
    summary["total_seconds_arms"] = total["arms"]
    summary["total_ratios"] = total["ratios"]
    interruption = benchkit.summarize(samples, INTERRUPTION, RATIOS)
    summary["interruption_arms"] = interruption["arms"]
    summary["interruption_ratios"] = interruption["ratios"]
    for part in PARTS:
        if all(part in s for s in samples):
            summary[part] = {arm: benchkit.stats([s[part] for s in samples if s["arm"] == arm])["median"]
                             for arm in ARMS}
    summary["targets"] = {name: {"target": want, "ratio": summary["ratios"][name],
                                 "met": summary["ratios"][name] is not None and summary["ratios"][name] >= want}
                          for name, want in TARGETS.items()}
    return summary


def draw(raw: dict, folder: Path) -> list[Path]:
    """phases.png: each arm's totalSeconds stacked by phase (09's PHASES), from raw.json."""
    import plots
    samples, arms = raw["samples"], list(ARMS)
    total = benchkit.summarize(samples, "total_seconds", RATIOS)["arms"]
    n = min(st["n"] for st in total.values())
    median = lambda arm, value: benchkit.stats([value(s) for s in samples if s["arm"] == arm])["median"]  # noqa: E731
    return [plots.phases(
        folder / "phases.png", f"14: switch to first token, staged ahead or not ({raw['config']['size_mib']} MiB)",
        arms, {label: [median(arm, value) for arm in arms] for label, value in exp09.PHASES.items()},
        [total[arm] for arm in arms],
        plots.footnote(raw, f"n = {n} per arm, alternating; segments: median of each phase of totalSeconds; "
                            "dot and whisker: median and IQR of totalSeconds; staging ahead is not counted"))]


def _epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def switch(story, spec: dict, digest: str) -> tuple[float, float, dict]:
    """Patch the spec and poll every 20 ms (09's wait) until lastTransition names ``digest``.
    Returns spec change to the owner's first token on the new revision (the owner stamps
    ``firstTokenAt`` by the wall clock of this same machine), spec change to the recorded
    end of the transition (09's ``spec_to_done_seconds``, which also holds the release
    after the first token), and that lastTransition."""
    wall0, t0 = time.time(), time.monotonic()
    story.patch_spec(spec)
    last = exp09.wait_until("done", lambda: (
        (story.get()["status"].get("lastTransition") or {}).get("to") == digest
        and story.get()["status"]["lastTransition"]))
    done = round(time.monotonic() - t0, 4)
    first_token = max(_epoch(c["firstTokenAt"]) for c in last["commits"])
    return round(first_token - wall0, 4), done, last


def sample_of(last: dict, seconds: float, done: float) -> dict:
    d, b = last["durations"], last["bytes"]
    interruption = max(_epoch(c["firstTokenAt"]) - _epoch(c["committedAt"]) for c in last["commits"])
    return {METRIC: seconds, "spec_to_done_seconds": done, INTERRUPTION: round(interruption, 6),
            "total_seconds": d["totalSeconds"], "deliver_seconds": d["deliverSeconds"],
            "apply_seconds": d["applySeconds"], "first_token_seconds": d["firstTokenSeconds"],
            "staging_seconds": d["stagingSeconds"], "owner_seconds": d["ownerSeconds"],
            "overhead_seconds": d["overheadSeconds"],
            "fetched": b["fetched"], "reused": b["reused"], "written": b["written"],
            "prestaged": last.get("prestaged"), "path": last.get("path"), "method": last.get("method"),
            "strategy": last.get("strategy"), "commit": last.get("commit"), "result": last.get("result"),
            "loaded_beside": [c.get("loadedBeside") for c in last["commits"]],
            "preloaded": last.get("preloaded")}


def delivery_message(story, digest: str) -> str | None:
    """The bridge's message on the delivery of ``digest``: its method and, without reflink,
    why it rebased or reconstructed (the measured copy and fetch rates it compared)."""
    from localcluster.scenario import GROUP, VERSION
    items = story.custom.list_namespaced_custom_object(GROUP, VERSION, story.namespace, "bundledeliveries")["items"]
    return next(((bd.get("status") or {}).get("message") for bd in items
                 if bd["spec"]["bundle"]["digest"] == digest), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None, help="default: <size>mib/ next to this script")
    args = ap.parse_args(argv)
    out = args.out or HERE / f"{args.size_mib}mib"

    from bundle.cpu_model import make_revision
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import (CHUNK, GROUP, VERSION, BundleServer, Story, condition, make_base,
                                       model_body)

    work = Path(tempfile.mkdtemp(prefix="resident-exp14-"))
    machine_before = benchkit.machine()
    try:  # the revisions it generates are large: removed also when a run fails
        base, base_dir = make_base(work, args.size_mib * 2**20)   # every other revision derives from it
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(LocalCluster())
            kubernetes_version = cluster.version
            server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
            server.push(base_dir)
            installation = install(cluster)
            cluster.kubectl("create", "namespace", "bench")
            cluster.wait_for_service_account("bench")
            story = Story(cluster, "bench", "bench", installation.bridge_root)
            body = model_body("bench", server.url, base)
            body["spec"]["transition"]["keepPrevious"] = False
            story.apply(body)
            story.wait_ready(base)
            live = {"dir": base_dir, "digest": base, "n": 0}

            def nothing_staged() -> bool:
                status = story.get().get("status") or {}
                if "stage" in status or status.get("previousBundle"):
                    return False
                deliveries = story.custom.list_namespaced_custom_object(
                    GROUP, VERSION, story.namespace, "bundledeliveries")["items"]
                return not any((bd.get("spec") or {}).get("activate") is False for bd in deliveries)

            def unstage() -> None:
                story.patch_spec({"stage": None})
                benchkit.wait_until("nothing staged", nothing_staged, timeout=600.0, every=0.25)
                story.wait_ready(live["digest"])

            def staged(rm: dict, digest: str, preload: bool) -> bool:
                if condition(rm, "Staged").get("reason") == "StageFailed":
                    raise RuntimeError(f"staging {digest[:19]} failed: {condition(rm, 'Staged').get('message')}")
                stage = (rm.get("status") or {}).get("stage") or {}
                loaded = ((stage.get("nodes") or [{}])[0].get("preload") or {}).get("state")
                if loaded == "failed":
                    raise RuntimeError(f"preloading {digest[:19]} failed: {stage['nodes'][0]['preload']}")
                return (stage.get("digest") == digest and stage.get("ready") == "1/1"
                        and condition(rm, "Staged").get("status") == "True"
                        and condition(rm, "Staged").get("reason") == "Staged"
                        and (not preload or loaded == "loaded"))

            def arm(name: str):
                kind, delivery, strategy, prestaged, commit, preload = ARMS[name]
                transition = {"strategy": strategy, "commit": commit}

                def once() -> dict:
                    if not prestaged:
                        unstage()
                    live["n"] += 1
                    target = work / f"t{live['n']}"
                    digest = make_revision(live["dir"], target, kind, fraction=0.005, seed=100 + live["n"],
                                           chunk_size=CHUNK).digest
                    server.push(target)
                    ref = {"source": server.url, "digest": digest}
                    ahead = None
                    if prestaged:   # untimed: stage beside the live revision, wait until it is held
                        t0 = time.monotonic()
                        story.patch_spec({"stage": {**ref, "preload": preload}, "delivery": delivery,
                                          "transition": transition})
                        rm = story.wait("staged", lambda rm: staged(rm, digest, preload), timeout=600.0)
                        row, = rm["status"]["stage"]["nodes"]
                        ahead = {"wait_seconds": round(time.monotonic() - t0, 4), "seconds": row.get("seconds"),
                                 **{k: (row.get("bytes") or {}).get(k) for k in ("fetched", "reused", "written")}}
                        story.wait_ready(live["digest"])
                    seconds, done, last = switch(story, {"bundle": ref, "delivery": delivery,
                                                         "transition": transition}, digest)
                    story.wait_ready(digest)
                    why = delivery_message(story, digest)   # read before the delivery may go
                    if prestaged:
                        story.patch_spec({"stage": None})
                        story.wait("spec.stage released", lambda rm: "stage" not in (rm.get("status") or {}))
                    exp09.drop_revision(live["dir"], work / "served", keep=target)
                    live.update(dir=target, digest=digest)
                    return {**sample_of(last, seconds, done), "staged_ahead": ahead, "delivery_message": why}
                return once

            samples = benchkit.run_rounds(args.rounds, {name: arm(name) for name in ARMS})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "chunk_bytes": CHUNK,
                      "kubernetes": kubernetes_version, "keep_previous": False, "poll_seconds": 0.02,
                      "fraction": 0.005, "arms": {k: list(v) for k, v in ARMS.items()}},
           **benchkit.provenance(machine_before, benchkit.machine()),
           "samples": samples}
    summary = recompute(raw)
    out.mkdir(parents=True, exist_ok=True)
    benchkit.write(out, raw, summary, draw)
    fmt = lambda v: "  n/a" if v is None else f"{v:5.2f}x"  # noqa: E731
    for name, value in summary["ratios"].items():
        target = f"target >= {TARGETS[name]}x" if name in TARGETS else "no target"
        print(f"{name:<36} {fmt(value)}  ({target}; "
              f"of totalSeconds {fmt(summary['total_ratios'][name])}; "
              f"of commit to first token {fmt(summary['interruption_ratios'][name])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
