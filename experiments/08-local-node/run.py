"""Local node: what the image cache saves, and how long a node takes to come and go.

Arms, alternated each round (benchkit):
- ``image_cold``: the project image from nothing (fresh cache dir): mmdebstrap, wheels,
  wheel layer, layout.
- ``image_tree_changed``: one file of the project tree changed; the base layer is cached,
  only the project layer and the layout are rebuilt.
- ``image_cached``: nothing changed: hash the tree, find the image.
- ``cluster``: ``LocalCluster()`` start to node Ready, cluster DNS and default
  ServiceAccount, then stop (teardown) - both timed, plus whether the machine was restored.
  The cluster DNS part of the start is kept apart (``dns_seconds``).

The image arms build from a copy of the repository's tree (a throw-away git work tree),
so the experiment never touches the working tree. Usage: ``python run.py [--rounds 5]
[--out D]`` (default: raw.json and summary.json next to this script).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO))

import benchkit  # noqa: E402

from localcluster.images import project_image  # noqa: E402
from localcluster.node import LocalCluster  # noqa: E402
from localcluster.wheel_layer import project_files  # noqa: E402

RATIOS = {
    "cold_over_cached": ("image_cold", "image_cached"),
    "cold_over_tree_changed": ("image_cold", "image_tree_changed"),
    "tree_changed_over_cached": ("image_tree_changed", "image_cached"),
}


def copy_tree(dest: Path) -> Path:
    for name in project_files(REPO):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target, follow_symlinks=False)
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "add", "-A"], check=True)
    return dest


def timed(build) -> dict:
    began = time.monotonic()
    name, tarball = build()
    return {"seconds": time.monotonic() - began, "image": name, "bytes": tarball.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE, help="where raw.json and summary.json go")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="resident-exp08-", dir="/var/tmp"))
    try:
        tree = copy_tree(work / "tree")
        warm = work / "warm-cache"
        project_image(tree, warm)          # warm the cache once, outside the timed rounds
        counter = {"n": 0}

        def image_cold() -> dict:
            cache = work / f"cold-{counter['n']}"
            counter["n"] += 1
            try:
                return timed(lambda: project_image(tree, cache))
            finally:
                shutil.rmtree(cache, ignore_errors=True)

        def image_tree_changed() -> dict:
            with open(tree / "resident_cli.py", "a") as f:
                f.write(f"# experiment 08 change {time.time_ns()}\n")
            return timed(lambda: project_image(tree, warm))

        def image_cached() -> dict:
            project_image(tree, warm)      # the tree may have changed in the previous arm
            return timed(lambda: project_image(tree, warm))

        def cluster() -> dict:
            began = time.monotonic()
            node = LocalCluster()
            with node:
                started = time.monotonic() - began
            return {"seconds": started, "start_seconds": started,
                    "kubelet_to_ready_seconds": node.timings["kubelet_to_ready_seconds"],
                    "dns_seconds": node.timings["dns_seconds"], "kubernetes": node.version,
                    "teardown_seconds": node.timings["teardown_seconds"], "leftovers": node.leftovers}

        arms = {"image_cold": image_cold, "image_tree_changed": image_tree_changed,
                "image_cached": image_cached, "cluster": cluster}
        samples = benchkit.run_rounds(args.rounds, arms)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = {"config": {"rounds": args.rounds, "cpus": os.cpu_count(), "load_avg_end": os.getloadavg()},
           "samples": samples}
    args.out.mkdir(parents=True, exist_ok=True)
    benchkit.write(args.out, raw, recompute(raw))
    print((args.out / "summary.json").read_text())


def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    images = [s for s in samples if s["arm"].startswith("image_")]
    out = benchkit.summarize(images, "seconds", RATIOS)
    nodes = [s for s in samples if s["arm"] == "cluster"]
    out["cluster"] = {m: benchkit.stats([s[m] for s in nodes])
                      for m in ("start_seconds", "kubelet_to_ready_seconds", "teardown_seconds")}
    out["cluster_rounds_with_leftovers"] = sum(1 for s in nodes if s["leftovers"])
    out["image_bytes_median"] = sorted(s["bytes"] for s in images)[len(images) // 2]
    return out


if __name__ == "__main__":
    main()
