"""Delivery paths of the node store: rebase vs reconstruct (XFS reflink, ext4), graph-only.

Scope: one machine, the real store (bundle.store.Store) on real filesystems in loop files
under /tmp, a file:// source on the root filesystem (its bytes in the page cache, which
favours reconstruct), sha256 verification and fsync on every path. Nothing is mocked.

Groups (each run with benchkit.run_rounds: n rounds, arms alternating ABAB/BABA):
- ``xfs``:  2 GiB weights, 1% of the chunks changed: rebase (donor in the store) vs
            reconstruct (an empty store on the same filesystem).
- ``ext4``: the same on ext4 (no reflink: unchanged chunks are copied locally).
- ``graph``: a graph-only change at 64 MiB and at 2 GiB weights (on XFS), and
            reconstruct of the same revisions.

Usage: run.py [--size 2GiB] [--small 64MiB] [--rounds 5] [--workdir /tmp/...]
Writes raw.json and summary.json next to this file (unless --out elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import benchkit  # noqa: E402
from bundle.cli import parse_size  # noqa: E402
from bundle.loopfs import loop_filesystem  # noqa: E402
from bundle.manifest import Manifest  # noqa: E402
from bundle.plan import content_key  # noqa: E402
from bundle.reflink import copy_range  # noqa: E402
from bundle.scan import build_manifest, write_manifest  # noqa: E402
from bundle.sources import open_source  # noqa: E402
from bundle.store import Store  # noqa: E402

CHUNK = 4 * 1024 * 1024
CHANGED_FRACTION = 0.01
DONOR_LEASE = "bench:donor"


# -- bundles -------------------------------------------------------------------------
def make_donor(d: Path, size: int, seed: int) -> Manifest:
    import numpy as np
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    with open(d / "model.safetensors", "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(rng.bytes(n))
            left -= n
    (d / "graph.json").write_text(json.dumps({"ops": ["embed", "attn", "mlp"], "revision": 0}))
    (d / "config.json").write_text(json.dumps({"d_model": 1024, "n_layers": 8}))
    (d / "tokenizer.json").write_text(json.dumps({"type": "bytes", "vocab_size": 256}))
    m = build_manifest(d, chunk_size=CHUNK)
    write_manifest(d, m)
    return m


def make_rows_revision(base: Path, d: Path) -> tuple[Manifest, int]:
    """1% of the weight chunks changed (spread evenly); returns the manifest and changed bytes."""
    d.mkdir()
    for p in base.iterdir():
        if p.name != "model.safetensors" and p.is_file():
            os.link(p, d / p.name)
    shutil.copyfile(base / "model.safetensors", d / "model.safetensors")
    size = (d / "model.safetensors").stat().st_size
    n_chunks = -(-size // CHUNK)
    k = max(1, round(n_chunks * CHANGED_FRACTION))
    picks = sorted({int(i * n_chunks / k) + 1 for i in range(k)} - {n_chunks})[:k]
    with open(d / "model.safetensors", "r+b") as f:
        for i in picks:
            f.seek(i * CHUNK + 4096)
            f.write(os.urandom(512))
    m = build_manifest(d, chunk_size=CHUNK)
    write_manifest(d, m)
    return m, sum(min(CHUNK, size - i * CHUNK) for i in picks)


def make_graph_revision(base: Path, d: Path) -> tuple[Manifest, int]:
    """Only graph.json changes; every other file is the base's (hardlinked)."""
    d.mkdir()
    for p in base.iterdir():
        if p.is_file() and p.name not in ("graph.json", "resident-manifest.json"):
            os.link(p, d / p.name)
    (d / "graph.json").write_text(json.dumps({"ops": ["embed", "attn", "mlp", "lm_head"],
                                              "revision": 1}))
    m = build_manifest(d, chunk_size=CHUNK)
    write_manifest(d, m)
    return m, (d / "graph.json").stat().st_size


