"""Experiment 18: owners that hang do not slow down the other models' transitions (issue 27).

Resident is installed with its chart on a one-node LocalCluster (20 cards). 20
ResidentModels, one replica each (cpu backend, the same base revision), all Ready. Per
sample, 15 of them (``m00``-``m14``) switch in place at once to a fresh revision derived
from their live one (0.5 % of rows changed, Auto delivery); the other 5 (``m15``-``m19``)
keep their revision. Arms (n rounds, order alternating each round):

- ``hung``: the 5 others' owner containers are stopped (SIGSTOP, ``localcluster.faults``)
  ``HANG_LEAD_SECONDS`` before the switches and continued once every switch is done: the
  kernel still accepts their connections, nothing answers, as an owner stuck in a driver
  call. The operator meets them whenever it passes their models (their Pods turn NotReady,
  which wakes those models);
- ``none``: the same sample with every owner answering (the wait before the switches too).

Per sample: each switched model's time from its own spec patch until its
``lastTransition`` names the new revision (``spec_to_done``; the 15 patches are sent at
once from 15 threads, and the models are listed every ``POLL_SECONDS``), the slowest and
the median of the 15, their results, and for the hung arm whether the operator reported
the hung owners (``OwnerUnresponsive`` in their models' ``owners[]`` or conditions).

Summary: median and IQR per arm of the slowest and of the median transition, the ratios
hung / none of those medians, and per switched model the ratio of its median transition
hung / none; the target (issue 27: every transition of the other 15 within 1.5x its time
with no hung owners) is read as that per-model ratio, the worst of the 15. Each single
hung transition over its model's median without hung owners is given beside it, with the
same figure of the ``none`` arm against itself as the noise floor.

``python run.py [--rounds N] [--size-mib M] [--out D]`` (root); results go to ``D``
(default ``results/``): raw.json, summary.json, transitions.png. ``verify.py`` recomputes.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))  # the repository: charts/ (Helm) is not installed

import benchkit  # noqa: E402

MODELS, HUNG = 20, 5
SWITCHED = [f"m{i:02d}" for i in range(MODELS - HUNG)]
HUNG_MODELS = [f"m{i:02d}" for i in range(MODELS - HUNG, MODELS)]
ARMS = ("hung", "none")
HANG_LEAD_SECONDS = 5.0    # owners hung before the switches: their readiness has failed by then
POLL_SECONDS = 0.1
FRACTION = 0.005
TIMEOUT_SECONDS = 300
TARGET_RATIO = 1.5
RATIO = {"hung_over_none": ("hung", "none")}


def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    slowest = benchkit.summarize(samples, "slowest_seconds", RATIO)
    median = benchkit.summarize(samples, "median_seconds", RATIO)
    per_model = {}
    for m in SWITCHED:
        of = {arm: benchkit.stats([s["spec_to_done"][m] for s in samples if s["arm"] == arm])["median"]
              for arm in ARMS}
        per_model[m] = {**of, "hung_over_none": of["hung"] / of["none"]}

    def worst_single(arm: str) -> float:
        """The slowest single transition of ``arm`` over its model's median without hung owners."""
        return max(s["spec_to_done"][m] / per_model[m]["none"] for s in samples if s["arm"] == arm
                   for m in SWITCHED)

    worst = max(p["hung_over_none"] for p in per_model.values())
    return {"metric": "slowest_seconds", "arms": slowest["arms"], "ratios": slowest["ratios"],
            "median_seconds": median["arms"], "median_ratios": median["ratios"],
            "per_model": per_model, "worst_model_ratio": worst,
            "worst_single_over_model_median": {arm: worst_single(arm) for arm in ARMS},
            "hung_owners_reported": [s["hung_reported"] for s in samples if s["arm"] == "hung"],
            "targets": {"every_model_hung_over_none": {"target": TARGET_RATIO, "value": worst,
                                                       "met": worst <= TARGET_RATIO}}}


def draw(raw: dict, folder: Path) -> list[Path]:
    """transitions.png: per arm, the median and IQR of the slowest and of the median of the
    15 transitions of a sample, from raw.json."""
    import plots
    summary = recompute(raw)
    arms = plots.arms_in_order(raw)
    n = min(st["n"] for st in summary["arms"].values())
    return [plots.medians(
        folder / "transitions.png",
        f"18: {len(SWITCHED)} switches in place while {HUNG} other owners hang, or none",
        [("slowest of the 15: spec change to done, s", {a: summary["arms"][a] for a in arms}),
         ("median of the 15: spec change to done, s", {a: summary["median_seconds"][a] for a in arms})],
        plots.footnote(raw, f"n = {n} per arm, alternating; bars: medians, whiskers: IQR; "
                            f"{raw['config']['size_mib']} MiB models, one node"))]