# -- one timed delivery ----------------------------------------------------------------
def used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def settle(path: Path, timeout: float = 5.0) -> None:
    """Wait until freed blocks are accounted (XFS frees extents in the background)."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        os.sync()
        now = used_bytes(path)
        if now == last:
            return
        last = now
        time.sleep(0.05)


def deliver(store: Store, target: Manifest, src: Path, **kw) -> dict:
    """Time one materialization; then remove it again (GC keeps only the leased donors)."""
    os.sync()
    source = open_source(f"file://{src}")
    before = used_bytes(store.root)
    t0 = time.perf_counter()
    res = store.materialize(target, source, **kw)
    seconds = time.perf_counter() - t0
    os.sync()
    disk = used_bytes(store.root) - before
    store.gc(0, 0)
    if store.has_revision(target.digest):
        raise SystemExit("benchmark bug: the target survived GC")
    settle(store.root)
    return {"seconds": seconds, "method": res.method, "fetched": res.bytes_fetched,
            "written": res.bytes_written, "reused": res.bytes_reused, "cloned": res.bytes_cloned,
            "disk_delta": disk, "verified": res.verified}


def copy_floor(blob: Path, scratch: Path, changed: int) -> dict:
    """Copy a donor blob in the kernel and fsync it: no hashing, no store, no catalog."""
    scratch.mkdir(exist_ok=True)
    os.sync()
    size = blob.stat().st_size
    t0 = time.perf_counter()
    with open(blob, "rb") as src, open(scratch / "copy", "wb") as dst:
        copy_range(src.fileno(), 0, size, dst.fileno(), 0)
        os.fsync(dst.fileno())
    seconds = time.perf_counter() - t0
    (scratch / "copy").unlink()
    settle(scratch)
    return {"seconds": seconds, "method": "copy", "fetched": 0, "written": size, "reused": 0,
            "cloned": 0, "disk_delta": size, "verified": False, "changed_bytes": changed}


def whole_bundle_group(kind: str, work: Path, donor: tuple[Manifest, Path],
                       target: tuple[Manifest, Path, int], rounds: int) -> list[dict]:
    with loop_filesystem(kind, 4 * donor[0].total_bytes + (1 << 30)) as mnt:
        warm = Store(mnt / "warm")      # holds the donor: rebase builds on it
        empty = Store(mnt / "empty")    # no donor: reconstruct writes everything
        warm.materialize(donor[0], open_source(f"file://{donor[1]}"))
        warm.acquire_lease(DONOR_LEASE, donor[0].digest)
        t, tdir, changed = target
        arms = {
            f"rebase_{kind}": lambda: deliver(warm, t, tdir, donor=donor[0].digest),
            f"reconstruct_{kind}": lambda: deliver(empty, t, tdir),
        }
        if not warm.reflink:  # the least any rebase without reflink must do: copy the file
            weights = donor[0].by_path()["model.safetensors"]
            blob = warm.blob_path(content_key(weights, donor[0].chunk_size))
            arms[f"floor_copy_{kind}"] = lambda: copy_floor(blob, mnt / "floor", changed)
        samples = benchkit.run_rounds(rounds, arms)
        for s in samples:
            s.update(changed_bytes=changed, reflink=(warm if "rebase" in s["arm"] else empty).reflink)
        return samples


def graph_group(work: Path, bundles: dict, rounds: int, extra_rounds: int) -> list[dict]:
    big = bundles["big"]
    with loop_filesystem("xfs", 4 * big["donor"][0].total_bytes + (1 << 30)) as mnt:
        warm, empty = Store(mnt / "warm"), Store(mnt / "empty")
        for name in ("small", "big"):
            m, d = bundles[name]["donor"]
            warm.materialize(m, open_source(f"file://{d}"))
            warm.acquire_lease(f"{DONOR_LEASE}-{name}", m.digest)
        arms = {}
        for name in ("small", "big"):
            donor_m = bundles[name]["donor"][0]
            t, tdir, _ = bundles[name]["graph"]
            arms[f"graph_only_{name}"] = (lambda t=t, tdir=tdir, dm=donor_m:
                                          deliver(warm, t, tdir, donor=dm.digest, mode="GraphOnly"))
            arms[f"reconstruct_graph_{name}"] = (lambda t=t, tdir=tdir: deliver(empty, t, tdir))
        samples = benchkit.run_rounds(rounds, arms)
        # graph-only takes milliseconds: more rounds of just those two arms, for the scaling
        only = {a: f for a, f in arms.items() if a.startswith("graph_only")}
        extra = benchkit.run_rounds(extra_rounds, only) if extra_rounds >= 5 else []
        samples += [dict(s, round=s["round"] + rounds) for s in extra]
        for s in samples:
            name = "big" if s["arm"].endswith("big") else "small"
            s.update(changed_bytes=bundles[name]["graph"][2],
                     weights_bytes=bundles[name]["donor"][0].total_bytes)
        return samples


# -- summary (also used by verify.py) -------------------------------------------------
def median(samples: list[dict], arm: str, key: str) -> float:
    return benchkit.stats([s[key] for s in samples if s["arm"] == arm])["median"]


def recompute(raw: dict) -> dict:
    samples = raw["samples"]
    arms = {s["arm"] for s in samples}
    ratios = {
        "xfs_reconstruct_over_rebase": ("reconstruct_xfs", "rebase_xfs"),
        "ext4_reconstruct_over_rebase": ("reconstruct_ext4", "rebase_ext4"),
        "ext4_floor_copy_over_rebase": ("floor_copy_ext4", "rebase_ext4"),
        "graph_only_big_over_small": ("graph_only_big", "graph_only_small"),
        "small_reconstruct_over_graph_only": ("reconstruct_graph_small", "graph_only_small"),
        "big_reconstruct_over_graph_only": ("reconstruct_graph_big", "graph_only_big"),
    }
    ratios = {k: v for k, v in ratios.items() if set(v) <= arms}
    out = benchkit.summarize(samples, "seconds", ratios)
    out["bytes"] = {a: {k: median(samples, a, k) for k in
                        ("fetched", "written", "cloned", "disk_delta", "changed_bytes")}
                    for a in sorted(arms)}
    r, b = out["ratios"], out["bytes"]
    targets = {}
    if "xfs_reconstruct_over_rebase" in r:
        w = b["rebase_xfs"]["written"] / b["rebase_xfs"]["changed_bytes"]
        targets["xfs_rebase_speedup_ge_20x"] = r["xfs_reconstruct_over_rebase"] >= 20
        targets["xfs_rebase_written_over_changed"] = w
        targets["xfs_rebase_written_le_1.1x_changed"] = w <= 1.1
    if "ext4_reconstruct_over_rebase" in r:
        targets["ext4_rebase_speedup_ge_3x"] = r["ext4_reconstruct_over_rebase"] >= 3
        targets["ext4_rebase_no_refetch"] = all(
            s["fetched"] == s["changed_bytes"] for s in samples if s["arm"] == "rebase_ext4")
    if "ext4_floor_copy_over_rebase" in r:
        targets["ext4_rebase_over_copy_floor"] = 1 / r["ext4_floor_copy_over_rebase"]
    if "graph_only_big_over_small" in r:
        g = r["graph_only_big_over_small"]
        targets["graph_only_max_over_min"] = max(g, 1 / g)
        targets["graph_only_within_1.2x"] = max(g, 1 / g) <= 1.2
    out["targets"] = targets
    return out


def draw(raw: dict, folder: Path) -> list[Path]:
    """seconds.png (every arm, median and IQR, log scale) and bytes.png (what each delivery
    fetched against what it reused from the donor), from raw.json."""
    import plots
    samples, arms = raw["samples"], recompute(raw)["arms"]
    order = plots.arms_in_order(raw)
    size = raw["config"]["size"] // 2**20
    rounds = " or ".join(map(str, sorted({st["n"] for st in arms.values()})))
    timing = plots.medians(
        folder / "seconds.png", f"01: a node's store materializes a revision ({size} MiB weights)",
        [("seconds (log scale)", {arm: arms[arm] for arm in order})],
        plots.footnote(raw, f"n = {rounds} per arm, alternating; bars: medians, "
                            "whiskers: IQR; floor_copy_ext4 is a bare copy + fsync, not a delivery"), log=True)
    deliveries = [arm for arm in order if not arm.startswith("floor_copy")]
    moved = plots.fetched_reused(
        folder / "bytes.png", f"01: bytes per delivery ({size} MiB weights)",
        {arm: (median(samples, arm, "fetched"), median(samples, arm, "reused")) for arm in deliveries},
        plots.footnote(raw, f"n = {rounds} per arm, medians; reused: bytes taken from the donor revision"))
    return [timing, moved]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=2 << 30, help="large weights (2GiB)")
    ap.add_argument("--small", type=parse_size, default=64 << 20, help="small weights (64MiB)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--graph-rounds", type=int, default=20,
                    help="extra rounds of the two graph-only arms (millisecond timings are noisy)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/resident-bench-01"))
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--groups", default="xfs,ext4,graph")
    args = ap.parse_args()
    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    args.workdir.mkdir(parents=True)
    t0 = time.time()
    try:
        bundles = {}
        for name, size, seed in (("big", args.size, 1), ("small", args.small, 2)):
            base = args.workdir / f"{name}-v0"
            donor = (make_donor(base, size, seed), base)
            rows_m, changed = make_rows_revision(base, args.workdir / f"{name}-rows")
            graph_m, graph_bytes = make_graph_revision(base, args.workdir / f"{name}-graph")
            bundles[name] = {"donor": donor,
                             "rows": (rows_m, args.workdir / f"{name}-rows", changed),
                             "graph": (graph_m, args.workdir / f"{name}-graph", graph_bytes)}
            print(f"prepared {name}: {donor[0].total_bytes} bytes, {changed} changed", flush=True)
        samples = []
        groups = args.groups.split(",")
        for kind in ("xfs", "ext4"):
            if kind in groups:
                samples += whole_bundle_group(kind, args.workdir, bundles["big"]["donor"],
                                              bundles["big"]["rows"], args.rounds)
                print(f"{kind} done ({time.time() - t0:.0f}s)", flush=True)
        if "graph" in groups:
            samples += graph_group(args.workdir, bundles, args.rounds, args.graph_rounds)
            print(f"graph done ({time.time() - t0:.0f}s)", flush=True)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    raw = {"config": {"size": args.size, "small": args.small, "rounds": args.rounds, "graph_rounds": args.graph_rounds,
                      "chunk_size": CHUNK, "changed_fraction": CHANGED_FRACTION,
                      "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                                  "python": platform.python_version()},
                      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
                      "wall_seconds": round(time.time() - t0, 1)},
           "samples": samples}
    summary = recompute(raw)
    args.out.mkdir(parents=True, exist_ok=True)
    benchkit.write(args.out, raw, summary, draw)
    print(json.dumps({"ratios": summary["ratios"], "targets": summary["targets"]}, indent=1))


if __name__ == "__main__":
    main()