def unresponsive(rm: dict) -> bool:
    """Whether the model's status reports an owner that does not answer."""
    st = rm.get("status") or {}
    return (any(o.get("reason") == "OwnerUnresponsive" for o in st.get("owners") or [])
            or any(c.get("reason") == "OwnerUnresponsive" for c in st.get("conditions") or []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)

    from kubernetes import client

    from bundle.cpu_model import make_revision
    from localcluster import faults
    from localcluster.install import install
    from localcluster.node import LocalCluster
    from localcluster.scenario import CHUNK, GROUP, VERSION, BundleServer, Story, make_base, model_body

    work = Path(tempfile.mkdtemp(prefix="resident-exp18-"))
    before = benchkit.machine()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)   # last, also when a round fails
        base, base_dir = make_base(work, args.size_mib * 2**20)
        cluster = stack.enter_context(LocalCluster(nodes=1, cards=MODELS))
        kubernetes_version = cluster.version
        server = stack.enter_context(BundleServer(work / "served", work / "logs", cluster=cluster))
        server.push(base_dir)
        installation = install(cluster)
        cluster.kubectl("create", "namespace", "bench")
        cluster.wait_for_service_account("bench")
        stories = {m: Story(cluster, "bench", m, installation.bridge_root) for m in SWITCHED + HUNG_MODELS}
        for m, story in stories.items():
            story.apply(model_body(m, server.url, base))
        custom = client.CustomObjectsApi(cluster.api_client())

        def models() -> dict[str, dict]:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, "bench", "residentmodels")["items"]
            return {rm["metadata"]["name"]: rm for rm in items}

        live = {"dir": base_dir, "digest": base, "n": 0}
        wants = {m: base for m in stories}

        def all_ready() -> bool:
            rms = models()
            status = {m: (rms.get(m) or {}).get("status") or {} for m in stories}
            return all(st.get("phase") == "Ready" and st.get("ready") == "1/1"
                       and (st.get("identity") or {}).get("bundle") == wants[m] for m, st in status.items())

        benchkit.wait_until(f"{MODELS} models Ready", all_ready, timeout=900, every=1.0)

        def arm(name: str):
            def once() -> dict:
                benchkit.wait_until("every model Ready, every owner answering", all_ready, timeout=300, every=0.5)
                live["n"] += 1
                target = work / f"t{live['n']}"
                digest = make_revision(live["dir"], target, "rows", fraction=FRACTION, seed=100 + live["n"],
                                       chunk_size=CHUNK).digest
                server.push(target)
                spec = {"bundle": {"source": server.url, "digest": digest},
                        "delivery": {"mode": "Auto", "rebase": "Auto"},
                        "transition": {"strategy": "InPlace", "timeoutSeconds": TIMEOUT_SECONDS}}
                patched, done, last, reported = {}, {}, {}, set()
                with contextlib.ExitStack() as hang:
                    if name == "hung":
                        for m in HUNG_MODELS:
                            pod = next(p for p in stories[m].owner_pods() if p.metadata.deletion_timestamp is None)
                            hang.enter_context(faults.frozen(faults.container_id(pod, pod.spec.containers[0].name)))
                    time.sleep(HANG_LEAD_SECONDS)

                    def patch(m: str) -> None:
                        patched[m] = time.monotonic()
                        stories[m].patch_spec(spec)
                    with ThreadPoolExecutor(len(SWITCHED)) as pool:
                        list(pool.map(patch, SWITCHED))
                    deadline = time.monotonic() + TIMEOUT_SECONDS
                    while len(done) < len(SWITCHED):
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{name}: not done after {TIMEOUT_SECONDS} s: "
                                               f"{sorted(set(SWITCHED) - set(done))}")
                        now, rms = time.monotonic(), models()
                        reported |= {m for m in HUNG_MODELS if unresponsive(rms[m])}
                        for m in SWITCHED:
                            lt = (rms[m].get("status") or {}).get("lastTransition") or {}
                            if m not in done and lt.get("to") == digest:
                                done[m], last[m] = now, lt
                        time.sleep(POLL_SECONDS)
                for m in SWITCHED:
                    wants[m] = digest
                live.update(dir=target, digest=digest)
                seconds = {m: round(done[m] - patched[m], 4) for m in SWITCHED}
                ordered = sorted(seconds.values())
                return {"spec_to_done": seconds, "slowest_seconds": ordered[-1],
                        "median_seconds": ordered[len(ordered) // 2],
                        "results": {m: last[m].get("result") for m in SWITCHED},
                        "strategies": sorted({last[m].get("strategy") for m in SWITCHED}),
                        "total_seconds": {m: last[m]["durations"]["totalSeconds"] for m in SWITCHED},
                        "hung_reported": len(reported)}
            return once

        samples = benchkit.run_rounds(args.rounds, {name: arm(name) for name in ARMS})
    raw = {"config": {"rounds": args.rounds, "size_mib": args.size_mib, "chunk_bytes": CHUNK, "models": MODELS,
                      "hung": HUNG_MODELS, "switched": SWITCHED, "nodes": 1, "kubernetes": kubernetes_version,
                      "hang_lead_seconds": HANG_LEAD_SECONDS, "poll_seconds": POLL_SECONDS,
                      "fraction": FRACTION, "strategy": "InPlace", "target_ratio": TARGET_RATIO},
           **benchkit.provenance(before, benchkit.machine()), "samples": samples}
    summary = recompute(raw)
    args.out.mkdir(parents=True, exist_ok=True)
    benchkit.write(args.out, raw, summary, draw)
    for key, label in (("arms", "slowest"), ("median_seconds", "median")):
        print("  ".join(f"{label} {arm} {summary[key][arm]['median']:.3f} s (IQR {summary[key][arm]['iqr']:.3f})"
                        for arm in ARMS))
    t = summary["targets"]["every_model_hung_over_none"]
    print(f"worst model, hung / none: {t['value']:.2f}x (target <= {t['target']}: {'met' if t['met'] else 'missed'})")
    print(f"hung owners reported per hung sample: {summary['hung_owners_reported']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
